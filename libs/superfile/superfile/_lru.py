"""A small thread-safe LRU of futures: concurrent loads of one cold key share a single fetch."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["LRU"]

T = TypeVar("T")


class LRU:
    """Values are futures, so a second caller of a key being loaded waits for the same fetch."""

    def __init__(self, capacity: int) -> None:
        self._items: OrderedDict[str, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def get_or_load(self, key: str, load: Callable[[], T]) -> tuple[T, bool]:
        with self._lock:
            fut = self._items.get(key)
            owner = fut is None
            if fut is None:
                fut = Future()
                self._items[key] = fut
                while len(self._items) > self._capacity:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(key)
        if owner:
            try:
                fut.set_result(load())
            except BaseException as e:
                with self._lock:
                    self._items.pop(key, None)
                fut.set_exception(e)
        return fut.result(), owner
