"""Thread-safe LRUs of futures: concurrent loads of one cold key share a single fetch.

The order and the eviction are ``cachetools.LRUCache``'s (the one LRU of the library and the services); this
adds what its callers need and it has not: a lock (cachetools' caches are not thread-safe), one load per cold key
however many callers ask for it at once, a failed load forgotten (its callers see the error, the next call loads
again), and whether a call did the load itself. :class:`LRU` holds a count of values; :class:`BudgetLRU` holds
values up to several budgets at once (bytes and file handles: the open superfiles).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from cachetools import LRUCache

__all__ = ["LRU", "BudgetLRU"]

T = TypeVar("T")


class LRU:
    """Values are futures, so a second caller of a key being loaded waits for the same fetch."""

    def __init__(self, capacity: float) -> None:
        self._items: LRUCache[Hashable, Future[Any]] = LRUCache(maxsize=capacity)
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __iter__(self) -> Iterator[Hashable]:
        """The keys held now (loaded or loading), least recently used first: a copy, taken under the lock."""
        with self._lock:
            return iter(list(self._items))

    def get_or_load(self, key: Hashable, load: Callable[[], T]) -> tuple[T, bool]:
        """``key``'s value, loaded by ``load`` on a miss; True when this call loaded it."""
        with self._lock:
            fut = self._items.get(key)  # a hit makes the key the most recently used
            owner = fut is None
            if fut is None:
                fut = Future()
                self._items[key] = fut  # past the capacity, the least recently used key goes
        if owner:
            try:
                value = load()
            except BaseException as e:
                with self._lock:
                    if self._items.get(key) is fut:  # not a newer load's future (this one may have been evicted)
                        del self._items[key]
                fut.set_exception(e)
                raise
            fut.set_result(value)
            self._loaded(key, fut, value)
        return fut.result(), owner

    def discard(self, keep: Callable[[Any], bool]) -> None:
        """Drop every key that ``keep`` rejects (whoever holds a value keeps a working one)."""
        with self._lock:
            for key in [k for k in self._items if not keep(k)]:
                del self._items[key]

    def _loaded(self, key: Hashable, fut: Future[Any], value: Any) -> None:
        """Called once a load of ``key`` succeeded (``fut`` holds ``value``)."""


class BudgetLRU(LRU):
    """An :class:`LRU` bounded by budgets instead of a count: ``weigh(value)`` gives what a value holds of each
    budget (say bytes and file handles), and once a value is loaded or :meth:`charge`\\ d again the least
    recently used others go until every total is within its budget.

    The value just charged never goes, so a total exceeds its budget by at most that one value (one that is
    alone larger than a budget stays until the next one comes). A value still loading weighs nothing yet.
    Eviction only drops the cache's reference: whoever holds the value keeps a working one (a reader's
    mapping lives until its last holder lets go), so eviction is safe during use; only the budget then counts
    what the cache holds, not what callers still hold.
    """

    def __init__(self, limits: Sequence[int], weigh: Callable[[Any], Sequence[int]]) -> None:
        super().__init__(math.inf)  # the order only: the budgets evict
        self._weigh = weigh
        self._limits = tuple(limits)
        self._weights: dict[Hashable, tuple[int, ...]] = {}
        self._totals = [0] * len(self._limits)

    @property
    def limits(self) -> tuple[int, ...]:
        return self._limits

    def set_limits(self, limits: Sequence[int]) -> None:
        """New budgets (as many as before); evicts at once down to them."""
        if len(limits) != len(self._limits):
            raise ValueError(f"{len(self._limits)} budgets expected, got {len(limits)}")
        with self._lock:
            self._limits = tuple(limits)
            self._evict()

    def totals(self) -> tuple[int, ...]:
        """What the values held now weigh, per budget."""
        with self._lock:
            return tuple(self._totals)

    def charge(self, key: Hashable, value: Any) -> None:
        """Weigh ``key``'s ``value`` again (it grew: a reader opened an index) and evict down to the budgets."""
        with self._lock:
            fut = self._items.get(key)  # in use: the most recently used
            if fut is not None and fut.done() and fut.exception() is None and fut.result() is value:
                self._set_weight(key, value)
                self._evict()

    def discard(self, keep: Callable[[Any], bool]) -> None:
        """Drop every key that ``keep`` rejects (the values of a table no longer open)."""
        with self._lock:
            for key in [k for k in self._items if not keep(k)]:
                del self._items[key]
                self._unweigh(key)

    def _loaded(self, key: Hashable, fut: Future[Any], value: Any) -> None:
        with self._lock:
            if self._items.get(key) is fut:  # not evicted while it loaded
                self._set_weight(key, value)
                self._evict()

    def _set_weight(self, key: Hashable, value: Any) -> None:
        self._unweigh(key)
        weight = tuple(int(w) for w in self._weigh(value))
        self._weights[key] = weight
        for i, w in enumerate(weight):
            self._totals[i] += w

    def _unweigh(self, key: Hashable) -> None:
        for i, w in enumerate(self._weights.pop(key, ())):
            self._totals[i] -= w

    def _evict(self) -> None:
        """Least recently used first, never the most recent (the value just charged). Values still loading
        weigh nothing: they are put back (as the most recent) rather than dropped before they arrive."""
        loading: list[tuple[Hashable, Future[Any]]] = []
        while len(self._items) > 1 and any(t > lim for t, lim in zip(self._totals, self._limits, strict=True)):
            key, fut = self._items.popitem()
            if key in self._weights:
                self._unweigh(key)
            elif not fut.done():
                loading.append((key, fut))
        for key, fut in loading:
            self._items[key] = fut
