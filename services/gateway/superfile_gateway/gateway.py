"""The state behind the routes: the catalog, open table handles, the write path, keys, limits and metrics.

Table handles stay open across requests: the engine refreshes a handle from the table's pointer on each read
(its consistency policy), so a request costs one small pointer read, not a re-open. ``At`` names the snapshot a
read asks for; ``encode`` turns rows into the response the client accepts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from cachetools import LRUCache
from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from superfile.connection import Connection
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    QueryLimitError,
    SuperfileError,
    TableExistsError,
    TableNotFoundError,
)
from superfile.events import EventLog, Position, topic_for
from superfile.maintenance import CompactionPolicy, MaintenancePolicy
from superfile.remote.wire import (
    ARROW_STREAM,
    schema_from_b64,
    schema_from_json,
    schema_to_b64,
    schema_to_json,
    table_to_json,
    to_ipc,
)
from superfile.search.request import ExactMatch, SearchRequest, TokenMatch
from superfile.table import Supertable
from superfile.table.cleanup import DEFAULT_RETENTION
from superfile.telemetry import preset

from superfile_gateway.admission import Admission
from superfile_gateway.auth import KeyRing, Principal
from superfile_gateway.forward import QueryService
from superfile_gateway.guard import InFlight
from superfile_gateway.instruments import (
    ERRORS,
    QUERY_SECONDS,
    REQUESTS,
    WRITE_OPS,
    WRITE_SECONDS,
    observe_caches,
    observe_maintenance,
)
from superfile_gateway.models import (
    CleanupRequest,
    CreateTableRequest,
    ScanRequest,
)
from superfile_gateway.settings import Settings
from superfile_gateway.sql_workers import SqlWorkers
from superfile_gateway.warm import FollowCommits, warm
from superfile_gateway.writes import EmbeddedWrites, LogWrites, WritePath, WriteResult, wait_visible

__all__ = ["LATEST", "At", "Gateway", "encode", "parse_as_of"]

_PINNED_HANDLES = 64  # read-only handles on past versions kept open
_WARM_IDLE_S = 600.0  # a table this gateway has not used for this long is no longer warmed on commit
_READY_TIMEOUT_S = 5.0  # readiness answers 503 when storage takes longer than this to list tables
_EPOCH_MS = re.compile(r"-?\d+")


def parse_as_of(text: str) -> datetime.datetime | int:
    """A point in time from a query string: epoch milliseconds, or an ISO 8601 datetime (naive meaning UTC)."""
    t = text.strip()
    if _EPOCH_MS.fullmatch(t):
        return int(t)
    try:
        return datetime.datetime.fromisoformat(t)
    except ValueError:
        raise InvalidInputError(f"as_of must be epoch milliseconds or an ISO 8601 datetime, got {text!r}") from None


@dataclass(frozen=True)
class At:
    """The snapshot a read names: the latest (neither field), a past ``version``, or the one current at ``as_of``."""

    version: int | None = None
    as_of: datetime.datetime | int | None = None

    @property
    def pinned(self) -> bool:
        return self.version is not None or self.as_of is not None


LATEST = At()


class Gateway:
    """The state behind the routes: the catalog, open table handles, the write path, keys and metrics."""

    def __init__(self, settings: Settings, writes: WritePath | None = None) -> None:
        self.settings = settings
        connect_options: dict[str, Any] = {
            "cache_dir": settings.cache_dir,
            "cache_budget_bytes": settings.cache_budget_bytes,
            "cache_memory_bytes": settings.cache_memory_bytes,
        }
        if settings.cache_nodes or settings.cache_dns:  # a query service: reads fan out to the cache nodes
            connect_options.update(
                cache_nodes=list(settings.cache_nodes),
                cache_dns=settings.cache_dns,
                internal_token=settings.internal_token,
            )
        maintenance = (
            MaintenancePolicy(
                CompactionPolicy(settings.compact_small_files), settings.cleanup_interval_s, settings.retention_s
            )
            if settings.maintenance and not settings.kafka  # in suite mode the builder maintains the tables
            else False
        )
        self.db = Connection(settings.storage, maintenance=maintenance, **connect_options)
        self.keys = KeyRing(settings.api_keys, enabled=settings.auth)
        if writes is None:
            writes = (
                LogWrites(
                    EventLog(settings.kafka, topic_prefix=settings.topic_prefix), wait_timeout_s=settings.wait_timeout_s
                )
                if settings.kafka
                else EmbeddedWrites()
            )
        self.writes = writes
        self._tables: dict[str, Supertable] = {}
        self._used: dict[str, float] = {}  # when each table was last asked for (monotonic seconds)
        self._pinned: LRUCache[tuple[str, int], Supertable] = LRUCache(maxsize=_PINNED_HANDLES)
        self._lock = threading.Lock()
        self.inflight = InFlight()
        self.query_seconds = QUERY_SECONDS  # the process's instruments (instruments.py)
        self.write_seconds = WRITE_SECONDS
        self.requests = REQUESTS
        self.errors = ERRORS
        preset(WRITE_SECONDS, op=WRITE_OPS, mode=(writes.mode,))
        observe_caches(self.db.disk_cache)
        observe_maintenance(self.db.maintenance)
        self.admission = Admission(
            totals={"sql": settings.sql_max_concurrent, "search": settings.search_max_concurrent},
            per_key=settings.max_concurrent_per_key,
        )
        self.sql = SqlWorkers(
            settings.storage,
            connect_options,
            workers=settings.sql_workers,
            timeout_s=settings.sql_timeout_s,
            memory_bytes=settings.sql_memory_bytes,
            max_rows=settings.max_result_rows,
            admission=self.admission,
        )
        self.query_service = (
            QueryService(settings.query_url, settings.internal_token or "", settings.sql_timeout_s + 30.0)
            if settings.query_url
            else None
        )
        # a gateway reading through the engine itself warms each new version of the tables it reads
        serving = not (settings.query_url or settings.cache_nodes or settings.cache_dns)
        self.warmer = (
            FollowCommits(self.tables_in_use, warm, settings.warm_interval_s)
            if serving and settings.warm_interval_s
            else None
        )
        self._internal = hashlib.sha256((settings.internal_token or "").encode()).digest()
        self._readiness = ThreadPoolExecutor(1, thread_name_prefix="superfile-readyz")  # never behind queries
        self._ready_check: asyncio.Future[tuple[bool, str]] | None = None

    # -- tables -------------------------------------------------------------------------
    def table(self, name: str, at: At = LATEST) -> Supertable:
        """The open handle on ``name`` (opened once), or a read-only handle on one of its past versions
        (``as_of`` is resolved to the version current then; handles are cached by version)."""
        self._used[name] = time.monotonic()
        table = self._tables.get(name)
        if table is None:
            opened = self.db.open_table(name)
            with self._lock:
                table = self._tables.setdefault(name, opened)
        if not at.pinned:
            return table
        if at.version is not None:
            key = (name, at.version)
            with self._lock:
                pinned = self._pinned.get(key)  # a hit makes it the most recently used
            # a cleanup elsewhere (another replica, the builder, the gateway in front of this query service) may
            # have expired the version since it was cached: checked on every use, one small read of storage
            if pinned is not None and pinned.is_retained():
                return pinned
            if pinned is not None:
                self.forget(name, pinned_only=True)
            pinned = table.checkout(at.version)
        else:
            pinned = table.checkout(as_of=at.as_of)
            key = (name, pinned.version)
        with self._lock:
            pinned = self._pinned.setdefault(key, pinned)  # the least recently used goes past the capacity
        return pinned

    def tables_in_use(self) -> list[Supertable]:
        """The open handles on the latest version of the tables this process used in the last ten minutes
        (what it warms on commit)."""
        horizon = time.monotonic() - _WARM_IDLE_S
        with self._lock:
            return [t for name, t in self._tables.items() if self._used.get(name, 0.0) >= horizon]

    def forget(self, name: str, *, pinned_only: bool = False) -> None:
        """Drop cached handles of ``name`` (only those on past versions with ``pinned_only``: after a cleanup
        some of them may name versions whose files are gone)."""
        with self._lock:
            if not pinned_only:
                self._tables.pop(name, None)
                self._used.pop(name, None)
            for key in [k for k in self._pinned if k[0] == name]:
                del self._pinned[key]

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        """Drop a cached handle whose table disappeared (dropped elsewhere) and say so in the table's words."""
        try:
            yield
        except TableNotFoundError:
            self.forget(name)
            raise TableNotFoundError(f"table {name!r} does not exist") from None

    def wait_for(self, table: Supertable, token: str) -> None:
        """Block until the write at ``token`` is visible in ``table`` (504 after the configured bound)."""
        position = Position.parse(token)
        expected = topic_for(table.name, self.settings.topic_prefix)
        if position.topic != expected:
            raise InvalidInputError(f"position {token!r} is not in table {table.name!r}'s log ({expected})")
        if not position.visible_in(table.properties) and not self.writes.reachable(position):
            raise InvalidInputError(f"position {token!r} was never written to table {table.name!r}'s log")
        wait_visible(table, position, self.settings.wait_timeout_s)

    # -- request bodies -----------------------------------------------------------------
    def describe(self, table: Supertable) -> dict[str, Any]:
        return {
            "name": table.name,
            "version": table.version,
            "schema": schema_to_json(table.schema),
            "schema_ipc": schema_to_b64(table.schema),
            "options": table.options.to_dict(),
        }

    # -- operations ---------------------------------------------------------------------
    async def search(
        self, request: Request, principal: Principal, name: str, at: At, wait_for: str | None, search: SearchRequest
    ) -> Response:
        """A search, on the thread pool: the event loop only routes (health and metrics never wait behind one).
        An unranked match returns at most ``max_result_rows`` rows (or fewer, if it asks for fewer)."""
        if isinstance(search, TokenMatch | ExactMatch):
            search = dataclasses.replace(search, max_rows=self.result_cap(search.max_rows))
        capped = search
        return await run_in_threadpool(
            self.query, request, principal, name, search.kind, at, wait_for, lambda t: t.search(capped)
        )

    def query(
        self,
        request: Request,
        principal: Principal,
        name: str,
        kind: str,
        at: At,
        wait_for: str | None,
        run: Callable[[Supertable], pa.Table],
    ) -> Response:
        """A read returning rows: ``read``, then the encoding the client accepts. The engine's time (from the
        handle's lookup to the rows, waiting for ``wait_for`` included) is in the ``Server-Timing`` header, as
        Elasticsearch's ``took``: end-to-end latency minus it is what HTTP and the gateway add."""
        start = time.perf_counter()
        rows = self.read(principal, name, kind, at, wait_for, run)
        took_ms = (time.perf_counter() - start) * 1000
        response = encode(request, rows)
        response.headers["server-timing"] = f"engine;dur={took_ms:.3f}"
        return response

    def read(
        self,
        principal: Principal,
        name: str,
        kind: str,
        at: At,
        wait_for: str | None,
        run: Callable[[Supertable], Any],
    ) -> Any:
        """A read: scope check, admission (429 past the caps), then the handle (past, or waiting for
        ``wait_for``) and the engine call, timed."""
        principal.require(name, "r")
        if at.pinned and wait_for is not None:
            raise InvalidInputError(
                "give either version/as_of (a past snapshot) or wait_for (a recent write), not both"
            )
        start = time.perf_counter()
        try:
            with self.admission.enter("search", principal), self.using(name):
                table = self.table(name, at)
                if wait_for is not None:
                    self.wait_for(table, wait_for)
                return run(table)
        finally:
            self.query_seconds.labels(kind=kind).observe(time.perf_counter() - start)

    def write(self, principal: Principal, name: str, op: str, run: Callable[[Supertable], WriteResult]) -> Response:
        principal.require(name, "w")
        start = time.perf_counter()
        try:
            with self.using(name):
                result = run(self.table(name))
        finally:
            self.write_seconds.labels(op=op, mode=self.writes.mode).observe(time.perf_counter() - start)
        body = {"version": result.version, "position": result.position.token if result.position else None}
        return Response(json.dumps(body).encode(), media_type="application/json")

    def maintain(
        self, principal: Principal, name: str, op: str, run: Callable[[Supertable], dict[str, Any]]
    ) -> dict[str, Any]:
        """A maintenance operation (optimize, cleanup), run here against storage in both modes (write scope)."""
        principal.require(name, "w")
        start = time.perf_counter()
        try:
            with self.using(name):
                return run(self.table(name))
        finally:
            self.write_seconds.labels(op=op, mode=self.writes.mode).observe(time.perf_counter() - start)

    def cleanup(self, table: Supertable, req: CleanupRequest) -> dict[str, Any]:
        """``Supertable.cleanup`` with this gateway's floor on the safety margin (``Settings.cleanup_min_age_s``):
        the files of commits in flight (a builder's, an optimize's) are protected by their age alone."""
        older_than = DEFAULT_RETENTION.total_seconds() if req.older_than is None else req.older_than
        margin = older_than if req.safety_margin is None else req.safety_margin
        floor = self.settings.cleanup_min_age_s
        if margin < floor:
            name = "older_than" if req.safety_margin is None else "safety_margin"
            raise InvalidOptionError(
                f"{name} {margin:g} s is below this gateway's minimum safety margin of {floor:g} s "
                "(SUPERFILE_CLEANUP_MIN_AGE_S): files of commits still in flight could be deleted; "
                "give a safety_margin of at least that to expire versions sooner"
            )
        result = table.cleanup(older_than, dry_run=req.dry_run, safety_margin=req.safety_margin)
        if not req.dry_run:
            self.forget(table.name, pinned_only=True)
        return result

    def create(self, principal: Principal, req: CreateTableRequest) -> tuple[Supertable, bool]:
        """The new table (or with ``exist_ok`` the existing one) and whether this request created it."""
        principal.require(req.name, "w")
        if req.schema_ipc is not None and req.schema_ is not None:
            raise InvalidInputError("give schema or schema_ipc, not both")
        if req.schema_ipc is not None:
            schema = schema_from_b64(req.schema_ipc)
        elif req.schema_ is not None:
            schema = schema_from_json(req.schema_)
        else:
            raise InvalidInputError("a table needs a schema (JSON fields) or schema_ipc (base64 Arrow IPC schema)")
        vectors = {
            k: v if isinstance(v, int) else v.model_dump() for k, v in req.vector_columns.items()
        }  # the engine validates dims and metrics
        partition = req.partition if isinstance(req.partition, str | None) else req.partition.model_dump()
        try:
            table = self.db.create_table(
                req.name,
                schema,
                fts_columns=req.fts_columns,
                vector_columns=vectors,
                tokenizer=req.tokenizer,
                partition=partition,
                consistency=req.consistency,
                **req.options,
            )
        except TableExistsError:
            if not req.exist_ok:
                raise
            return self.db.open_table(req.name), False
        except TypeError as e:  # an option of the wrong type that TableOptions' checks compare against numbers
            raise InvalidOptionError(f"invalid table option: {e}") from None
        self.writes.created(req.name)
        with self._lock:
            self._tables[req.name] = table  # a handle left from a table of the same name dropped elsewhere goes
        return table, True

    def drop(self, principal: Principal, name: str) -> None:
        principal.require(name, "w")
        self.forget(name)
        self.db.drop_table(name)

    def scan(self, table: Supertable, req: ScanRequest) -> pa.Table:
        """``to_arrow``, refused before reading when more rows match than ``max_result_rows``."""
        cap = self.settings.max_result_rows
        found = table.count_rows(req.where)
        if found > cap:
            raise QueryLimitError(
                f"{found} rows match, more than the limit of {cap} (SUPERFILE_MAX_RESULT_ROWS): narrow the scan "
                "with where, or aggregate with SQL"
            )
        return table.to_arrow(columns=req.columns, where=req.where)

    def result_cap(self, asked: int | None) -> int:
        return min(asked or self.settings.max_result_rows, self.settings.max_result_rows)

    async def ready(self) -> tuple[bool, str]:
        """Storage lists tables within 5 s and the broker answers; checked on a thread of its own, one check
        at a time (a hung storage does not pile threads up)."""
        if self._ready_check is None or self._ready_check.done():
            loop = asyncio.get_running_loop()
            self._ready_check = asyncio.wrap_future(self._readiness.submit(self._check_ready), loop=loop)
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready_check), _READY_TIMEOUT_S)
        except TimeoutError:
            return False, f"storage did not answer within {_READY_TIMEOUT_S:g} s"

    def _check_ready(self) -> tuple[bool, str]:
        try:
            self.db.table_names()
        except SuperfileError as e:
            return False, f"storage: {e}"
        if not self.writes.ready():
            return False, "the event log broker is not reachable"
        return True, "ready"

    def trusted(self, principal: Principal) -> bool:
        """Whether the caller presented the internal token (a gateway forwarding a read to this query service)."""
        return bool(self.settings.internal_token) and hmac.compare_digest(principal.identity, self._internal)

    def forward(self, request: Request, body: bytes, principal: Principal, name: str | None, kind: str) -> Response:
        """A read for the query service: scope, admission and ``wait_for`` here, the read there."""
        assert self.query_service is not None
        if name is not None and not (kind == "describe" and principal.visible(name)):
            principal.require(name, "r")
        wait_for = request.query_params.get("wait_for")
        start = time.perf_counter()
        try:
            with self.admission.enter("sql" if kind == "sql" else "search", principal):
                if wait_for is not None and name is not None:
                    with self.using(name):
                        self.wait_for(self.table(name), wait_for)
                return self.query_service.forward(request, body, principal, drop=("wait_for",))
        finally:
            self.query_seconds.labels(kind=kind).observe(time.perf_counter() - start)

    def close(self) -> None:
        if self.warmer is not None:
            self.warmer.close()
        if self.query_service is not None:
            self.query_service.close()
        self.db.close()
        self.sql.close()
        self.writes.close()
        self._readiness.shutdown(wait=False, cancel_futures=True)


def encode(request: Request, table: pa.Table) -> Response:
    """Arrow IPC stream when the client accepts it, JSON rows otherwise."""
    if ARROW_STREAM in request.headers.get("accept", ""):
        return Response(to_ipc(table), media_type=ARROW_STREAM)
    return Response(table_to_json(table), media_type="application/json")
