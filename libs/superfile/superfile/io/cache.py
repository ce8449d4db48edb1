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
only ever costs a fetch. A reader therefore gets its copy mapped (:meth:`DiskCache.open`) before the copy's
arrival makes room, and copies arriving at once in one process do not evict each other.

A reader that does not verify checksums (``verify_checksums=False``, the spec's trade of that guarantee
for faster cold opens) does not wait for a cold copy: :meth:`DiskCache.open_filling` maps a sparse file of
the object's size at once, and every byte range the reader is about to read is fetched first by a ranged
read (the footer, then the sections and column chunks a query uses), while a background thread fills the
rest in order and renames the file into place once it is whole. The reader keeps the same mapping
throughout, so it never has to be reopened.

An optional memory budget bounds the mapped working set instead of the on-disk set: when the copies mapped
by this process's readers add up to more than it, the least recently used mappings are advised out of
memory (``madvise(MADV_DONTNEED)``). Their files stay on disk, so their pages fault back in on the next
use without a download. A mapping counts whole (an upper bound of its resident pages) from its last use
until it is advised out.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import posixpath
import queue
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from superfile.errors import InvalidOptionError
from superfile.io import Storage

__all__ = ["DEFAULT_BUDGET_BYTES", "DiskCache"]

log = logging.getLogger(__name__)

DEFAULT_BUDGET_BYTES = 8 << 30

_WHOLE = 64 << 20  # objects up to this size are fetched with one GET ...
_CHUNK = 16 << 20  # ... larger ones in ranged reads of this size, so a fetch never holds more in memory
_PART = ".part"
_STALE_PART_SECONDS = 3600.0  # a temporary file this old belongs to a fetch that died
_TOUCH_EVERY = 10.0  # seconds: how stale a copy's recorded last use may get
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_BLOCK = 1 << 20  # granularity of what a filling copy records as present


