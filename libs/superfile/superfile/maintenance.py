"""Maintenance that runs itself: when a table is compacted, what a run rewrites, when commits wait for it,
and cleanup by retention, in a background worker beside the commits.

Used by the builder (its table pipelines), by the gateway in embedded mode and
by embedded connections opened with ``maintenance=`` (:class:`AutoMaintenance`).

Streaming commits are small (a batch closes after ``freshness_ms``), and each
adds at least one superfile per partition it touches; left alone, the
superfile count grows with the number of commits and every query opens more
files. A superfile is *small* when it holds fewer live rows than half the
target (the table's ``max_rows_per_superfile`` unless set).

- **Start.** Once some partition holds more than ``small_files`` small
  superfiles, a compaction starts beside the commits: they go on while it
  runs.
- **Work per run.** It rewrites the partition's small superfiles, smallest
  first, until their rows reach half the target (``select``), enough for one
  output that is no longer small: one run's work stays under the target rows
  whatever the backlog (say, the small superfiles of a bulk load), so it ends
  in seconds, and the freshest, smallest files, the ones that cost the least
  and raise the count the most, go first. It loops while the policy still says
  so.
- **Stop.** A partition's count of small superfiles can still outrun a slow
  compaction. Once it reaches ``stop_files`` (twice ``small_files``), the commit
  that got it there waits for the running compaction before the next one is
  published (the same back-pressure as RocksDB's stop-writes trigger).
  Outputs are balanced shards of at most the target, so every output but at
  most one per run holds at least half of it; hence each partition holds at most
  ``rows / (target / 2) + stop_files`` superfiles, plus the small ones a single
  commit adds.
- **Its own process.** A run executes in a compaction process
  (``Compactor``: one worker, spawned on first use, at nice 10, dying with its
  parent), built one superfile at a time: it takes one core at most, yields the
  CPU to the commits, and never holds the GIL the commits need.
- **Cleanup.** :class:`AutoMaintenance` also runs ``cleanup`` on each table
  that committed, at most once per ``cleanup_interval_s``, with the retention
  window ``retention_s`` (versions younger than it stay readable, files
  younger than it stay).

A compaction changes no row and keeps the commit properties (log offsets), so
it needs no fencing: a zombie builder's compaction is as harmless as anyone's.
The engine publishes it like any commit: appends that land meanwhile are
untouched, deletes that land on its inputs are carried onto its outputs, and
the builder's own commits rebase over it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import TYPE_CHECKING, Any

from superfile.allocator import fix_mmap_threshold, release_unused
from superfile.errors import TableNotFoundError
from superfile.manifest.model import SuperfileEntry
from superfile.table.optimize import optimize
from superfile.tables import TableRoot

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["AutoMaintenance", "CompactionPolicy", "Compactor", "MaintenancePolicy"]

_NICE = 10
_RUNS_PER_WAKE = 64  # compaction runs for one table before the others get their turn
log = logging.getLogger("superfile.maintenance")


@dataclass(frozen=True)
class CompactionPolicy:
    """``small_files`` = 0 turns automatic compaction off; ``target_rows`` None means the table's
    ``max_rows_per_superfile`` (what ``optimize()`` aims for by default)."""

    small_files: int = 16
    target_rows: int | None = None

    @property
    def enabled(self) -> bool:
        return self.small_files > 0

    @property
    def stop_files(self) -> int:
        return 2 * self.small_files

    def target(self, max_rows_per_superfile: int) -> int:
        return self.target_rows or max_rows_per_superfile

    def due(self, entries: Iterable[SuperfileEntry], max_rows_per_superfile: int) -> bool:
        """Whether some partition holds more than ``small_files`` small superfiles: start a compaction."""
        return self.enabled and self._most_small(entries, max_rows_per_superfile) > self.small_files

    def stalled(self, entries: Iterable[SuperfileEntry], max_rows_per_superfile: int) -> bool:
        """Whether some partition holds ``stop_files`` small superfiles: commits wait for the compaction."""
        return self.enabled and self._most_small(entries, max_rows_per_superfile) >= self.stop_files

    def select(self, entries: list[SuperfileEntry], target: int) -> dict[str | None, list[SuperfileEntry]]:
        """One run's inputs (``optimize``'s ``select``): in each partition that is due, its small
        superfiles, smallest first, until their live rows reach half of ``target``."""
        small: dict[str | None, list[SuperfileEntry]] = defaultdict(list)
        for e in entries:
            if 2 * e.live_rows < target:
                small[e.partition].append(e)
        chosen: dict[str | None, list[SuperfileEntry]] = {}
        for partition, files in small.items():
            if len(files) <= self.small_files:
                continue
            files.sort(key=lambda e: (e.live_rows, e.id_min, e.path))
            rows, take = 0, list[SuperfileEntry]()
            for e in files:
                if 2 * rows >= target and len(take) >= 2:
                    break
                take.append(e)
                rows += e.live_rows
            chosen[partition] = sorted(take, key=lambda e: (e.id_min, e.path))
        return chosen

    def _most_small(self, entries: Iterable[SuperfileEntry], max_rows_per_superfile: int) -> int:
        half = self.target(max_rows_per_superfile) / 2
        small = Counter(e.partition for e in entries if e.live_rows < half)
        return max(small.values(), default=0)


class Compactor:
    """A compaction process, shared by the tables of one storage root (their runs queue)."""

    def __init__(self, uri: str, policy: CompactionPolicy, connect_options: Mapping[str, Any] | None = None) -> None:
        self.uri = uri
        self.policy = policy
        self.connect_options = dict(connect_options or {})
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def run(self, table: str) -> dict[str, Any] | None:
        """One run on ``table`` if the policy says so: ``optimize()``'s result, or None when nothing is due.
        Blocks until it is done. Raises what the run raised; a crashed process is replaced on the next run.
        ``memory://`` tables live in this process: their runs execute here."""
        if self.uri.startswith("memory://"):
            return _run(self.uri, table, self.policy, self.connect_options)
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    1, mp_context=get_context("spawn"), initializer=_start_worker, initargs=(os.getpid(),)
                )
            pool = self._pool
        try:
            return pool.submit(_run_released, self.uri, table, self.policy, self.connect_options).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise

    def close(self) -> None:
        """Stop the process after its current run."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(parent: int) -> None:
    """In the compaction process: yield the CPU to queries and commits, and die with its parent. A parent
    killed by SIGKILL cannot stop its worker, which would otherwise live on, holding its memory, forever.
    ``parent`` comes from the parent itself: one killed while this process was still starting is gone
    already, and ``os.getppid()`` would name init."""
    os.nice(_NICE)
    fix_mmap_threshold()  # the indexes' megabyte buffers get mappings of their own, unmapped when freed

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run(
    uri: str, table_name: str, policy: CompactionPolicy, connect_options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """In the compaction process: one bounded run, if due. A connection per run: its caches would hold
    the superfiles the run just replaced."""
    table = TableRoot(uri, **connect_options).open(table_name)
    if not policy.due(table.last_snapshot.entries(), table.options.max_rows_per_superfile):
        return None
    result = optimize(table, policy.target_rows, select=policy.select, parallel=False)
    cache = table.files.disk_cache
    if cache is not None:  # what the run read from object storage into its disk cache (its inputs)
        result["bytes_downloaded"] = cache.fetched_bytes
    return result


def _run_released(
    uri: str, table_name: str, policy: CompactionPolicy, connect_options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """:func:`_run` in the compaction process, then the memory it freed handed back: between runs the process
    waits, and its allocators kept 200-450 MB of freed pages after each run, more over time (``allocator.py``)."""
    try:
        return _run(uri, table_name, policy, connect_options)
    finally:
        release_unused()


@dataclass(frozen=True)
class MaintenancePolicy:
    """What runs by itself: compaction by ``compaction`` (``small_files=0`` turns it off) and ``cleanup`` of
    each table that committed, at most once per ``cleanup_interval_s`` (0: never), keeping ``retention_s``
    of versions (and as the safety margin for unreferenced files)."""

    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)
    cleanup_interval_s: float = 3600.0
    retention_s: float = 7 * 86400.0

    def __post_init__(self) -> None:
        if not (self.cleanup_interval_s >= 0 and self.retention_s >= 0) or self.compaction.small_files < 0:
            raise ValueError(f"maintenance settings must be non-negative: {self}")


class AutoMaintenance:
    """A background thread maintaining the tables that commit: compaction runs (in the compaction process)
    while the policy asks, and a cleanup at most once per interval. A commit only names its table
    (:meth:`committed`); it never waits for maintenance."""

    def __init__(
        self,
        uri: str,
        policy: MaintenancePolicy,
        open_table: Callable[[str], Supertable],
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self._open = open_table
        compaction = policy.compaction
        self._compactor = Compactor(uri, compaction, connect_options) if compaction.enabled else None
        self._pending: dict[str, None] = {}  # tables to look at, in commit order
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cleaned: dict[str, float] = {}  # table -> monotonic time of its last cleanup
        self.counts: Counter[str] = Counter()  # compactions, superfiles_compacted, cleanups, files_removed, errors

    def committed(self, table: str) -> None:
        """``table`` published a version: look at it soon."""
        with self._cond:
            if self._closed:
                return
            self._pending[table] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="superfile-maintenance", daemon=True)
                self._thread.start()
            self._cond.notify()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every table named so far has been looked at within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        """Stop after the table being maintained (a compaction run in progress finishes first)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=60)
        if self._compactor is not None:
            self._compactor.close()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                table = next(iter(self._pending))
                del self._pending[table]
                self._busy = True
            try:
                self._maintain(table)
            except TableNotFoundError:
                self._cleaned.pop(table, None)  # dropped meanwhile
            except Exception:
                self.counts["errors"] += 1
                log.exception("maintenance of table %r failed; the next commit tries again", table)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _maintain(self, table: str) -> None:
        if self._compactor is not None:
            for _ in range(_RUNS_PER_WAKE):
                if self._closed:
                    return
                result = self._compactor.run(table)
                if result is None:
                    break
                self.counts["compactions"] += 1
                self.counts["superfiles_compacted"] += int(result.get("superfiles_removed", 0))
        interval = self.policy.cleanup_interval_s
        last = self._cleaned.get(table)
        if interval and (last is None or time.monotonic() - last >= interval):
            self._cleaned[table] = time.monotonic()
            result = self._open(table).cleanup(self.policy.retention_s)
            self.counts["cleanups"] += 1
            self.counts["files_removed"] += int(result["files_removed"])
