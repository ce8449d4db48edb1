"""Local-disk storage: one file per key below a root directory.

Every publish is a rename or a hard link of a fully written, fsynced temp
file, so readers never see partial objects and a crash leaves either the old
or the new object. Mutations of a directory's entries (replace, unlink, and
the read-compare-replace of ``write_if_match``) are serialised by an
``flock`` on that directory, which every process and every handle agrees on
whatever root it was opened at.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from superfile.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    ShortReadError,
    StorageError,
)
from superfile.io import ObjectInfo, bool_option, check_folder, check_key, check_prefix, check_range

__all__ = ["LocalStorage", "StagedWrite"]

_TMP_SUFFIX = ".sftmp"
_SMALL_READ = 64 * 1024  # an object read whole in one call if it fits (the pointer, manifests)
# A file whose inode last changed this long ago (by the system clock) is not read again while one stat finds it
# unchanged: any later write, rename over it or reuse of its inode number sets a ctime past it (read_with_etag).
_SETTLED_S = 1.0
_SETTLED_MAX = 64  # objects remembered so (the pointers, retention and sequence files a process reads)


def _etag(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _holds_objects(directory: str) -> bool:
    """Whether a directory holds an object at any depth (a drop or a cleanup may leave it empty)."""
    return any(not _is_temp(name) for _, _, names in os.walk(directory) for name in names)


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(_TMP_SUFFIX)


@dataclass(frozen=True)
class StagedWrite:
    """A write of ``path`` prepared in the temp file ``tmp`` (written and fsynced), waiting for its swap."""

    path: str
    tmp: str
    etag: str  # of the staged bytes


def _sync_dir(directory: str) -> None:
    """Make a rename or link in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage:
    """Objects as files under ``root``; etags are the hex MD5 of the content."""

    remote = False

    def __init__(self, root: str, *, fsync: bool | str = True, create: bool = True) -> None:
        """``fsync=False`` skips the durability syncs (scratch data, benchmarks on tmpfs). ``create=False``
        leaves a missing root to the first write (a child opened only to read must not make a directory)."""
        self._root = os.path.abspath(root)
        self._fsync = bool_option("fsync", fsync)
        self.syncs = self._fsync  # whether a write waits for the disk (then a commit's writes overlap)
        if create:
            try:
                os.makedirs(self._root, exist_ok=True)
            except OSError as err:
                raise StorageError(f"cannot create storage root {self._root!r}: {err}") from err
        self.uri = "file://" + self._root
        # read_with_etag's settled small objects: key -> its file, (device, inode, size, mtime, ctime), bytes, etag
        self._settled: dict[str, tuple[str, tuple[int, ...], bytes, str]] = {}

    # -- helpers -----------------------------------------------------------

    def _path(self, path: str) -> str:
        return os.path.join(self._root, *check_key(path).split("/"))

    @contextlib.contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """Turn OS errors into the package's typed storage errors."""
        try:
            yield
        except OSError as err:
            raise self._typed(path, err) from err

    def _typed(self, path: str, err: OSError) -> StorageError:
        if isinstance(err, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
            return ObjectNotFoundError(f"{self.uri}: no object {path!r}")
        return StorageError(f"{self.uri}: {path!r}: {err}")

    @contextlib.contextmanager
    def _dir_locked(self, directory: str) -> Iterator[None]:
        """Hold an exclusive flock on ``directory``, then fsync it once released."""
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        if self._fsync:
            _sync_dir(directory)

    def _open_temp(self, target: str, data: bytes) -> tuple[int, str]:
        """A fresh temp file next to ``target`` holding ``data``, not yet fsynced: its open descriptor and path."""
        directory, name = os.path.split(target)
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(8)}{_TMP_SUFFIX}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:  # the directory's first object
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with memoryview(data) as view:
                written = 0
                while written < len(view):
                    written += os.write(fd, view[written:])
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return fd, tmp

    def _write_temp(self, target: str, data: bytes) -> str:
        """Write ``data`` to a fresh temp file next to ``target`` and fsync it; return its path."""
        fd, tmp = self._open_temp(target, data)
        try:
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _replace(self, target: str, tmp: str) -> None:
        try:
            with self._dir_locked(os.path.dirname(target)):
                os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- reads -------------------------------------------------------------

    def read(self, path: str) -> bytes:
        return self._read(self._path(path), path)

    def _read(self, target: str, path: str) -> bytes:
        """The file ``target`` (object ``path``) whole."""
        # by descriptor: open, read, close. Each call lets the interpreter lock go, and the pointer is read once a
        # query: a file object also stats the file twice and checks for a terminal (6 hand-offs, not 3)
        with self._errors(path):
            fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
            try:
                head = os.read(fd, _SMALL_READ)
                if len(head) < _SMALL_READ:  # the whole of a small object: a read of a file returns less only at its
                    return head  # end, and an object is never written in place (a temp file renamed over it)
                os.lseek(fd, 0, os.SEEK_SET)  # a larger one: read whole into one buffer sized by the file
                with open(fd, "rb", buffering=0, closefd=False) as f:
                    return f.read()
            finally:
                os.close(fd)

    def read_with_etag(self, path: str) -> tuple[bytes, str]:
        """The object and its etag. A strong read checks the table's pointer this way on every query, and three
        calls that let the interpreter lock go (open, read, close) are three context switches each way when a
        second query thread waits for it. So a small file whose inode settled (changed over
        ``_SETTLED_S`` ago) is remembered, and read again only when one ``stat`` finds its inode, size, mtime or
        ctime changed. Every change of a file sets its ctime to now, past the settled one, and so does any new
        file given the same inode number (assuming the file system's clock is this machine's to within a
        second, as it is for a local disk)."""
        known = self._settled.get(path)  # a remembered key was checked and resolved when it was remembered
        target = self._path(path) if known is None else known[0]
        try:  # not _errors: on every strong read, its generator costs as much as the stat
            st = os.stat(target)
        except OSError as err:
            raise self._typed(path, err) from err
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if known is not None and known[1] == seen:
            return known[2], known[3]
        data = self._read(target, path)  # if it changed since the stat, seen names a file gone: it cannot match
        etag = _etag(data)
        if len(data) < _SMALL_READ and time.time() - st.st_ctime > _SETTLED_S:
            if len(self._settled) >= _SETTLED_MAX:
                self._settled.clear()
            self._settled[path] = (target, seen, data, etag)
        return data, etag

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        target = self._path(path)
        with self._errors(path), open(target, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset + length > size:
                raise ShortReadError(f"{self.uri}: {path!r} has {size} bytes, asked for {length} at offset {offset}")
            chunks = []
            got = 0
            while got < length:
                chunk = os.pread(f.fileno(), length - got, offset + got)
                if not chunk:
                    raise ShortReadError(f"{self.uri}: {path!r} ended at {offset + got}, expected more")
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)

    def size(self, path: str) -> int:
        target = self._path(path)
        with self._errors(path):
            st = os.stat(target)
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(f"{self.uri}: no object {path!r}")
        return st.st_size

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._path(path))

    # -- writes ------------------------------------------------------------

    def write(self, path: str, data: bytes) -> str:
        target = self._path(path)
        with self._errors(path):
            self._replace(target, self._write_temp(target, data))
        return _etag(data)

    def write_if_absent(self, path: str, data: bytes) -> str:
        target = self._path(path)
        with self._errors(path):
            tmp = self._write_temp(target, data)
            try:
                # link() fails if the target exists and publishes a complete file.
                os.link(tmp, target)
            except FileExistsError as err:
                raise PreconditionFailedError(f"{self.uri}: {path!r} already exists") from err
            finally:
                os.unlink(tmp)
            if self._fsync:
                _sync_dir(os.path.dirname(target))
        return _etag(data)

    def write_unique(self, path: str, data: bytes) -> None:
        """``write_if_absent`` for a fresh unique name that nothing reads until a durable reference names it (a
        commit's new objects: its pointer swap waits for this call to return). The temp file is linked to its
        name *before* its fsync, so one journal commit makes the content and the name durable together (the
        directory fsync after it finds them written) instead of one for each. A power loss before this returned
        may leave the name holding a partial file: unreferenced, and removed by ``cleanup``; a process killed
        at any point leaves the bytes whole (they were written before the link). Returns no etag: nothing is
        ever conditioned on a fresh object's."""
        target = self._path(path)
        with self._errors(path):
            fd, tmp = self._open_temp(target, data)
            try:
                try:
                    os.link(tmp, target)
                except FileExistsError as err:
                    raise PreconditionFailedError(f"{self.uri}: {path!r} already exists") from err
                finally:
                    os.unlink(tmp)
                if self._fsync:
                    try:
                        os.fsync(fd)
                        _sync_dir(os.path.dirname(target))
                    except BaseException:
                        os.unlink(target)  # not durable: a retry must write it again, not find it there
                        raise
            finally:
                os.close(fd)

    def stage(self, path: str, data: bytes) -> StagedWrite:
        """The first half of :meth:`write_if_match`, done ahead: ``data`` in a temp file beside ``path``, fsynced.
        A commit stages its pointer while its other objects upload, so the swap itself (:meth:`swap_staged`) is
        only the guarded rename and the directory fsync."""
        target = self._path(path)
        with self._errors(path):
            return StagedWrite(path, self._write_temp(target, data), _etag(data))

    def swap_staged(self, staged: StagedWrite, etag: str) -> str:
        """:meth:`write_if_match` of a staged write: replaces its object if that still has ``etag``. The temp file
        is consumed either way."""
        target = self._path(staged.path)
        with self._errors(staged.path):
            self._swap(target, staged.path, staged.tmp, etag)
        return staged.etag

    def discard(self, staged: StagedWrite) -> None:
        """Remove a staged write that will not be swapped in."""
        with contextlib.suppress(OSError):
            os.unlink(staged.tmp)

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        target = self._path(path)
        with self._errors(path):
            self._swap(target, path, self._write_temp(target, data), etag)
        return _etag(data)

    def _swap(self, target: str, path: str, tmp: str, etag: str) -> None:
        """Rename ``tmp`` over ``target`` if ``target`` still has ``etag``, under the directory's lock, then fsync
        the directory; ``tmp`` is gone afterwards either way."""
        try:
            with self._dir_locked(os.path.dirname(target)):
                with open(target, "rb") as f:
                    current = _etag(f.read())
                if current != etag:
                    raise PreconditionFailedError(f"{self.uri}: {path!r} changed (etag {etag!r} is stale)")
                os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, path: str) -> None:
        target = self._path(path)
        with self._errors(path):
            try:
                with self._dir_locked(os.path.dirname(target)):
                    os.unlink(target)
            except (FileNotFoundError, NotADirectoryError):
                return

    # -- listing and paths ---------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        start_rel = prefix.rpartition("/")[0]
        start = os.path.join(self._root, *start_rel.split("/")) if start_rel else self._root
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self._root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            # Only descend where keys can still start with the prefix.
            dirnames[:] = [
                d for d in dirnames if (rel_dir + d + "/").startswith(prefix) or prefix.startswith(rel_dir + d + "/")
            ]
            for name in filenames:
                rel = rel_dir + name
                if _is_temp(name) or not rel.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while listing
                found.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        found.sort(key=lambda info: info.path)
        yield from found

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        check_folder(prefix)
        start = os.path.join(self._root, *prefix.rstrip("/").split("/")) if prefix else self._root
        try:
            entries = list(os.scandir(start))
        except (FileNotFoundError, NotADirectoryError):
            return ()
        return tuple(sorted(e.name for e in entries if e.is_dir() and _holds_objects(e.path)))

    def local_path(self, path: str) -> str | None:
        return self._path(path)

    def purge_incomplete(self, before: float) -> int:
        """Delete the temp files of writes killed before ``before`` (a live write's is younger)."""
        removed = 0
        for dirpath, _, filenames in os.walk(self._root):
            for name in filenames:
                if not _is_temp(name):
                    continue
                path = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_mtime < before:
                        os.unlink(path)
                        removed += 1
        return removed

    def child(self, prefix: str) -> LocalStorage:
        sub = check_key(prefix.removesuffix("/"))
        return LocalStorage(os.path.join(self._root, *sub.split("/")), fsync=self._fsync, create=False)
