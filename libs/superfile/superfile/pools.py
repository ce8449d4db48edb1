"""Process-wide worker pools: superfile builds and query fan-out never share threads.

Separate pools keep background writes from starving foreground reads (spec,
Concurrency). Sizes default to the core count and can be set with
``SUPERFILE_BUILD_THREADS`` / ``SUPERFILE_QUERY_THREADS``.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["build_pool", "build_threads", "query_pool", "query_threads"]

_lock = threading.Lock()
_pools: dict[str, ThreadPoolExecutor] = {}


def _size(env: str) -> int:
    return int(os.environ.get(env, "0")) or max(2, os.cpu_count() or 2)


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


def query_threads() -> int:
    """How many threads the query pool has (or will have)."""
    return _size("SUPERFILE_QUERY_THREADS")


def build_threads() -> int:
    """How many threads the build pool has (or will have): a writer shards a batch into as many parts."""
    return _size("SUPERFILE_BUILD_THREADS")
