"""In-process storage: named, process-global object stores for tests and scratch tables.

``memory://name/sub/dir`` opens store ``name`` rooted at ``sub/dir``, so a
``child`` and a second ``from_uri`` of the same URI see the same objects.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from superfile.errors import (
    InvalidInputError,
    ObjectNotFoundError,
    PreconditionFailedError,
    ShortReadError,
)
from superfile.io import ObjectInfo, check_folder, check_key, check_prefix, check_range

__all__ = ["MemoryStorage"]


@dataclass(frozen=True)
class _Object:
    data: bytes
    etag: str
    mtime: float


@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    objects: dict[str, _Object] = field(default_factory=dict)


_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()
# A per-process write counter makes every etag fresh, even for identical content.
_WRITES = itertools.count(1)


class MemoryStorage:
    """Objects held in a dict shared by every handle on the same store name."""

    remote = False

    def __init__(self, name: str) -> None:
        store, _, root = name.strip("/").partition("/")
        if not store:
            raise InvalidInputError(f"memory storage needs a name, got {name!r}")
        if root:
            check_key(root)
        with _STORES_LOCK:
            self._store = _STORES.setdefault(store, _Store())
        self._name = store
        self._root = root
        self.uri = f"memory://{store}/{root}" if root else f"memory://{store}"

    def _key(self, path: str) -> str:
        check_key(path)
        return f"{self._root}/{path}" if self._root else path

    def _get(self, path: str) -> _Object:
        with self._store.lock:
            obj = self._store.objects.get(self._key(path))
        if obj is None:
            raise ObjectNotFoundError(f"{self.uri}: no object {path!r}")
        return obj

    def _put(self, key: str, data: bytes) -> str:
        """Store ``data``; the caller holds the store lock."""
        blob = bytes(data)
        etag = f"{hashlib.md5(blob).hexdigest()}-{next(_WRITES)}"
        self._store.objects[key] = _Object(blob, etag, time.time())
        return etag

    def read(self, path: str) -> bytes:
        return self._get(path).data

    def read_with_etag(self, path: str) -> tuple[bytes, str]:
        obj = self._get(path)
        return obj.data, obj.etag

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        data = self._get(path).data
        if offset + length > len(data):
            raise ShortReadError(f"{self.uri}: {path!r} has {len(data)} bytes, asked for {length} at offset {offset}")
        return data[offset : offset + length]

    def size(self, path: str) -> int:
        return len(self._get(path).data)

    def exists(self, path: str) -> bool:
        key = self._key(path)
        with self._store.lock:
            return key in self._store.objects

    def write(self, path: str, data: bytes) -> str:
        key = self._key(path)
        with self._store.lock:
            return self._put(key, data)

    def write_if_absent(self, path: str, data: bytes) -> str:
        key = self._key(path)
        with self._store.lock:
            if key in self._store.objects:
                raise PreconditionFailedError(f"{self.uri}: {path!r} already exists")
            return self._put(key, data)

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        key = self._key(path)
        with self._store.lock:
            current = self._store.objects.get(key)
            if current is None:
                raise ObjectNotFoundError(f"{self.uri}: no object {path!r}")
            if current.etag != etag:
                raise PreconditionFailedError(f"{self.uri}: {path!r} changed (etag {etag!r} is stale)")
            return self._put(key, data)

    def delete(self, path: str) -> None:
        key = self._key(path)
        with self._store.lock:
            self._store.objects.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = f"{self._root}/" if self._root else ""
        with self._store.lock:
            items = [(k, o) for k, o in self._store.objects.items() if k.startswith(base + prefix)]
        for key, obj in sorted(items, key=lambda item: item[0]):
            yield ObjectInfo(key[len(base) :], len(obj.data), obj.mtime)

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        start = (f"{self._root}/" if self._root else "") + check_folder(prefix)
        with self._store.lock:
            keys = [k[len(start) :] for k in self._store.objects if k.startswith(start)]
        return tuple(sorted({k.partition("/")[0] for k in keys if "/" in k}))

    def local_path(self, path: str) -> str | None:
        check_key(path)
        return None

    def purge_incomplete(self, before: float) -> int:
        """Nothing to purge: a memory write is never left half done."""
        return 0

    def child(self, prefix: str) -> MemoryStorage:
        sub = check_key(prefix.removesuffix("/"))
        return MemoryStorage(f"{self._name}/{self._root}/{sub}" if self._root else f"{self._name}/{sub}")
