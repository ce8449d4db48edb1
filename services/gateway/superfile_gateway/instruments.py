"""Process-wide instruments over every live gateway's disk cache and background maintenance.

OpenTelemetry keeps the first callbacks registered under an instrument name, so each set of instruments is made
once per process and sums over the gateways alive in it (tests and notebooks run several).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from superfile.io.cache import DiskCache
from superfile.maintenance import AutoMaintenance

__all__ = ["observe_caches", "observe_maintenance"]

_CACHES: weakref.WeakSet[DiskCache] = weakref.WeakSet()  # every live gateway's disk cache in this process
_CACHES_OBSERVED: list[bool] = []  # [True] once the instruments exist
_CACHES_LOCK = threading.Lock()


def observe_caches(m: Meter, cache: DiskCache | None) -> None:
    """The disk caches' size, budget, resident mappings and activity (zeros when there is none), through one
    set of instruments per process: OpenTelemetry keeps the first callbacks of an instrument name."""
    with _CACHES_LOCK:
        if cache is not None:
            _CACHES.add(cache)
        if _CACHES_OBSERVED:
            return
        _CACHES_OBSERVED.append(True)

    def per_directory(read: Callable[[DiskCache], int]) -> int:  # caches sharing a directory share its files
        return sum(read(c) for c in {c.directory: c for c in list(_CACHES)}.values())

    def observed(total: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _options: [Observation(total())]

    for name, total, description in (
        ("superfile.gateway.cache.bytes", lambda: per_directory(lambda c: c.usage()[1]), "bytes of copies on disk"),
        ("superfile.gateway.cache.superfiles", lambda: per_directory(lambda c: c.usage()[0]), "copies on disk"),
        ("superfile.gateway.cache.budget.bytes", lambda: per_directory(lambda c: c.budget_bytes), "on-disk budget"),
        (
            "superfile.gateway.cache.mapped.bytes",
            lambda: sum(c.mapped_bytes() for c in list(_CACHES)),
            "mappings in the memory budget",
        ),
    ):
        m.create_observable_gauge(name, callbacks=[observed(total)], description=description)
    for name, total, description in (
        ("superfile.gateway.cache.fetches", lambda: sum(c.fetches for c in list(_CACHES)), "superfiles downloaded"),
        ("superfile.gateway.cache.advised", lambda: sum(c.advised for c in list(_CACHES)), "mappings advised out"),
    ):
        m.create_observable_counter(name, callbacks=[observed(total)], description=description)


_MAINTENANCE: weakref.WeakSet[AutoMaintenance] = weakref.WeakSet()  # every live gateway's, in this process
_MAINTENANCE_OBSERVED: list[bool] = []


def observe_maintenance(m: Meter, maintenance: AutoMaintenance | None) -> None:
    """Background maintenance by what was done, summed over the gateways of this process (one instrument:
    OpenTelemetry keeps the first callbacks of a name)."""
    with _CACHES_LOCK:
        if maintenance is not None:
            _MAINTENANCE.add(maintenance)
        if _MAINTENANCE_OBSERVED:
            return
        _MAINTENANCE_OBSERVED.append(True)

    def observe(_options: CallbackOptions) -> list[Observation]:
        totals: Counter[str] = Counter()
        for each in list(_MAINTENANCE):
            totals.update(each.counts)
        return [Observation(n, {"what": what}) for what, n in sorted(totals.items())]

    m.create_observable_counter(
        "superfile.gateway.maintenance",
        callbacks=[observe],
        description="Background maintenance done: compactions, superfiles_compacted, cleanups, files_removed, errors",
    )
