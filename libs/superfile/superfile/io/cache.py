"""The disk cache: local copies of remote superfiles, memory-mapped once resident (spec: "Disk cache").

Without it, a reader on ``s3://`` holds every superfile it opens in process memory. With it, a superfile is
fetched once into a directory on local disk and opened from there as a memory-mapped file: its pages are
the kernel's page cache, shared between processes and reclaimable, and later readers (in this process or
another one using the same directory) open it without a request.

Superfiles are immutable and never reuse a key, so a copy never goes stale; a copy is named by a hash of
its object's full URI. It is written under a temporary name and renamed into place, so a reader sees a
whole copy or none. The directory is bounded by a byte budget: after each fetch the least recently used
copies (by modification time, which every use refreshes) are removed until the rest fit. Removing a copy
that a reader still has mapped is safe: the mapping keeps its pages until the reader is gone, so eviction
only ever costs a fetch.

An optional memory budget bounds the mapped working set instead of the on-disk set: when the copies mapped
by this process's readers add up to more than it, the least recently used mappings are advised out of
memory (``madvise(MADV_DONTNEED)``). Their files stay on disk, so their pages fault back in on the next
use without a download. A mapping counts whole (an upper bound of its resident pages) from its last use
until it is advised out.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import posixpath
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass

import pyarrow as pa

from superfile.errors import InvalidOptionError
from superfile.io import Storage

__all__ = ["DEFAULT_BUDGET_BYTES", "DiskCache"]

DEFAULT_BUDGET_BYTES = 8 << 30

_WHOLE = 64 << 20  # objects up to this size are fetched with one GET ...
_CHUNK = 16 << 20  # ... larger ones in ranged reads of this size, so a fetch never holds more in memory
_PART = ".part"
_STALE_PART_SECONDS = 3600.0  # a temporary file this old belongs to a fetch that died
_TOUCH_EVERY = 10.0  # seconds: how stale a copy's recorded last use may get
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class _Mapping:
    path: str
    ref: weakref.ref[mmap.mmap]  # gone with the last reader using it
    size: int
    last_use: float
    advised: bool = False  # advised out of memory since its last use


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return value


class DiskCache:
    """Copies of remote objects under ``directory``, at most ``budget_bytes`` of them, and this process's
    mappings of them, at most ``memory_budget_bytes`` resident (None: no bound). Thread-safe."""

    def __init__(self, directory: str, budget_bytes: int, memory_budget_bytes: int | None = None) -> None:
        self.budget_bytes = _positive("cache_budget_bytes", budget_bytes)
        self.memory_budget_bytes = (
            None if memory_budget_bytes is None else _positive("cache_memory_bytes", memory_budget_bytes)
        )
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise InvalidOptionError(f"cannot keep the disk cache in {directory!r}: {e}") from None
        self.directory = directory
        self.fetches = 0  # objects this process downloaded (a cold open); hits do not count
        self.advised = 0  # mappings advised out of memory to keep within the memory budget
        self._guard = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self._touched: dict[str, float] = {}
        self._mapped: list[_Mapping] = []

    def path(self, storage: Storage, key: str) -> str:
        """Where the copy of ``key`` in ``storage`` lives (whether or not it is there)."""
        digest = hashlib.sha256(f"{storage.uri.rstrip('/')}/{key}".encode()).hexdigest()[:24]
        return os.path.join(self.directory, f"{digest}-{_UNSAFE.sub('_', posixpath.basename(key))[-80:]}")

    def resident(self, storage: Storage, key: str) -> bool:
        return os.path.exists(self.path(storage, key))

    def fetch(self, storage: Storage, key: str, size: int) -> str:
        """A local path holding the ``size`` bytes of ``key``: the copy already here, or a new one."""
        local = self.path(storage, key)
        if self._use(local):
            return local
        with self._guard:
            lock = self._fetching.setdefault(local, threading.Lock())
        with lock:  # one download per copy, however many threads open it at once
            if self._use(local):
                return local
            part = f"{local}.{uuid.uuid4().hex}{_PART}"
            try:
                with open(part, "wb") as out:
                    if size <= _WHOLE:  # one request: per-request latency outweighs holding it in memory a moment
                        out.write(storage.read(key))
                    else:
                        for offset in range(0, size, _CHUNK):
                            out.write(storage.read_range(key, offset, min(_CHUNK, size - offset)))
                os.replace(part, local)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                with self._guard:  # later openers find the copy (or, after a failure, try again)
                    self._fetching.pop(local, None)
            with self._guard:
                self.fetches += 1
                self._touched[local] = time.monotonic()
        self.evict(keep=local)
        return local

    def discard(self, storage: Storage, key: str) -> None:
        """Remove the copy of ``key`` (one found damaged); the next :meth:`fetch` downloads it again."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(storage, key))

    def evict(self, keep: str | None = None) -> None:
        """Remove the least recently used copies until the rest fit the budget (``keep`` stays)."""
        copies: list[tuple[float, int, str]] = []
        now = time.time()
        for entry in os.scandir(self.directory):
            try:
                st = entry.stat()
            except FileNotFoundError:  # removed by another process meanwhile
                continue
            if entry.name.endswith(_PART):
                if now - st.st_mtime > _STALE_PART_SECONDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                continue
            copies.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in copies)
        kept = set()
        for _, size, path in sorted(copies):  # least recently used first
            if path == keep or total <= self.budget_bytes:
                kept.add(path)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        with self._guard:  # forget the uses of copies that are gone
            self._touched = {p: t for p, t in self._touched.items() if p in kept}

    def usage(self) -> tuple[int, int]:
        """Copies in the directory and their bytes (every table's and process's)."""
        sizes = []
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(_PART):
                with contextlib.suppress(FileNotFoundError):
                    sizes.append(entry.stat().st_size)
        return len(sizes), sum(sizes)

    def map(self, local: str) -> pa.Buffer:
        """The copy at ``local`` memory-mapped, its mapping counted against the memory budget."""
        with open(local, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self.memory_budget_bytes is not None:
            with self._guard:
                self._mapped.append(_Mapping(local, weakref.ref(mapped), len(mapped), time.monotonic()))
            self._bound_memory(keep=local)
        return pa.py_buffer(mapped)

    def mapped_bytes(self) -> int:
        """Bytes of this process's live mappings not advised out since their last use (0 without a budget)."""
        with self._guard:
            return sum(m.size for m in self._mapped if not m.advised and m.ref() is not None)

    def touch(self, storage: Storage, key: str) -> None:
        """Record a use of ``key``'s copy (an open reader's query): eviction from disk and from memory takes
        colder copies first."""
        local = self.path(storage, key)
        self._use(local)
        if self.memory_budget_bytes is None:
            return
        now, returned = time.monotonic(), False
        with self._guard:
            for m in self._mapped:
                if m.path == local:
                    m.last_use = now
                    returned |= m.advised
                    m.advised = False
        if returned:  # its pages are faulting back in: make room among the others
            self._bound_memory(keep=local)

    def _bound_memory(self, keep: str) -> None:
        budget = self.memory_budget_bytes
        assert budget is not None
        with self._guard:
            self._mapped = [m for m in self._mapped if m.ref() is not None]
            resident = sorted((m for m in self._mapped if not m.advised), key=lambda m: m.last_use)
            total = sum(m.size for m in resident)
            for m in resident:
                if total <= budget:
                    break
                mapped = m.ref()
                if m.path == keep or mapped is None:
                    continue
                mapped.madvise(mmap.MADV_DONTNEED)  # file-backed: the pages come back from disk on use
                m.advised = True
                total -= m.size
                self.advised += 1

    def _use(self, local: str) -> bool:
        """Whether the copy exists, refreshing its last use at most every few seconds."""
        now = time.monotonic()
        with self._guard:
            fresh = now - self._touched.get(local, -_TOUCH_EVERY) < _TOUCH_EVERY
        if fresh and os.path.exists(local):
            return True
        try:
            os.utime(local)
        except FileNotFoundError:
            return False
        with self._guard:
            self._touched[local] = now
        return True
