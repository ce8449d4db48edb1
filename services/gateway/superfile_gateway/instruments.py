"""The gateway's metrics (docs/gateway.md, "Metrics" and "Limits"): Prometheus instruments made when this module
is imported, so a gateway that has served nothing lists every one.

Series whose label values are known beforehand start at zero: the query kinds, the refusals, the SQL worker
restarts (and each write operation in the gateway's mode, from ``Gateway``). The values read when scraped (the
disk caches, background maintenance, queries running, SQL workers) sum over the gateways alive in the process
(tests and notebooks run several).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from prometheus_client import Counter
from superfile.io.cache import DiskCache
from superfile.maintenance import AutoMaintenance
from superfile.search.request import KINDS
from superfile.telemetry import Observed, preset, seconds_histogram

__all__ = [
    "ERRORS",
    "QUERY_SECONDS",
    "REJECTED",
    "REQUESTS",
    "SQL_CANCELLED",
    "SQL_LIMITED",
    "SQL_RESTARTS",
    "SQL_TIMEOUTS",
    "WARM_SECONDS",
    "WRITE_OPS",
    "WRITE_SECONDS",
    "observe_admission",
    "observe_caches",
    "observe_maintenance",
    "observe_sql_workers",
]

QUERY_KINDS = (*sorted(KINDS), "scan", "count", "changes", "sql")  # every search kind, the reads and SQL
WRITE_OPS = ("append", "update", "delete", "restore", "optimize", "cleanup")
MAINTENANCE = ("compactions", "superfiles_compacted", "cleanups", "files_removed", "errors")

QUERY_SECONDS = seconds_histogram("superfile_gateway_query_duration_seconds", "Query latency by kind", ["kind"])
WRITE_SECONDS = seconds_histogram(
    "superfile_gateway_write_duration_seconds",
    "Write latency by operation (suite mode: until acknowledged)",
    ["op", "mode"],
)
WARM_SECONDS = seconds_histogram(
    "superfile_gateway_warm_duration_seconds", "Time to warm a new version of a table before searches need it"
)
REQUESTS = Counter("superfile_gateway_requests", "HTTP requests by status", ["method", "route", "status"])
ERRORS = Counter("superfile_gateway_errors", "Error responses by error type", ["type"])
REJECTED = Counter(
    "superfile_gateway_rejected", "Requests refused with 429 by kind and by the cap reached", ["kind", "reason"]
)
SQL_TIMEOUTS = Counter("superfile_gateway_sql_timeouts", "SQL queries stopped at the time limit")
SQL_CANCELLED = Counter("superfile_gateway_sql_cancelled", "SQL queries stopped because their client went away")
SQL_LIMITED = Counter("superfile_gateway_sql_limited", "SQL queries refused at a limit (memory, rows, text)")
SQL_RESTARTS = Counter("superfile_gateway_sql_worker_restarts", "SQL worker processes replaced, by reason", ["reason"])
preset(QUERY_SECONDS, kind=QUERY_KINDS)
preset(REJECTED, kind=("sql", "search"), reason=("total", "key"))
preset(SQL_RESTARTS, reason=("timeout", "cancelled", "memory", "crashed", "recycled"))


class Running(Protocol):
    def running(self) -> Mapping[str, int]:
        """Requests running now, by kind."""
        ...


class Workers(Protocol):
    def live_workers(self) -> int:
        """Worker processes alive now."""
        ...


T = TypeVar("T")
_lock = threading.Lock()
_CACHES: weakref.WeakSet[DiskCache] = weakref.WeakSet()  # every live gateway's, in this process
_MAINTENANCE: weakref.WeakSet[AutoMaintenance] = weakref.WeakSet()
_ADMISSIONS: weakref.WeakSet[Running] = weakref.WeakSet()
_SQL_WORKERS: weakref.WeakSet[Workers] = weakref.WeakSet()


def _live(items: weakref.WeakSet[T]) -> list[T]:
    with _lock:
        return list(items)


def observe_caches(cache: DiskCache | None) -> None:
    """Count ``cache`` in the disk cache gauges while it lives (zeros when no gateway has one)."""
    if cache is not None:
        with _lock:
            _CACHES.add(cache)


def observe_maintenance(maintenance: AutoMaintenance | None) -> None:
    """Count ``maintenance``'s work in ``superfile_gateway_maintenance_total`` while it lives."""
    if maintenance is not None:
        with _lock:
            _MAINTENANCE.add(maintenance)


def observe_admission(admission: Running) -> None:
    with _lock:
        _ADMISSIONS.add(admission)


def observe_sql_workers(workers: Workers) -> None:
    with _lock:
        _SQL_WORKERS.add(workers)


def _caches_total(read: Callable[[DiskCache], int], *, per_directory: bool = True) -> Mapping[tuple[str, ...], float]:
    caches: list[DiskCache] = _live(_CACHES)
    if per_directory:  # caches sharing a directory share its files
        caches = list({c.directory: c for c in caches}.values())
    return {(): sum(read(c) for c in caches)}


def _maintenance() -> Mapping[tuple[str, ...], float]:
    totals: Tally[str] = Tally(dict.fromkeys(MAINTENANCE, 0))
    for each in _live(_MAINTENANCE):
        totals.update(each.counts)
    return {(what,): n for what, n in sorted(totals.items())}


def _running() -> Mapping[tuple[str, ...], float]:
    totals: Tally[str] = Tally({"sql": 0, "search": 0})
    for each in _live(_ADMISSIONS):
        totals.update(each.running())
    return {(kind,): n for kind, n in sorted(totals.items())}


def _on_disk(read: Callable[[DiskCache], int]) -> Callable[[], Mapping[tuple[str, ...], float]]:
    return lambda: _caches_total(read)


Observed("superfile_gateway_cache_bytes", "bytes of copies on disk", _on_disk(lambda c: c.usage()[1]))
Observed("superfile_gateway_cache_superfiles", "copies on disk", _on_disk(lambda c: c.usage()[0]))
Observed("superfile_gateway_cache_budget_bytes", "on-disk budget", _on_disk(lambda c: c.budget_bytes))
Observed(
    "superfile_gateway_cache_mapped_bytes",
    "mappings in the memory budget",
    lambda: _caches_total(lambda c: c.mapped_bytes(), per_directory=False),
)
Observed(
    "superfile_gateway_cache_fetches",
    "superfiles downloaded",
    lambda: _caches_total(lambda c: c.fetches, per_directory=False),
    kind="counter",
)
Observed(
    "superfile_gateway_cache_advised",
    "mappings advised out",
    lambda: _caches_total(lambda c: c.advised, per_directory=False),
    kind="counter",
)
Observed(
    "superfile_gateway_maintenance",
    "Background maintenance done: compactions, superfiles_compacted, cleanups, files_removed, errors",
    _maintenance,
    labelnames=["what"],
    kind="counter",
)
Observed("superfile_gateway_running", "Queries running now, by kind", _running, labelnames=["kind"])
Observed(
    "superfile_gateway_sql_workers",
    "live SQL worker processes",
    lambda: {(): sum(w.live_workers() for w in _live(_SQL_WORKERS))},
)
