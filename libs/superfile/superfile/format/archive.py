"""The archive a full-text blob is: named files packed into one blob, and extracted back to a directory.

Tantivy opens indexes only from a directory, so a full-text blob carries the
index's files in a minimal archive (layout in "Full-text blobs" of
``docs/format.md``). Readers extract it once into a cache directory
atomically (temp dir + rename, so concurrent threads and processes never see
half an index) and reuse the extraction afterwards.

An extraction outlives nothing it serves: once its superfile is released (no
version a process keeps names it: compacted away, or past retention), the
extraction is removed after a grace period (:func:`remove_later`), so a cache
directory holds about the live table's indexes, not one per superfile a
streaming table ever had. An index already open keeps its mapped files, and a
later open extracts it again.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import struct
import threading
import time
from collections.abc import Collection, Iterable

from superfile.errors import CorruptSuperfileError
from superfile.format.scratch import scratch_dir

__all__ = ["extract", "pack", "read_directory", "remove_later"]

_MAGIC = b"SFTANTV1"
_HEAD = struct.Struct("<8sI")
_ENTRY = struct.Struct("<HQ")
# How long a released superfile's extraction stays: a search pinned on an older version (or a time-travel one)
# may still open its index meanwhile; one that opens it later extracts it again
REMOVAL_GRACE_S = 60.0


def pack(files: Iterable[tuple[str, bytes]]) -> bytes:
    """``files`` (name, contents), in this order, as one archive blob.

    Layout (little-endian): magic ``SFTANTV1``, u32 file count, then per file
    u16 name length, name (UTF-8), u64 size; then the file contents in that order.
    """
    names, contents = [], []
    for n, c in files:
        names.append(n)
        contents.append(c)
    head = [_HEAD.pack(_MAGIC, len(names))]
    for n, c in zip(names, contents, strict=True):
        raw = n.encode()
        head.append(_ENTRY.pack(len(raw), len(c)) + raw)
    return b"".join(head + contents)


def read_directory(blob: memoryview) -> list[tuple[str, int, int]]:
    """(name, start, size) of every file in a packed blob; raises ValueError on a malformed archive."""
    if len(blob) < _HEAD.size:
        raise ValueError("full-text blob too short")
    magic, count = _HEAD.unpack_from(blob, 0)
    if magic != _MAGIC:
        raise ValueError("full-text blob has a bad magic number")
    pos, entries = _HEAD.size, []
    for _ in range(count):
        if pos + _ENTRY.size > len(blob):
            raise ValueError("full-text blob directory is truncated")
        name_len, size = _ENTRY.unpack_from(blob, pos)
        name = bytes(blob[pos + _ENTRY.size : pos + _ENTRY.size + name_len]).decode("utf-8", "replace")
        pos += _ENTRY.size + name_len
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"full-text blob names an unsafe file {name!r}")
        entries.append((name, size))
    files, start = [], pos
    for name, size in entries:
        files.append((name, start, size))
        start += size
    if start != len(blob):
        raise ValueError(f"full-text blob holds {len(blob)} bytes, its directory describes {start}")
    return files


def extract(blob: memoryview, path: str, source: str, *, skip: Collection[str] = ()) -> list[tuple[str, int, int]]:
    """Extract ``blob`` to ``path`` unless a complete extraction is already there.

    Files are written to a temporary sibling directory that is renamed into
    place, so nobody ever opens half an index. An incomplete directory at
    ``path`` (left by a crash before the data reached the disk) is moved aside
    and replaced; a complete one is never touched. Entries named in ``skip``
    are not extracted. Returns the archive's directory (including the skipped
    entries). ``source`` names the file in a :class:`CorruptSuperfileError`.
    """
    try:
        everything = read_directory(blob)
    except ValueError as e:
        raise CorruptSuperfileError(source, str(e)) from None
    files = [f for f in everything if f[0] not in skip]
    if _complete(path, files):
        return everything
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    with scratch_dir(".tmp-", parent) as tmp:  # a killed extraction's is removed by a later one (its lock is free)
        for name, start, size in files:
            with open(os.path.join(tmp, name), "wb") as fh:
                fh.write(blob[start : start + size])
        if os.path.isdir(path) and not _complete(path, files):
            _remove(path)  # another extractor may have moved it first
        try:
            os.rename(tmp, path)
        except OSError:
            if not _complete(path, files):  # losing the race to a complete extraction is fine
                raise
    return everything


def _complete(path: str, files: list[tuple[str, int, int]]) -> bool:
    """Whether ``path`` holds every file of the archive at its full size (cheap: stat calls only)."""
    try:
        return all(os.path.getsize(os.path.join(path, n)) == size for n, _, size in files)
    except OSError:
        return False


class _Removals:
    """Extractions to remove, each when its grace period has passed, by one daemon thread (started on first
    use)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, paths: Iterable[str], delay: float) -> None:
        at = time.monotonic() + delay
        with self._cond:
            for path in paths:
                heapq.heappush(self._due, (at, path))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="superfile-extractions", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, path = heapq.heappop(self._due)
            _remove(path)


_removals = _Removals()


def _forget_removals() -> None:
    """In a forked child: the parent's thread does not exist here, nor may its lock be free; what the parent
    was to remove stays the parent's to remove."""
    global _removals
    _removals = _Removals()


os.register_at_fork(after_in_child=_forget_removals)


def remove_later(paths: Iterable[str], delay: float | None = None) -> None:
    """Remove these extraction directories after ``delay`` seconds (default :data:`REMOVAL_GRACE_S`), off the
    caller's thread: releasing a superfile happens on a query's or a commit's path."""
    _removals.add(paths, REMOVAL_GRACE_S if delay is None else delay)


def _remove(path: str) -> None:
    """Move the extraction aside, then delete it: :func:`extract` sees it whole or not at all."""
    parent = os.path.dirname(path)
    # OSError: the cache directory is gone, or the extraction already moved (another process's release or extraction)
    with contextlib.suppress(OSError), scratch_dir(".stale-", parent) as stale:
        os.rename(path, os.path.join(stale, "index"))
