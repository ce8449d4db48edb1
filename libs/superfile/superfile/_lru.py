"""A thread-safe LRU of futures: concurrent loads of one cold key share a single fetch.

The order and the eviction are ``cachetools.LRUCache``'s (the one LRU of the library and the services); this
adds what its callers need and it has not: a lock (cachetools' caches are not thread-safe), one load per cold key
however many callers ask for it at once, a failed load forgotten (its callers see the error, the next call loads
again), and whether a call did the load itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from cachetools import LRUCache

__all__ = ["LRU"]

T = TypeVar("T")


class LRU:
    """Values are futures, so a second caller of a key being loaded waits for the same fetch."""

    def __init__(self, capacity: int) -> None:
        self._items: LRUCache[str, Future[Any]] = LRUCache(maxsize=capacity)
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def get_or_load(self, key: str, load: Callable[[], T]) -> tuple[T, bool]:
        """``key``'s value, loaded by ``load`` on a miss; True when this call loaded it."""
        with self._lock:
            fut = self._items.get(key)  # a hit makes the key the most recently used
            owner = fut is None
            if fut is None:
                fut = Future()
                self._items[key] = fut  # past the capacity, the least recently used key goes
        if owner:
            try:
                fut.set_result(load())
            except BaseException as e:
                with self._lock:
                    if self._items.get(key) is fut:  # not a newer load's future (this one may have been evicted)
                        del self._items[key]
                fut.set_exception(e)
        return fut.result(), owner
