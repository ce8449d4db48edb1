"""SQL outside the gateway's process: a small pool of worker processes, each query under a time limit.

DataFusion runs native code that Python cannot interrupt: a runaway query
cannot be cancelled in a thread, and a crash inside the planner took the whole
gateway with it. So every SQL query runs in a worker process (spawned, so it
shares nothing with the server's threads). Each worker's share of
``SUPERFILE_SQL_MEMORY_BYTES`` bounds its resident memory: DataFusion's memory
pool gets half the share (the rest is the worker's own code and imports, about
180 MB, and what DataFusion does not account for: a cross-join sort held at a
256 MB pool reached 550 MB resident), and while a query runs the gateway
watches the worker's resident memory and kills it past the share. A worker
that stays large after a query is replaced. An address-space limit (``RLIMIT_AS``/``RLIMIT_DATA``) would
misfire: Arrow's and glibc's allocators reserve address space up front (1.5 GB
at import with 180 MB resident, 3.2 GB after two queries), so the address-space
limit (``RLIMIT_AS``) is only a generous backstop: four times the share plus
4 GiB. A query that hits it crashes its worker (``QueryCrashedError``). When the query passes its time
limit, or its client goes away, the worker is killed too (SIGKILL), and a fresh
one replaces it on the next query; a worker that dies costs only its own
query. Results come back as one Arrow IPC stream over a pipe.

``memory://`` storage lives in the server's own process, so its queries run
there, in a thread, with the same memory pool and row cap but no hard kill.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import pickle
import resource
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import Any

import pyarrow as pa
from starlette.concurrency import run_in_threadpool
from superfile.connection import Connection
from superfile.errors import QueryLimitError, SqlError, SuperfileError, TableNotFoundError
from superfile.remote.errors import QueryCrashedError, QueryTimeoutError, error_class, error_of
from superfile.remote.wire import from_ipc, to_ipc
from superfile.sql import SqlLimits, run_sql
from superfile.table.snapshot import Snapshot

from superfile_gateway.admission import Admission
from superfile_gateway.auth import Principal
from superfile_gateway.instruments import (
    SQL_CANCELLED,
    SQL_LIMITED,
    SQL_RESTARTS,
    SQL_TIMEOUTS,
    observe_sql_workers,
)

__all__ = ["SqlWorkers", "VisibleTables", "run_visible"]

_POLL_S = 0.05  # how often a waiting query checks its deadline and its client
_BACKSTOP_EXTRA = 4 << 30
_PAGE = os.sysconf("SC_PAGE_SIZE")
_NICE = 10


class VisibleTables:
    """The tables as one key sees them, for SQL (``superfile.sql.context.Tables``): those it may not read do
    not exist."""

    def __init__(self, db: Connection, principal: Principal) -> None:
        self._db = db
        self._principal = principal

    def table_names(self) -> list[str]:
        return [n for n in self._db.table_names() if self._principal.can(n, "r")]

    def snapshot(self, name: str) -> Snapshot:
        if not self._principal.can(name, "r"):
            raise TableNotFoundError(f"table {name!r} does not exist")
        return self._db.snapshot(name)


def run_visible(db: Connection, principal: Principal, query: str, limits: SqlLimits) -> pa.Table:
    """``run_sql`` over the tables ``principal`` may read."""
    return run_sql(VisibleTables(db, principal), query, limits)


@dataclass(frozen=True)
class _Job:
    query: str
    principal: Principal
    limits: SqlLimits


@dataclass
class _Worker:
    process: BaseProcess
    pipe: Pipe


class SqlWorkers:
    """Runs SQL queries in ``workers`` processes (spawned on first use) for one storage URI."""

    def __init__(
        self,
        storage: str,
        connect_options: dict[str, Any],
        *,
        workers: int,
        timeout_s: float,
        memory_bytes: int,
        max_rows: int,
        admission: Admission,
    ) -> None:
        self.storage = storage
        self.connect_options = connect_options
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self.rss_limit = memory_bytes // workers  # each worker's share of the gateway's SQL memory
        self.memory_bytes = self.rss_limit // 2  # its DataFusion pool
        self.admission = admission
        self.in_process = storage.startswith("memory://")
        self._db: Connection | None = None  # in-process queries only
        self._idle: list[_Worker] = []
        self._started = 0  # live workers, idle or busy
        self._lock = threading.Lock()
        self._closed = False
        self.timeouts, self.cancelled, self.limited = SQL_TIMEOUTS, SQL_CANCELLED, SQL_LIMITED
        self.restarts = SQL_RESTARTS
        observe_sql_workers(self)  # superfile_gateway_sql_workers

    def limits(self, memory_bytes: int | None, max_rows: int | None) -> SqlLimits:
        """The gateway's limits, tightened by what the client asked for."""
        return SqlLimits(
            memory_bytes=min(self.memory_bytes, memory_bytes or self.memory_bytes),
            max_rows=min(self.max_rows, max_rows or self.max_rows),
        )

    async def run(
        self,
        query: str,
        principal: Principal,
        limits: SqlLimits,
        disconnected: Callable[[], Awaitable[bool]],
    ) -> pa.Table:
        """The query's rows; :class:`QueryTimeoutError` past the time limit, :class:`QueryCrashedError` when
        its worker dies, :class:`TooManyRequestsError` when the caps are reached."""
        with self.admission.enter("sql", principal):
            try:
                if self.in_process:
                    return await run_in_threadpool(run_visible, self._local(), principal, query, limits)
                return await self._in_worker(_Job(query, principal, limits), disconnected)
            except QueryLimitError:
                self.limited.inc()
                raise

    def _local(self) -> Connection:
        if self._db is None:
            self._db = Connection(self.storage, **self.connect_options)
        return self._db

    async def _in_worker(self, job: _Job, disconnected: Callable[[], Awaitable[bool]]) -> pa.Table:
        deadline = time.monotonic() + self.timeout_s
        for _ in range(2):  # an idle worker may have died (the kernel's OOM killer): then a fresh one
            worker = await self._acquire(deadline, disconnected)
            try:
                worker.pipe.send_bytes(pickle.dumps(job))
                break
            except OSError:
                await self._discard(worker, "crashed")
        else:
            raise QueryCrashedError("SQL worker processes die as they start; see the gateway's log")
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = worker.pipe.fileno()
        loop.add_reader(fd, _settle, readable)
        try:
            while not readable.done():
                await asyncio.wait([readable], timeout=_POLL_S)
                if readable.done():
                    break
                if time.monotonic() > deadline:
                    self.timeouts.inc()
                    await self._discard(worker, "timeout")
                    raise QueryTimeoutError(
                        f"the query ran longer than the gateway's limit of {self.timeout_s:g} s "
                        "(SUPERFILE_SQL_TIMEOUT_S) and was stopped"
                    )
                if _resident(worker) > self.rss_limit:
                    self.limited.inc()
                    await self._discard(worker, "memory")
                    raise QueryLimitError(
                        f"the query's worker grew past {self.rss_limit} bytes (its share of SUPERFILE_SQL_MEMORY_BYTES)"
                        " and was stopped"
                    )
                if await disconnected():
                    self.cancelled.inc()
                    await self._discard(worker, "cancelled")
                    raise QueryTimeoutError("the client went away; the query was stopped")
        except asyncio.CancelledError:  # the server is stopping (past its drain time): stop the query too
            with self._lock:
                self._started -= 1
            worker.process.kill()
            raise
        finally:
            loop.remove_reader(fd)
        try:
            answer = await asyncio.to_thread(worker.pipe.recv_bytes)
        except (EOFError, OSError):
            code = await self._discard(worker, "crashed")
            raise QueryCrashedError(_death(code)) from None
        if _resident(worker) > self.rss_limit * 3 // 4:  # what a large query left behind would count against the next
            await self._discard(worker, "recycled")
        else:
            self._release(worker)
        return _decode(answer)

    async def _acquire(self, deadline: float, disconnected: Callable[[], Awaitable[bool]]) -> _Worker:
        """An idle worker, a new one while fewer than ``workers`` live, else the first to come free."""
        while True:
            with self._lock:
                dead = [w for w in self._idle if not w.process.is_alive()]
                self._idle = [w for w in self._idle if w not in dead]
                self._started -= len(dead)
                idle = self._idle.pop() if self._idle else None
                spawn = idle is None and self._started < self.workers
                if spawn:
                    self._started += 1
            for worker in dead:
                self.restarts.labels(reason="crashed").inc()
                await asyncio.to_thread(_stop, worker)
            if idle is not None:
                return idle
            if spawn:
                try:
                    return await asyncio.to_thread(self._spawn)
                except BaseException:
                    with self._lock:
                        self._started -= 1
                    raise
            if time.monotonic() > deadline:
                self.timeouts.inc()
                raise QueryTimeoutError(
                    f"no SQL worker came free within the gateway's limit of {self.timeout_s:g} s "
                    "(SUPERFILE_SQL_TIMEOUT_S)"
                )
            if await disconnected():
                self.cancelled.inc()
                raise QueryTimeoutError("the client went away before the query started")
            await asyncio.sleep(_POLL_S)

    def _spawn(self) -> _Worker:
        ctx = get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        backstop = 4 * self.rss_limit + _BACKSTOP_EXTRA
        process = ctx.Process(
            target=_serve,
            args=(child, self.storage, self.connect_options, backstop, os.getpid()),
            name="superfile-sql",
            daemon=True,
        )
        process.start()
        assert process.pid is not None  # set by start()
        # niced from here, not only once running _serve: importing Arrow and DataFusion takes a CPU-second that
        # would otherwise compete with the gateway's searches at full priority each time a worker is replaced
        os.setpriority(os.PRIO_PROCESS, process.pid, _NICE)
        child.close()
        return _Worker(process, parent)

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        _stop(worker)

    async def _discard(self, worker: _Worker, reason: str) -> int | None:
        """Kill ``worker`` (its slot is free for a new one); its exit code."""
        with self._lock:
            self._started -= 1
        self.restarts.labels(reason=reason).inc()
        return await asyncio.to_thread(_stop, worker)

    def live_workers(self) -> int:
        """Worker processes alive now, idle or busy."""
        return self._started

    def close(self) -> None:
        """Kill every worker (a query still running gets no answer: the server is shutting down)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            _stop(worker)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _resident(worker: _Worker) -> int:
    """The worker's resident bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{worker.process.pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _stop(worker: _Worker) -> int | None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(timeout=10)
    worker.pipe.close()
    return worker.process.exitcode


