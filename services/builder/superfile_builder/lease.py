"""The per-table Redis lease: at most one builder applies a table's log at a time.

Acquire is one Lua script: if nobody holds the key, it raises the table's
fencing counter to at least the fence the table's manifest last committed
under (``log_fences``), ``INCR``s it and ``SET``s ``key token PX ttl`` with the
token starting with that fence. So a newer holder always has a larger fence
than every older one, even after a Redis restart without persistence reset
the counter: the fence derives from the manifest, never from Redis alone (with
``INCR`` alone the builder took fences below the committed one and had its own
commits refused until the counter caught up). A background
thread renews each held lease with a Lua compare-and-pexpire; release is a Lua
compare-and-delete, so a builder can never extend or delete a lease another
builder holds.

The holder trusts its lease only until ``renewed_at + ttl`` by its own clock
(minus a margin), with ``renewed_at`` taken *before* the renew command was
sent: Redis starts its ttl later than that, so the holder's view expires
first. A builder whose renewal fails stops committing for that table; the
publisher's requirements cover the remaining window (the offset and fence the
manifest records, and the lease's deadline on the wall clock, checked on every
publish attempt).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

import redis

__all__ = ["Lease", "LeaseKeeper"]

log = logging.getLogger(__name__)

_RENEW_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
# KEYS: lease, fence counter; ARGV: owner, ttl ms, committed fence. Returns the new fence, or 0 if held.
_ACQUIRE_LUA = """
if redis.call('exists', KEYS[1]) == 1 then return 0 end
local committed = tonumber(ARGV[3])
if tonumber(redis.call('get', KEYS[2]) or '0') < committed then redis.call('set', KEYS[2], committed) end
local fence = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
return fence
"""
_RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_MARGIN = 0.1  # fraction of the ttl the holder gives up before Redis would expire the key


class Lease:
    """One table's lease as seen by one builder process."""

    def __init__(self, client: redis.Redis, table: str, owner: str, ttl_ms: int, prefix: str = "superfile:builder"):
        if ttl_ms < 100:
            raise ValueError(f"lease ttl must be at least 100 ms, got {ttl_ms}")
        self.table = table
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.key = f"{prefix}:lease:{table}"
        self.fence_key = f"{prefix}:fence:{table}"
        self._client = client
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._renew = client.register_script(_RENEW_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._fence = 0
        self._valid_until = 0.0
        self.expires_in = 0.0  # seconds until the other holder's lease expired, as of the last try

    @property
    def fence(self) -> int:
        """The fencing number of the current (or last) holding; 0 before the first."""
        return self._fence

    def valid(self) -> bool:
        """True while this builder may commit for the table."""
        with self._lock:
            return self._token is not None and time.monotonic() < self._valid_until

    def deadline_ms(self) -> int | None:
        """Until when this builder may commit for the table, on the wall clock (epoch milliseconds; None when
        the lease is not held): the deadline :meth:`valid` keeps by the monotonic clock, as of now. A commit
        carries it as a requirement (``AssertBefore``), so an attempt made after it is refused."""
        with self._lock:
            mono, wall = time.monotonic(), time.time()
            if self._token is None or mono >= self._valid_until:
                return None
            return int((wall + (self._valid_until - mono)) * 1000)

    def try_acquire(self, committed_fence: Callable[[], int] = lambda: 0) -> bool:
        """Take the lease if nobody holds it; True when this builder now holds it. ``committed_fence`` returns
        the fence the table's manifest last committed under (asked only when the lease is free): the new
        fence is above it. When another builder holds the lease, :attr:`expires_in` says when its lease runs
        out unless renewed."""
        if self.valid():
            return True
        remaining_ms = int(self._client.pttl(self.key))  # -2: no such key; -1: no expiry (not ours to judge)
        if remaining_ms != -2:  # held elsewhere: no need to read the manifest
            self.expires_in = remaining_ms / 1000 if remaining_ms >= 0 else self.ttl_ms / 1000
            return False
        floor = committed_fence()
        sent = time.monotonic()
        fence = int(self._acquire(keys=[self.key, self.fence_key], args=[self.owner, self.ttl_ms, floor]))
        if not fence:
            return False  # taken meanwhile
        token = f"{fence}:{self.owner}"
        with self._lock:
            self._token, self._fence = token, fence
            self._valid_until = sent + self.ttl_ms / 1000 * (1 - _MARGIN)
        log.info("lease on %s acquired (fence %d)", self.table, fence)
        return True

    def renew(self) -> bool:
        """Extend a held lease; on failure the lease is lost and :meth:`valid` turns False."""
        with self._lock:
            token = self._token
        if token is None:
            return False
        sent = time.monotonic()
        try:
            ok = bool(self._renew(keys=[self.key], args=[token, self.ttl_ms]))
        except redis.RedisError as exc:
            log.warning("lease on %s not renewed: %s", self.table, exc)
            return self.valid()  # still trusted until its deadline; the next renewal may get through
        with self._lock:
            if self._token != token:
                return False
            if ok:
                self._valid_until = sent + self.ttl_ms / 1000 * (1 - _MARGIN)
            else:
                log.warning("lease on %s lost (fence %d)", self.table, self._fence)
                self._token = None
        return ok

    def release(self) -> None:
        """Give the lease up (only if this builder still holds it)."""
        with self._lock:
            token, self._token = self._token, None
        if token is not None:
            try:
                self._release(keys=[self.key], args=[token])
            except redis.RedisError as exc:
                log.warning("lease on %s not released (it expires by itself): %s", self.table, exc)


class LeaseKeeper:
    """The background thread renewing every registered lease a few times per ttl."""

    def __init__(self, client: redis.Redis, ttl_ms: int, *, owner: str | None = None):
        self.client = client
        self.ttl_ms = ttl_ms
        self.owner = owner or uuid.uuid4().hex[:12]
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def lease(self, table: str) -> Lease:
        """The lease for ``table`` (created and registered for renewal on first use)."""
        with self._lock:
            lease = self._leases.get(table)
            if lease is None:
                lease = self._leases[table] = Lease(self.client, table, self.owner, self.ttl_ms)
            return lease

    def forget(self, table: str) -> None:
        """Stop renewing (and release) the lease of a table this builder no longer builds."""
        with self._lock:
            lease = self._leases.pop(table, None)
        if lease is not None:
            lease.release()

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = self.ttl_ms / 1000 / 3
        while not self._stop.wait(interval):
            with self._lock:
                leases = list(self._leases.values())
            for lease in leases:
                lease.renew()

    def close(self) -> None:
        """Stop renewing and release every held lease."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.release()
