"""Admission control: how many queries run at once, per API key and in all (429 beyond, with ``Retry-After``).

A caller past a cap is answered at once rather than queued: a queue behind
slow queries only turns a clear "retry later" into a timeout, and waiting
requests still hold a connection and a thread. SQL and searches have separate
totals (a SQL query holds a worker process, a search a thread for
milliseconds); the per-key cap counts both, so one key cannot take them all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from superfile.remote.errors import TooManyRequestsError

from superfile_gateway.auth import Principal
from superfile_gateway.instruments import REJECTED, observe_admission

__all__ = ["Admission"]


class Admission:
    """Counts running requests by kind (``sql``, ``search``) and by key; refuses those past a cap."""

    def __init__(self, *, totals: dict[str, int], per_key: int) -> None:
        self.totals = dict(totals)
        self.per_key = per_key
        self._running = dict.fromkeys(totals, 0)
        self._by_key: dict[bytes, int] = {}
        self._lock = threading.Lock()
        observe_admission(self)  # superfile_gateway_running

    @contextmanager
    def enter(self, kind: str, principal: Principal) -> Iterator[None]:
        """Hold one of ``kind``'s places (and one of the key's) for the block; 429 when there is none."""
        key = principal.identity
        with self._lock:
            if self._running[kind] >= self.totals[kind]:
                reason, limit = "total", f"{self.totals[kind]} {kind} requests at once in all"
            elif self._by_key.get(key, 0) >= self.per_key:
                reason, limit = "key", f"{self.per_key} requests at once per API key"
            else:
                reason = ""
                self._running[kind] += 1
                self._by_key[key] = self._by_key.get(key, 0) + 1
        if reason:
            REJECTED.labels(kind=kind, reason=reason).inc()
            variable = "SUPERFILE_MAX_CONCURRENT_PER_KEY" if reason == "key" else _TOTAL_SETTING[kind]
            raise TooManyRequestsError(f"too many requests: the gateway runs at most {limit} ({variable}); retry later")
        try:
            yield
        finally:
            with self._lock:
                self._running[kind] -= 1
                left = self._by_key[key] - 1
                if left:
                    self._by_key[key] = left
                else:
                    del self._by_key[key]

    def running(self) -> dict[str, int]:
        """Requests running now, by kind."""
        with self._lock:
            return dict(self._running)


_TOTAL_SETTING = {"sql": "SUPERFILE_SQL_MAX_CONCURRENT", "search": "SUPERFILE_SEARCH_MAX_CONCURRENT"}