def _death(code: int | None) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    return (
        f"the process running the query {how} (a crash in the SQL engine, or the kernel out of memory); "
        "the gateway replaced it and is unharmed"
    )


def _decode(answer: bytes) -> pa.Table:
    kind, payload = pickle.loads(answer)
    if kind == "rows":
        return from_ipc(payload)
    type_name, status, message = payload
    raise error_of(error_class(type_name, status) or SqlError, message)


def _release_memory() -> None:
    """Hand memory freed by the last query back to the system (glibc and Arrow keep it for reuse otherwise)."""
    pa.default_memory_pool().release_unused()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)


def _serve(pipe: Pipe, storage: str, connect_options: dict[str, Any], backstop: int, parent: int) -> None:
    """A worker's life: answer jobs one at a time until the pipe closes or the gateway is gone. At nice 10 (set by
    ``_spawn``, inherited by the threads it starts): a long query yields the CPU to the searches and health checks."""
    resource.setrlimit(resource.RLIMIT_AS, (backstop, backstop))

    def watch() -> None:  # a SIGKILLed gateway cannot stop its workers: they stop themselves
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    db = Connection(storage, **connect_options)
    while True:
        try:
            job: _Job = pickle.loads(pipe.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("rows", to_ipc(run_visible(db, job.principal, job.query, job.limits)))
        except SuperfileError as e:
            answer = ("error", (type(e).__name__, e.http_status, str(e)))
        except MemoryError:
            answer = ("error", ("QueryLimitError", 400, "the query ran out of memory in its worker"))
        pipe.send_bytes(pickle.dumps(answer))
        del answer
        _release_memory()
