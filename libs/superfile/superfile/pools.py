"""Process-wide worker pools: superfile builds and query fan-out never share threads.

Separate pools keep background writes from starving foreground reads (spec,
Concurrency). Sizes default to the core count and can be set with
``SUPERFILE_BUILD_THREADS`` / ``SUPERFILE_QUERY_THREADS``.

A search spreads its own work over several threads only while cores are
idle (:func:`searching`): with as many searches in flight as cores, each runs
on its caller's thread, since handing work between threads costs CPU that the
other searches need (a node's cost is its CPU seconds per query).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["CORES", "build_pool", "build_threads", "query_pool", "query_threads", "search_pool", "searching"]

_lock = threading.Lock()
_pools: dict[str, ThreadPoolExecutor] = {}
CORES = max(2, os.cpu_count() or 2)  # read once: os.cpu_count() reads sysfs, ~25 us, and every search asks


def _size(env: str) -> int:
    return int(os.environ.get(env, "0")) or CORES


def _pool(kind: str, env: str) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(kind)
        if pool is None:
            size = _size(env)
            pool = _pools[kind] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"superfile-{kind}")
        return pool


def build_pool() -> ThreadPoolExecutor:
    return _pool("build", "SUPERFILE_BUILD_THREADS")


def query_pool() -> ThreadPoolExecutor:
    return _pool("query", "SUPERFILE_QUERY_THREADS")


def search_pool() -> ThreadPoolExecutor:
    """Threads for a search's independent halves (hybrid's two retrievers): not the query pool, whose kernels
    those halves wait on."""
    return _pool("search", "SUPERFILE_QUERY_THREADS")


_in_flight = 0


class _Searching:
    """The context :func:`searching` gives (a class: a generator's context manager cost ~1 us a search)."""

    def __enter__(self) -> bool:
        global _in_flight
        with _lock:
            _in_flight += 1
            return 2 * _in_flight <= query_threads()

    def __exit__(self, *exc: object) -> None:
        global _in_flight
        with _lock:
            _in_flight -= 1


_SEARCHING = _Searching()


def searching() -> _Searching:
    """Count a search in flight for its duration; gives whether it may spread over other threads: while no
    more than half the query threads' worth of searches run (alone, on 2 cores)."""
    return _SEARCHING


def query_threads() -> int:
    """How many threads the query pool has (or will have)."""
    return _size("SUPERFILE_QUERY_THREADS")


def build_threads() -> int:
    """How many threads the build pool has (or will have): a writer shards a batch into as many parts."""
    return _size("SUPERFILE_BUILD_THREADS")
