"""Where a table's metadata lives in storage, and how it is read and published.

Layout below the table's prefix::

    _pointer.json                 current version -> manifest list (compare-and-swap)
    _sequence.json                next unreserved _id (compare-and-swap; reserved in blocks, see reserve_ids)
    _manifests/<v>-<uuid>.json    one manifest list per version (immutable)
    _manifests/parts/<uuid>.json.zst   manifest parts (immutable, shared between versions)
    _deletions/<uuid>.roar        deletion vectors (immutable)
    data/<uuid>.parquet           superfiles (immutable)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
import pyroaring
from cachetools import LRUCache

from superfile._lru import LRU
from superfile.errors import (
    ContentionError,
    ObjectNotFoundError,
    StorageError,
    TableNotFoundError,
)
from superfile.evolution import schema_id
from superfile.io import Storage, write_new
from superfile.io.local import LocalStorage, StagedWrite
from superfile.manifest.model import ManifestList, PartRef, Pointer, SuperfileEntry

__all__ = ["POINTER", "ManifestStore", "PreparedPointer", "Uploads", "backoff", "settle", "uploads"]

T = TypeVar("T")

POINTER = "_pointer.json"
SEQUENCE = "_sequence.json"
# _ids one sequence compare-and-swap reserves for a small append: the next ones take theirs from the block
# without touching storage. What a handle leaves unused is a gap, never handed out again.
ID_BLOCK = 4096


_UPLOAD_THREADS = 8  # waiting on storage (an fsync, a PUT), not computing
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    """In a forked child: the parent's worker threads do not exist here (nor may its lock be free)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _upload_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_UPLOAD_THREADS, thread_name_prefix="superfile-upload")
        return _pool


class Uploads:
    """New immutable objects of one commit, created concurrently: their writes, fsyncs and directory fsyncs
    (or PUTs) overlap instead of following one another. Each is durable once :meth:`settle` returned, which a
    commit calls before its pointer swap makes any of them reachable. Storage that neither fsyncs nor crosses
    a network (memory, ``fsync=false``) writes each object at once: a thread would only add its hand-off."""

    def __init__(self) -> None:
        self._pending: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def put(self, storage: Storage, path: str, data: bytes, *, plain: bool = False) -> None:
        """Create ``path`` (a fresh unique name) holding ``data`` (``io.write_new``; ``plain``: with
        ``storage.write``, which uploads a big superfile to S3 in parts); may return before it is written:
        :meth:`settle` says when it is, or that it failed. On local disk (``LocalStorage`` itself, not a
        wrapper of it) with ``LocalStorage.write_unique``: one journal commit per object instead of two."""
        write: Callable[[str, bytes], object]
        if isinstance(storage, LocalStorage):  # no answer to lose on local disk: nothing for write_new to retry
            write = storage.write_unique
        else:
            write = storage.write if plain else partial(write_new, storage)
        if not (storage.remote or getattr(storage, "syncs", False)):
            write(path, data)
            return
        self.submit(write, path, data)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the upload threads as part of this batch: :meth:`settle` waits for it too."""
        future = _upload_pool().submit(fn, *args)
        with self._lock:
            self._pending.append((future, fn, args))
        return future

    def settle(self) -> None:
        """Wait for every object put so far; raises the first failure once all have finished. An upload no
        thread has started yet (a busy machine schedules them late) runs here, on the waiting thread."""
        with self._lock:
            pending, self._pending = self._pending, []
        failure: BaseException | None = None
        for future, fn, args in pending:
            if future.cancel():  # not started: the pool will skip it
                try:
                    fn(*args)
                except BaseException as err:  # reported once every upload has finished
                    failure = failure or err
        for future, _, _ in pending:
            if not future.cancelled():
                failure = failure or future.exception()
        if failure is not None:
            raise failure


_local = threading.local()  # .uploads: the Uploads of the commit this thread is writing, if any


@contextlib.contextmanager
def uploads() -> Iterator[Uploads]:
    """Objects this thread creates through a :class:`ManifestStore` inside the block (parts, lists, deletion
    vectors) go to one :class:`Uploads`, the enclosing block's if nested, so a writer's superfiles and its
    commit's metadata settle together: the commit settles it (:func:`settle`) before its pointer swap. Nothing
    is left writing after the outermost block; an error already leaving it wins over an upload's."""
    current: Uploads | None = getattr(_local, "uploads", None)
    if current is not None:
        yield current
        return
    batch = _local.uploads = Uploads()
    try:
        yield batch
    except BaseException:
        with contextlib.suppress(Exception):
            batch.settle()
        raise
    else:
        batch.settle()
    finally:
        _local.uploads = None


