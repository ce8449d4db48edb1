"""Automatic compaction: when the builder compacts a table, what it rewrites, and when commits wait for it.

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
- **Its own process.** A run executes in the builder's compaction process
  (``Compactor``: one worker, spawned on first use, at nice 10), built one
  superfile at a time: it takes one core at most, yields the CPU to the
  commits, and never holds the GIL the commits need.

A compaction changes no row and keeps the commit properties (log offsets), so
it needs no fencing: a zombie builder's compaction is as harmless as anyone's.
The engine publishes it like any commit: appends that land meanwhile are
untouched, deletes that land on its inputs are carried onto its outputs, and
the builder's own commits rebase over it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import superfile
from superfile.manifest.model import SuperfileEntry
from superfile.table.optimize import optimize

__all__ = ["CompactionPolicy", "Compactor"]

_NICE = 10


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
    """The builder's compaction process, shared by its table pipelines (their runs queue)."""

    def __init__(self, uri: str, policy: CompactionPolicy, connect_options: Mapping[str, Any] | None = None) -> None:
        self.uri = uri
        self.policy = policy
        self.connect_options = dict(connect_options or {})
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def run(self, table: str) -> dict[str, Any] | None:
        """One run on ``table`` if the policy says so: ``optimize()``'s result, or None when nothing is due.
        Blocks until it is done. Raises what the run raised; a crashed process is replaced on the next run."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_start_worker)
            pool = self._pool
        try:
            return pool.submit(_run, self.uri, table, self.policy, self.connect_options).result()
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


def _start_worker() -> None:
    """In the compaction process: yield the CPU to queries and commits, and die with the builder. A builder
    killed by SIGKILL cannot stop its worker, which would otherwise live on, holding its memory, forever."""
    os.nice(_NICE)
    parent = os.getppid()

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
    table = superfile.connect(uri, **connect_options).open_table(table_name)
    if not policy.due(table._snapshot.entries(), table.options.max_rows_per_superfile):
        return None
    return optimize(table, policy.target_rows, select=policy.select, parallel=False)
