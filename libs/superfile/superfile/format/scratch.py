"""Scratch directories for building or extracting an index: removed after the work, and after a process killed
in it.
Also the lock that tells any per-process directory of a live process from a dead one's (:func:`hold`, :func:`held`,
:func:`remove`).

A build writes its index into a temporary directory, packs it into the superfile, and removes it. A process
killed mid-build (SIGKILL, the OOM killer) leaves the directory behind; a builder restarted in the same pod
finds the last one's leftovers in its ``/tmp``, an ``emptyDir`` whose size limit evicts the pod once reached.

So each scratch directory has a lock file beside it, held (``flock``) by its build for as long as it runs. The
kernel lets the lock go when the holder dies, however it dies, whatever the pid namespace. The first build of a
process in a parent directory removes the scratch directories there whose lock is free and which are older
than :data:`ORPHAN_AGE_S` (a build creates its directory an instant before it takes the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

__all__ = ["LOCK", "ORPHAN_AGE_S", "held", "hold", "remove", "scratch_dir"]

ORPHAN_AGE_S = 60.0
LOCK = ".lock"  # the suffix of a directory's lock file, beside it
_swept: set[tuple[str, str]] = set()  # (parent, prefix) this process has swept
_SWEPT_MAX = 4096  # then forgotten: extractions sweep a directory per superfile, and sweeping again is harmless
_swept_lock = threading.Lock()


@contextlib.contextmanager
def scratch_dir(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A new directory under ``parent`` (default: the system's temporary directory) for one build, removed on
    exit; the first call of a process for a parent and prefix removes what killed builds left there."""
    parent = parent or tempfile.gettempdir()
    with _swept_lock:
        first = (parent, prefix) not in _swept
        if first and len(_swept) >= _SWEPT_MAX:
            _swept.clear()
        _swept.add((parent, prefix))
    if first:
        remove_orphans(parent, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path + LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        remove(path)
        os.close(fd)


def remove_orphans(parent: str, prefix: str) -> list[str]:
    """Remove the scratch directories (``prefix*``) under ``parent`` that no live build holds; returns them."""
    now = time.time()
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(prefix) or entry.name.endswith(LOCK) or not entry.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime < ORPHAN_AGE_S or held(entry.path):
                    continue
                remove(entry.path)
                removed.append(entry.path)
    return removed


def hold(directory: str) -> int | None:
    """Take ``directory``'s lock (its file created if missing) for as long as this process lives: the open
    descriptor, never closed; None if a live process holds it. A process forked from this one shares it, and so
    keeps the lock while it lives too."""
    fd = os.open(directory + LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held(directory: str) -> bool:
    """Whether a live process holds ``directory``'s lock (a missing lock file is held by no one)."""
    try:
        fd = os.open(directory + LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of the lock if it was taken
    return False


def remove(directory: str) -> None:
    """Remove ``directory`` (if there) and its lock file."""
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory + LOCK)