def settle() -> None:
    """Wait until every object created in this thread's :func:`uploads` block is durable (raises the first
    failure)."""
    batch: Uploads | None = getattr(_local, "uploads", None)
    if batch is not None:
        batch.settle()


@dataclass
class PreparedPointer:
    """A pointer about to be swapped in: its bytes, and (local disk) its staged temp file."""

    pointer: Pointer
    data: bytes
    staged: StagedWrite | None = None


_ZSTD = pa.Codec("zstd")
_PART_END = _ZSTD.compress(b"]}", asbytes=True)  # the last frame of every part
_PART_FRAMES = 64  # an open part extended more often than this is compressed again as one frame


def _part_key(path: str, schema: pa.Schema) -> str:
    return f"{path}#{schema_id(schema)}"


def backoff(attempt: int, base: float = 0.005, cap: float = 0.5) -> None:
    """Full-jitter exponential backoff: spreads retrying writers apart."""
    time.sleep(random.uniform(0, min(cap, base * (2**attempt))))


class ManifestStore:
    """Reads and writes one table's manifests; caches immutable objects by path."""

    def __init__(self, storage: Storage, *, cache_size: int = 1024) -> None:
        self.storage = storage
        self._lists = LRU(64)
        self._parts = LRU(cache_size)
        self._deletes = LRU(cache_size)
        self.parts_fetched = 0
        self._ids_lock = threading.Lock()
        self._ids: tuple[str, int, int, int] | None = None  # table uuid, pid, next free _id, end of the block
        # the JSON of the entries of the parts in _frames, by (id(entry), schema id) -> (entry, JSON): the open
        # part is rewritten on every commit, and only its new entries need encoding (the entry held keeps its
        # id from being reused while cached). Entries no part in _frames holds are dropped (_forget_encoded)
        self._encoded: LRUCache[tuple[int, int], tuple[SuperfileEntry, str]] = LRUCache(maxsize=4 * cache_size)
        # the parts written last, by (path, schema id) -> (their entries, the compressed frames before the
        # closing one, how many): the next commit's open part is one of them plus new entries
        self._frames: LRUCache[tuple[str, int], tuple[list[SuperfileEntry], bytes, int]] = LRUCache(maxsize=8)
        self._encoded_kept = 0  # entries _encoded held after _forget_encoded last dropped some
        self._encoded_lock = threading.Lock()
        self._pointer: tuple[bytes, Pointer] | None = None  # the pointer read last, as read and as parsed

    def _put(self, path: str, data: bytes) -> None:
        batch: Uploads | None = getattr(_local, "uploads", None)
        if batch is None:
            write_new(self.storage, path, data)
        else:
            batch.put(self.storage, path, data)

    # -- pointer and sequence -------------------------------------------------
    def read_pointer(self) -> tuple[Pointer, str]:
        """The current pointer and its etag: read every time (a strong read checks it on every query), parsed
        only when its bytes changed."""
        try:
            data, etag = self.storage.read_with_etag(POINTER)
        except ObjectNotFoundError:
            raise TableNotFoundError(f"table at {self.storage.uri!r} does not exist") from None
        last = self._pointer
        if last is not None and last[0] == data:
            return last[1], etag
        pointer = Pointer.from_json(json.loads(data))
        self._pointer = (data, pointer)
        return pointer, etag

    def create_pointer(self, pointer: Pointer) -> None:
        settle()  # what the pointer reaches is durable before it is
        write_new(self.storage, POINTER, json.dumps(pointer.to_json()).encode())

    def prepare_pointer(self, pointer: Pointer) -> PreparedPointer:
        """``pointer`` ready for :meth:`swap_pointer`. On local disk with fsync its temp file is written and
        fsynced now, by the committing thread while the upload threads write the commit's objects (call it
        before :func:`settle`), so the swap is only the guarded rename and the directory fsync; elsewhere the
        pointer is written at the swap."""
        prepared = PreparedPointer(pointer, json.dumps(pointer.to_json()).encode())
        if isinstance(self.storage, LocalStorage) and self.storage.syncs:
            prepared.staged = self.storage.stage(POINTER, prepared.data)
        return prepared

    def discard_pointer(self, prepared: PreparedPointer) -> None:
        """Remove what :meth:`prepare_pointer` staged for a swap that will not happen."""
        if prepared.staged is not None and isinstance(self.storage, LocalStorage):
            self.storage.discard(prepared.staged)

    def swap_pointer(self, pointer: Pointer | PreparedPointer, etag: str) -> None:
        """Publish: raises PreconditionFailedError if another commit landed since ``etag`` was read."""
        settle()  # what the pointer reaches is durable before it is (publish settles first, for its errors)
        if isinstance(pointer, Pointer):
            pointer = self.prepare_pointer(pointer)
        try:
            if pointer.staged is not None and isinstance(self.storage, LocalStorage):
                self.storage.swap_staged(pointer.staged, etag)
            else:
                self.storage.write_if_match(POINTER, pointer.data, etag)
        except ObjectNotFoundError:
            raise TableNotFoundError(f"table at {self.storage.uri!r} was dropped") from None

    def init_sequence(self) -> None:
        self.storage.write(SEQUENCE, b'{"next_id": 0}')

    def reserve_ids(self, count: int, max_attempts: int, table_uuid: str) -> int:
        """Reserve ``count`` consecutive _ids; returns the first. Ids of failed commits are never reused.

        A small count is served from a block of :data:`ID_BLOCK` ids this handle reserved with one
        compare-and-swap of the sequence, so most small appends do not write the sequence at all. The block
        belongs to this handle, this process (a forked child reserves its own) and ``table_uuid`` (a table
        dropped and re-created restarts its sequence: a block of the old table is never used on the new)."""
        with self._ids_lock:
            block = self._ids
            pid = os.getpid()
            if block is not None and block[:2] == (table_uuid, pid) and block[3] - block[2] >= count:
                self._ids = (table_uuid, pid, block[2] + count, block[3])
                return block[2]
            size = count if count >= ID_BLOCK // 2 else ID_BLOCK  # a big append takes exactly what it needs
            start = self._reserve(size, max_attempts)
            self._ids = (table_uuid, pid, start + count, start + size)
            return start

    def _reserve(self, count: int, max_attempts: int) -> int:
        """One compare-and-swap of the sequence: ``count`` _ids from its next free one."""
        for attempt in range(max_attempts):
            try:
                data, etag = self.storage.read_with_etag(SEQUENCE)
            except ObjectNotFoundError:
                raise TableNotFoundError(f"table at {self.storage.uri!r} does not exist") from None
            start = int(json.loads(data)["next_id"])
            try:
                self.storage.write_if_match(SEQUENCE, json.dumps({"next_id": start + count}).encode(), etag)
                return start
            except ObjectNotFoundError:
                raise TableNotFoundError(f"table at {self.storage.uri!r} was dropped") from None
            except StorageError:
                # Lost or refused: either way reserve afresh. A reservation that landed unseen only leaves
                # a gap in the _ids, never a reuse.
                backoff(attempt)
        raise ContentionError(f"could not reserve ids after {max_attempts} attempts: too many concurrent writers")

    # -- manifest lists --------------------------------------------------------
    def load_list(self, path: str) -> ManifestList:
        ml, _ = self._lists.get_or_load(path, lambda: ManifestList.from_json(json.loads(self.storage.read(path))))
        return ml

    @staticmethod
    def new_list_path(version: int) -> str:
        return f"_manifests/{version:020d}-{uuid.uuid4().hex}.json"

    def write_list(self, ml: ManifestList, path: str) -> None:
        self._put(path, json.dumps(ml.to_json(), separators=(",", ":")).encode())
        self._lists.get_or_load(path, lambda: ml)  # the next commit builds on it: not read back

    # -- parts -----------------------------------------------------------------
    def load_part(self, ref: PartRef, schema: pa.Schema) -> list[SuperfileEntry]:
        """The part's entries as ``schema`` names their columns (cached per part and schema id: an evolved
        schema reads the same part under its own names)."""

        def fetch() -> list[SuperfileEntry]:
            return [SuperfileEntry.from_json(e, schema) for e in self._part_json(ref.path)]

        entries, fetched = self._parts.get_or_load(_part_key(ref.path, schema), fetch)
        if fetched:
            self.parts_fetched += 1
        return entries

    def part_paths(self, path: str) -> tuple[str, ...]:
        """The superfiles and deletion vectors the part at ``path`` names, read without decoding its entries
        (their summaries and blooms are most of the work of :meth:`load_part`, and cleanup needs only these).
        Interned: the open part is rewritten by every small commit, so retained parts repeat the same paths."""
        entries = self._part_json(path)
        paths = (*(e["path"] for e in entries), *(e["deletes"][0] for e in entries if e.get("deletes")))
        return tuple(sys.intern(p) for p in paths)

    def _part_json(self, path: str) -> list[dict[str, Any]]:
        """The entries of the part at ``path`` as stored: JSON in zstd frames."""
        raw = pa.CompressedInputStream(pa.BufferReader(self.storage.read(path)), "zstd").read()
        entries: list[dict[str, Any]] = json.loads(raw)["entries"]
        return entries

    def retain_parts(self, named: Collection[str]) -> None:
        """Drop the decoded entries of every part not in ``named`` (under every schema): the parts a table's
        kept versions and live snapshots name (``TableFiles.pinned``). Every small commit rewrites the open part
        under a new name, so without this a long-running reader held one decoded part per version it read, up
        to the cache's count, and a writer also each part of an attempt that lost its race and of a version it
        rebased on. A snapshot released since reads its parts again if it is used again."""
        self._parts.discard(lambda key: key.rsplit("#", 1)[0] in named)

    def release_deletes(self, paths: Collection[str]) -> None:
        """Drop the deletion vectors ``paths`` (those no kept version names), as :meth:`retain_parts` drops parts."""
        if paths:
            self._deletes.discard(lambda path: path not in paths)

    def _entry_json(self, entry: SuperfileEntry, schema: pa.Schema, sid: int) -> str:
        key = (id(entry), sid)
        with self._encoded_lock:
            hit = self._encoded.get(key)
        if hit is not None and hit[0] is entry:
            return hit[1]
        text = json.dumps(entry.to_json(schema), separators=(",", ":"))
        with self._encoded_lock:
            self._encoded[key] = (entry, text)
        return text

    def write_part(self, entries: Sequence[SuperfileEntry], schema: pa.Schema) -> tuple[str, int]:
        """Write a new part holding ``entries``; returns its path and size."""
        sid = schema_id(schema)
        held = list(entries)
        body = '{"entries":[' + ",".join(self._entry_json(e, schema, sid) for e in held)
        head = _ZSTD.compress(body.encode(), asbytes=True)
        return self._write_frames(held, schema, sid, head, 1)

    def extend_part(
        self, ref: PartRef, new: Sequence[SuperfileEntry], schema: pa.Schema, *, final: bool = False
    ) -> tuple[str, int]:
        """Write a new part holding ``ref``'s entries followed by ``new`` (the open part a small commit adds
        to); returns its path and size. When this store wrote ``ref``'s part, only ``new`` is encoded and
        compressed: a part is a sequence of zstd frames (which decompress as one), and the new one repeats the
        old one's frames and adds one. Past :data:`_PART_FRAMES` frames, or when ``final`` (the part is sealed
        by this write), it is compressed again as one frame."""
        sid = schema_id(schema)
        base = self.load_part(ref, schema)
        held = base + list(new)
        with self._encoded_lock:
            kept = self._frames.get((ref.path, sid))
        if kept is None or kept[0] is not base or final or kept[2] >= _PART_FRAMES:
            return self.write_part(held, schema)
        text = ",".join(self._entry_json(e, schema, sid) for e in new)
        head = kept[1] + _ZSTD.compress(("," + text if base else text).encode(), asbytes=True)
        return self._write_frames(held, schema, sid, head, kept[2] + 1)

    def _write_frames(
        self, held: list[SuperfileEntry], schema: pa.Schema, sid: int, head: bytes, frames: int
    ) -> tuple[str, int]:
        """Write the part whose compressed entries are ``head`` (``frames`` zstd frames), closed by ``]}``."""
        data = head + _PART_END
        path = f"_manifests/parts/{uuid.uuid4().hex}.json.zst"
        self._put(path, data)
        self._parts.get_or_load(_part_key(path, schema), lambda: held)
        with self._encoded_lock:
            self._frames[(path, sid)] = (held, head, frames)
            self._forget_encoded()
        return path, len(data)

    def _forget_encoded(self) -> None:
        """Drop the JSON of entries no part in ``_frames`` holds: only those can be written again without being
        encoded (the next commit extends one of those parts, or rewrites its entries). A writer that rebases
        over another process's commits (the builder over its compaction process) encodes the entries of parts it
        did not write, and once kept the JSON and the entry of each of them, up to the cache's 4,096 entries: in
        the soak's builder (a commit a second) about 1.8 entries and 31 KB a commit, for 40 minutes. Caller
        holds ``_encoded_lock``."""
        if len(self._encoded) <= 2 * self._encoded_kept + 16:  # amortized: about twice what the parts hold at most
            return
        kept = {(id(e), sid) for (_, sid), (held, _, _) in self._frames.items() for e in held}
        for key in [key for key in self._encoded if key not in kept]:
            del self._encoded[key]
        self._encoded_kept = len(self._encoded)

    # -- deletion vectors --------------------------------------------------------
    def load_deletes(self, path: str) -> pyroaring.FrozenBitMap:
        bm, _ = self._deletes.get_or_load(path, lambda: pyroaring.FrozenBitMap.deserialize(self.storage.read(path)))
        return bm

    def write_deletes(self, bitmap: pyroaring.AbstractBitMap) -> str:
        path = f"_deletions/{uuid.uuid4().hex}.roar"
        self._put(path, bitmap.serialize())
        self._deletes.get_or_load(path, lambda: pyroaring.FrozenBitMap(bitmap))  # read back before it is settled
        return path