@dataclass
class _Mapping:
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
        self.hits = 0  # opens and uses answered by a copy already here
        self.fetched_bytes = 0  # bytes of the whole copies this process downloaded
        self.advised = 0  # mappings advised out of memory to keep within the memory budget
        self._guard = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self._touched: dict[str, float] = {}
        self._mapped: dict[str, list[_Mapping]] = {}  # copy -> this process's mappings of it (memory budget)
        self.prefetch = True  # fill a copy opened by open_filling in the background (else only what is read)
        self.ranged_bytes = 0  # bytes fetched by ranged reads for readers of filling copies
        self._verified: dict[str, tuple[int, int]] = {}  # copies checked whole here: path -> (inode, size)
        self._arriving: set[str] = set()  # copies put in place whose arrival has not yet made room
        self._evicting = threading.Lock()  # one eviction at a time: concurrent ones would each remove room

    def path(self, storage: Storage, key: str) -> str:
        """Where the copy of ``key`` in ``storage`` lives (whether or not it is there)."""
        digest = hashlib.sha256(f"{storage.uri.rstrip('/')}/{key}".encode()).hexdigest()[:24]
        return os.path.join(self.directory, f"{digest}-{_UNSAFE.sub('_', posixpath.basename(key))[-80:]}")

    def resident(self, storage: Storage, key: str) -> bool:
        return os.path.exists(self.path(storage, key))

    def fetch(self, storage: Storage, key: str, size: int) -> str:
        """A local path holding the ``size`` bytes of ``key``: the copy already here, or a new one."""
        local, new = self._get(storage, key, size)
        if new:
            self.arrived(local)
        return local

    def open(self, storage: Storage, key: str, size: int) -> tuple[str, pa.Buffer]:
        """The copy of ``key`` (fetched unless here) and a mapping of it. A new copy is mapped before its
        arrival makes room, and a copy evicted between being found and being mapped is fetched again: the
        reader gets a mapping, never a path that is gone (a mapping outlives its file)."""
        tries = 3
        while True:
            local, new = self._get(storage, key, size)
            try:
                mapped = self.map(local)
            except FileNotFoundError:  # another process evicted it meanwhile
                if new:
                    self._landed(local)
                tries -= 1
                if tries == 0:
                    raise
                continue
            if new:
                self.arrived(local)
            return local, mapped

    def _get(self, storage: Storage, key: str, size: int) -> tuple[str, bool]:
        """The path of ``key``'s copy and whether this call downloaded it (then it is :meth:`arrived` by the
        caller, and until then no eviction in this process removes it)."""
        local = self.path(storage, key)
        if self._use(local):
            with self._guard:
                self.hits += 1
            return local, False
        with self._guard:
            lock = self._fetching.setdefault(local, threading.Lock())
        with lock:  # one download per copy, however many threads open it at once
            if self._use(local):
                return local, False
            part = f"{local}.{uuid.uuid4().hex}{_PART}"
            try:
                with open(part, "wb") as out:
                    if size <= _WHOLE:  # one request: per-request latency outweighs holding it in memory a moment
                        out.write(storage.read(key))
                    else:
                        for offset in range(0, size, _CHUNK):
                            out.write(storage.read_range(key, offset, min(_CHUNK, size - offset)))
                self.put_in_place(part, local)
                with self._guard:
                    self.fetched_bytes += size
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                with self._guard:  # later openers find the copy (or, after a failure, try again)
                    self._fetching.pop(local, None)
        return local, True

    def put_in_place(self, part: str, local: str) -> None:
        """Rename a whole temporary copy into place, keeping it from this process's evictions until its
        :meth:`arrived`: two copies arriving at once must not each evict the other."""
        with self._guard:
            self._arriving.add(local)
        try:
            os.replace(part, local)
        except BaseException:
            self._landed(local)
            raise

    def arrived(self, local: str) -> None:
        """A whole copy was just put in place (by :meth:`put_in_place`): count it, record its use, and make
        room for it."""
        with self._guard:
            self.fetches += 1
            self._touched[local] = time.monotonic()
            self._verified.pop(local, None)
        try:
            self.evict(keep=local)
        finally:
            self._landed(local)

    def _landed(self, local: str) -> None:
        with self._guard:
            self._arriving.discard(local)

    def count_ranged(self, nbytes: int) -> None:
        """Count bytes a ranged read fetched for a reader of a filling copy (``ranged_bytes``)."""
        with self._guard:
            self.ranged_bytes += nbytes

    def discard(self, storage: Storage, key: str) -> None:
        """Remove the copy of ``key`` (one found damaged); the next :meth:`fetch` downloads it again."""
        local = self.path(storage, key)
        with self._guard:
            self._verified.pop(local, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local)

    def verified(self, local: str) -> bool:
        """Whether this process checked the copy at ``local`` whole (every checksum) since it was put there.
        A reopen need not read it all again: past the open-superfile budget every query reopens superfiles,
        each whole check reads the copy (zlib's CRC-32: ~0.3 ms a MB here), and the soak's gateway went from
        0.05 to 0.30 cores in the minute its table outgrew that budget (``BENCHMARKS.md``, "Soak"). A copy
        this process discarded or downloaded since is checked anew; one another process replaced is a new
        inode, unless the file system reused the old one (the footer is still checked against the manifest)."""
        identity = _identity(local)
        with self._guard:
            return identity is not None and self._verified.get(local) == identity

    def mark_verified(self, local: str) -> None:
        """Record that the copy at ``local`` was just checked whole (:meth:`verified`)."""
        identity = _identity(local)
        if identity is not None:
            with self._guard:
                self._verified[local] = identity

    def evict(self, keep: str | None = None) -> None:
        """Remove the least recently used copies until the rest fit the budget (``keep``, and copies this
        process is still putting in place, stay). One at a time in a process: each sees what the last removed,
        so concurrent arrivals remove no more than the budget needs and the last to arrive stays."""
        with self._evicting:
            self._evict(keep)

    def _evict(self, keep: str | None) -> None:
        copies: list[tuple[float, int, str]] = []
        with self._guard:
            known = set(self._touched) | set(self._verified)
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
        with self._guard:  # after the listing: a copy put in place before it is arriving by now, or has landed
            spared = self._arriving | {keep}
        total = sum(size for _, size, _ in copies)
        removed = []
        for _, size, path in sorted(copies):  # least recently used first
            if path in spared or total <= self.budget_bytes:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(path)
            total -= size
        # forget the uses and checks of the copies that are gone: removed here, or known before the listing and
        # not in it (another process removed them); not a copy that arrived, and was checked, since the listing
        gone = (known - {path for _, _, path in copies}).union(removed)
        with self._guard:
            for path in gone:
                self._touched.pop(path, None)
                self._verified.pop(path, None)

    def usage(self) -> tuple[int, int]:
        """Copies in the directory and their bytes (every table's and process's)."""
        sizes = []
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(_PART):
                with contextlib.suppress(FileNotFoundError):
                    sizes.append(entry.stat().st_size)
        return len(sizes), sum(sizes)

    def open_filling(self, storage: Storage, key: str, size: int) -> tuple[pa.Buffer, Callable[[int, int], None]]:
        """A mapping of ``key``'s copy that is filled as it is read, and the ``ensure(offset, length)`` to call
        before reading a range of it. Without :attr:`prefetch`, only the ranges read are ever fetched (and the
        copy is not kept)."""
        local = self.path(storage, key)
        filling = _Filling(self, storage, key, size, local, keep=self.prefetch)
        if self.prefetch:
            _start_fill(filling.fill)
        return self._register(local, filling.mapped), filling.ensure

    def map(self, local: str) -> pa.Buffer:
        """The copy at ``local`` memory-mapped, its mapping counted against the memory budget."""
        with open(local, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._register(local, mapped)

    def _register(self, local: str, mapped: mmap.mmap) -> pa.Buffer:
        if self.memory_budget_bytes is not None:
            with self._guard:
                self._mapped.setdefault(local, []).append(_Mapping(weakref.ref(mapped), len(mapped), time.monotonic()))
            self._bound_memory(keep=local)
        return pa.py_buffer(mapped)

    def mapped_bytes(self) -> int:
        """Bytes of this process's live mappings not advised out since their last use (0 without a budget)."""
        with self._guard:
            return sum(m.size for ms in self._mapped.values() for m in ms if not m.advised and m.ref() is not None)

    def touch(self, storage: Storage, key: str) -> None:
        """Record a use of ``key``'s copy (an open reader's query): eviction from disk and from memory takes
        colder copies first."""
        local = self.path(storage, key)
        now = time.monotonic()
        with self._guard:
            self.hits += 1
            fresh = now - self._touched.get(local, -_TOUCH_EVERY) < _TOUCH_EVERY
            returned = False
            for m in self._mapped.get(local, ()):
                m.last_use = now
                returned |= m.advised
                m.advised = False
        if not fresh:  # a query runs per superfile: refresh the copy's time on disk only every few seconds
            self._use(local)
        if returned:  # its pages are faulting back in: make room among the others
            self._bound_memory(keep=local)

    def _bound_memory(self, keep: str) -> None:
        budget = self.memory_budget_bytes
        assert budget is not None
        with self._guard:
            live = {p: [m for m in ms if m.ref() is not None] for p, ms in self._mapped.items()}
            self._mapped = {p: ms for p, ms in live.items() if ms}
            total = sum(m.size for ms in self._mapped.values() for m in ms if not m.advised)
            others = (m for p, ms in self._mapped.items() if p != keep for m in ms if not m.advised)
            for m in sorted(others, key=lambda m: m.last_use):
                if total <= budget:
                    break
                mapped = m.ref()
                if mapped is None:
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
        except (FileNotFoundError, NotADirectoryError):  # gone, or its directory replaced: not there either way
            return False
        with self._guard:
            self._touched[local] = now
        return True


class _Filling:
    """A copy being downloaded: a sparse file of the object's size, mapped at once, whose 1 MiB blocks are
    fetched when a reader needs them (:meth:`ensure`) and in order by :meth:`fill`, which renames the file
    into place once every block is there. A block is marked present only after its bytes are written, and
    ``ensure`` returns only once every block of its range is present, so a reader never sees the zeros of a
    hole. The file descriptor stays open while the reader lives (it may still need ranges after a failed
    fill) and is closed once every block is there or the reader is gone."""

    def __init__(self, cache: DiskCache, storage: Storage, key: str, size: int, local: str, keep: bool) -> None:
        self.cache, self.storage, self.key, self.size, self.local = cache, storage, key, size, local
        self.part = f"{local}.{uuid.uuid4().hex}{_PART}"
        fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._fd: list[int] = [fd]  # emptied when closed (shared with the finalizer)
        weakref.finalize(self, _close, self._fd)
        os.ftruncate(fd, size)
        self.mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        if not keep:  # only what is read is ever fetched: no copy to keep, the open file is all there is
            os.unlink(self.part)
        self._present = bytearray((size + _BLOCK - 1) // _BLOCK)
        self._missing = len(self._present)
        self._lock = threading.Lock()

    def ensure(self, offset: int, length: int) -> None:
        if self._missing == 0 or length <= 0:
            return
        first, last = offset // _BLOCK, min(offset + length - 1, self.size - 1) // _BLOCK
        with self._lock:
            gaps = [b for b in range(first, last + 1) if not self._present[b]]
        for start, end in _runs(gaps):
            self._fetch(start, end, ranged=True)

    def fill(self) -> None:
        """Fetch every block still missing, in order, then put the whole copy in place (background)."""
        try:
            with self._lock:
                gaps = [b for b, present in enumerate(self._present) if not present]
            for start, end in _runs(gaps, most=_CHUNK // _BLOCK):
                self._fetch(start, end, ranged=False)
            self.cache.put_in_place(self.part, self.local)
        except Exception as e:  # readers still fetch what they need; the copy is not kept
            log.warning("disk cache: filling %s failed (%s); it is read by ranges only", self.key, e)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.part)
            return
        self.cache.arrived(self.local)

    def _fetch(self, first: int, last: int, *, ranged: bool) -> None:
        offset = first * _BLOCK
        data = self.storage.read_range(self.key, offset, min((last + 1) * _BLOCK, self.size) - offset)
        with self._lock:
            if not self._fd:
                return  # every block was written meanwhile
            view, at = memoryview(data), offset
            while view:  # a write to a regular file may still be short
                written = os.pwrite(self._fd[0], view, at)
                view, at = view[written:], at + written
            for b in range(first, last + 1):
                if not self._present[b]:
                    self._present[b] = 1
                    self._missing -= 1
            if self._missing == 0:
                _close(self._fd)
        if ranged:
            self.cache.count_ranged(len(data))


def _close(fd: list[int]) -> None:
    if fd:
        os.close(fd.pop())


_FILL_QUEUE: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_FILL_WORKERS: list[threading.Thread] = []
_FILL_LOCK = threading.Lock()


def _fill_worker() -> None:
    while True:
        _FILL_QUEUE.get()()


def _start_fill(job: Callable[[], None]) -> None:
    """Queue a background fill; two daemon threads per process run them in order (a process may exit with
    fills unfinished: their temporary files are swept later)."""
    with _FILL_LOCK:
        while len(_FILL_WORKERS) < 2:
            worker = threading.Thread(target=_fill_worker, name="superfile-cache-fill", daemon=True)
            worker.start()
            _FILL_WORKERS.append(worker)
    _FILL_QUEUE.put(job)


def _runs(blocks: list[int], most: int | None = None) -> list[tuple[int, int]]:
    """Consecutive block numbers as (first, last) runs, each at most ``most`` blocks long."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and runs[-1][1] == b - 1 and (most is None or b - runs[-1][0] < most):
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs


def _identity(local: str) -> tuple[int, int] | None:
    """A copy's inode and size (None if it is gone): what tells one download of it from the next."""
    try:
        st = os.stat(local)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size
