"""Storage behind one small interface (the FileIO of this package).

A table touches storage only through :class:`Storage`. Paths are relative,
``/``-separated keys below the backend's root; backends never let a key
escape that root. Every backend gives the same guarantees:

- ``read_range`` is exact-or-error: exactly ``length`` bytes or a typed error.
- ``write_if_absent`` / ``write_if_match`` are atomic conditional writes
  (S3 ``If-None-Match: *`` / ``If-Match: <etag>``; local disk and memory use
  their own atomic mechanisms) raising :class:`PreconditionFailedError`.
- ``write`` makes the whole object visible at once or not at all.

A conditional write's answer can be lost after the object was stored (a
dropped connection, a 5xx from a proxy); :func:`write_new` is the create-only
write that survives that, and ``commit/publish.py`` resolves a pointer swap
whose answer was lost.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)

__all__ = ["ObjectInfo", "Storage", "from_uri", "write_new"]

WRITE_ATTEMPTS = 8  # tries of one create-only write whose answers were lost (the S3 client stops retrying once its
# retry quota is spent, as it is when many answers are lost)


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    size: int
    mtime: float  # seconds since the epoch


@runtime_checkable
class Storage(Protocol):
    """What the table layer needs from a storage backend."""

    uri: str
    remote: bool  # whether reads cross a network (then the disk cache keeps local copies of superfiles)

    def read(self, path: str) -> bytes: ...

    def read_with_etag(self, path: str) -> tuple[bytes, str]: ...

    def read_range(self, path: str, offset: int, length: int) -> bytes: ...

    def size(self, path: str) -> int: ...

    def exists(self, path: str) -> bool: ...

    def write(self, path: str, data: bytes) -> str: ...

    def write_if_absent(self, path: str, data: bytes) -> str: ...

    def write_if_match(self, path: str, data: bytes, etag: str) -> str: ...

    def delete(self, path: str) -> None: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        """The names of the folders directly in ``prefix`` ("" or a key ending in ``/``) that hold objects,
        sorted: one listing of names, not of every object below them (S3's delimited listing)."""
        ...

    def local_path(self, path: str) -> str | None: ...

    def child(self, prefix: str) -> Storage: ...

    def purge_incomplete(self, before: float) -> int:
        """Remove what writes interrupted before ``before`` (epoch seconds) left below this root (temporary
        files of killed writers, unfinished multipart uploads); returns how many."""
        ...


def write_new(storage: Storage, path: str, data: bytes) -> str:
    """Create ``path`` holding ``data``; returns its etag. Survives a lost answer.

    A create whose answer was lost is tried again. A try (this one's, or the
    S3 client's own retry) that meets an object holding exactly ``data`` met
    our own earlier create, so it is success: every object written this way
    has a fresh unique name, so no one else writes those bytes there. Any
    other object there is a real conflict: :class:`PreconditionFailedError`.
    """
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return storage.write_if_absent(path, data)
        except PreconditionFailedError:
            existing, etag = storage.read_with_etag(path)
            if existing == data:
                return etag
            raise
        except ObjectNotFoundError:
            raise
        except StorageError:
            if attempt + 1 == WRITE_ATTEMPTS:
                raise
            time.sleep(random.uniform(0, 0.05 * 2**attempt))
    raise AssertionError("unreachable")


def check_key(key: str) -> str:
    """Return ``key`` unchanged if it is a safe relative key, else raise.

    One rule for every backend, so a key means the same object everywhere and
    can never reach outside the backend's root (``..``), alias another key
    (``.``, ``a//b``) or be read differently by the OS (``\\``, NUL).
    """
    reason = None
    if not isinstance(key, str) or not key:
        reason = "it is empty"
    elif key.startswith("/"):
        reason = "it is absolute"
    elif "\\" in key or "\0" in key:
        reason = "it contains a backslash or NUL"
    elif any(part in ("", ".", "..") for part in key.split("/")):
        reason = "it has an empty, '.' or '..' component"
    if reason is not None:
        raise InvalidInputError(f"storage key {key!r} escapes the storage root: {reason}")
    return key


def check_prefix(prefix: str) -> str:
    """Validate a listing prefix: empty, a key, or a key followed by ``/``."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def check_folder(prefix: str) -> str:
    """Validate a folder: empty (the root) or a key followed by ``/``."""
    if prefix and not prefix.endswith("/"):
        raise InvalidInputError(f"a folder is empty or ends with '/', got {prefix!r}")
    return check_prefix(prefix)


def check_range(offset: int, length: int) -> None:
    """Reject negative ranges up front: they are caller bugs, not short reads."""
    if offset < 0 or length < 0:
        raise InvalidInputError(f"invalid byte range: offset={offset} length={length}")


def bool_option(name: str, value: bool | str) -> bool:
    """Read a boolean option that may arrive as a URI query string."""
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise InvalidOptionError(f"option {name} must be a boolean, got {value!r}")


def from_uri(uri: str, **options: object) -> Storage:
    """Open the backend a URI names: ``memory://name``, ``file:///dir``, ``s3://bucket/prefix``."""
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    opts: dict[str, object] = {**query, **options}
    if parts.scheme == "memory":
        from superfile.io.memory import MemoryStorage

        return MemoryStorage(parts.netloc + parts.path)
    if parts.scheme in ("file", ""):
        from superfile.io.local import LocalStorage

        path = (parts.netloc + parts.path) if parts.scheme == "file" else uri
        return LocalStorage(path, **opts)  # type: ignore[arg-type]
    if parts.scheme == "s3":
        from superfile.io.s3 import S3Storage

        return S3Storage(parts.netloc, parts.path.strip("/"), **opts)  # type: ignore[arg-type]
    raise InvalidOptionError(f"unsupported storage URI scheme {parts.scheme!r} in {uri!r}")
