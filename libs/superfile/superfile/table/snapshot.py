"""The reader: a snapshot pinned to one manifest, with pruning and row reads over its superfiles."""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import resource
import threading
import weakref
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyroaring

from superfile._lru import LRU, BudgetLRU
from superfile.errors import CorruptSuperfileError, InvalidOptionError, ObjectNotFoundError, SuperfileMissingError
from superfile.evolution import plain
from superfile.expressions import Predicate, parse_predicate
from superfile.format import SuperfileReader, archive
from superfile.format.reader import (
    DEFAULT_CACHE_DIR,
    FOOTER_FACTOR,
    READ_WHOLE_BYTES,
    READER_OVERHEAD,
    extraction_dir,
)
from superfile.io import Storage
from superfile.io.cache import DiskCache
from superfile.manifest.model import ManifestList, PartRef, SuperfileEntry
from superfile.manifest.store import POINTER, ManifestStore
from superfile.pools import query_pool, query_threads
from superfile.schema import ID
from superfile.table import exact
from superfile.table.columns import FileColumns
from superfile.table.index_filter import candidate_rows, text_pruner

__all__ = [
    "INDEXED_FRACTION",
    "Fanout",
    "Snapshot",
    "TableFiles",
    "offsets_of",
    "on_release",
    "open_readers",
    "set_open_budget",
]

T = TypeVar("T")
R = TypeVar("R")


log = logging.getLogger(__name__)
_predicates = LRU(256)  # (schema key, where text) -> its Predicate (immutable, shared between threads)


INDEXED_FRACTION = 0.1  # read only a superfile's index candidates when they are at most this share of its rows


_FEW_ROWS = 1024
# A scan whose indexes pick at most this many rows in all reads them on the calling thread: 16 superfiles of
# 62,500 rows, `doc_id, title WHERE label IN (...)`: 1,000 rows 3.1 ms against 4.5 on the query pool (two
# cores), 10,000 rows 6.8 against 8.0, 50,000 rows 23.7 against 19.9
_INLINE_ROWS = 16_384

OPEN_BYTES_ENV = "SUPERFILE_OPEN_BYTES"
OPEN_FILES_ENV = "SUPERFILE_OPEN_FILES"
_MAX_DEFAULT_FILES = 4096


def _default_open_bytes() -> int:
    """A quarter of the machine's memory (2 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError):
        return 2 << 30


def _default_open_files() -> int:
    """4096, or less where half the descriptor limit (``ulimit -n``) or a quarter of the map limit
    (``vm.max_map_count``) is lower: the rest stays for sockets, Parquet decoding and tantivy's own."""
    limits = [_MAX_DEFAULT_FILES]
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft // 2)
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limits.append(int(f.read()) // 4)
    except (OSError, ValueError):
        pass
    return max(1, min(limits))


def _budget(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidOptionError(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _held(reader: SuperfileReader) -> tuple[int, int]:
    return reader.held()


@functools.cache
def open_readers() -> BudgetLRU:
    """The process's open superfiles (every table's), least recently used evicted past either budget: the
    bytes they hold (``SUPERFILE_OPEN_BYTES``, default a quarter of memory) and their file handles, descriptors
    plus mappings (``SUPERFILE_OPEN_FILES``, default 4096 or less, :func:`_default_open_files`). Read once, at the
    first table opened; :func:`set_open_budget` changes them (docs/storage.md, "Open superfiles")."""
    limits = (_budget(OPEN_BYTES_ENV, _default_open_bytes()), _budget(OPEN_FILES_ENV, _default_open_files()))
    return BudgetLRU(limits, _held)


def set_open_budget(open_bytes: int, open_files: int) -> None:
    """Set the budgets of :func:`open_readers` at run time (as ``SUPERFILE_OPEN_BYTES`` / ``SUPERFILE_OPEN_FILES``
    do at start); the readers past them are evicted at once."""
    for name, value in (("open_bytes", open_bytes), ("open_files", open_files)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    open_readers().set_limits((open_bytes, open_files))


_owners = itertools.count()
# Tables whose files object was collected: their readers are dropped at the next open of a cold superfile (not in
# the finalizer, which the collector may run while this thread holds the cache's lock)
_gone: set[int] = set()


def _drop_gone(readers: BudgetLRU) -> None:
    gone = set()
    while _gone:
        gone.add(_gone.pop())
    if gone:
        readers.discard(lambda key: key[0] not in gone)


def offsets_of(rows: pyroaring.AbstractBitMap) -> np.ndarray:
    """Row offsets of a bitmap, ascending (``to_array`` is ~15x faster than iterating it)."""
    return np.frombuffer(rows.to_array(), np.uint32).astype(np.int64)


def _read_columns(reader: FileColumns, names: list[str], rows: np.ndarray | None, use_threads: bool) -> pa.Table:
    """Scalar columns ``names`` of all rows or of the given offsets: ``_id`` from the raw id section (a
    zero-copy view, nothing decoded), the others decoded from Parquet (as the snapshot's schema has them)."""
    parquet = [c for c in names if c != ID]
    ids = pa.array(reader.ids(rows), pa.uint64()) if ID in names or not parquet else None
    if not parquet:  # also for no column at all: the ids carry the row count
        return pa.table({ID: ids})
    table = reader.read(parquet, rows=rows, use_threads=use_threads)
    return table if ids is None else table.add_column(0, pa.field(ID, pa.uint64(), nullable=False), ids)


_snapshot_state: list[Callable[[str, Callable[[str], bool]], None]] = []


def on_release(drop: Callable[[str, Callable[[str], bool]], None]) -> None:
    """Register ``drop(uri, keep)``, which drops per-snapshot state a module built on this one keeps (the
    searcher's unions) for table ``uri``'s snapshot keys that ``keep`` rejects; :class:`TableFiles` calls it
    when it releases superfiles (this module cannot import its users)."""
    _snapshot_state.append(drop)


@dataclass(frozen=True)
class _Pin:
    """A version :meth:`TableFiles.pinned` keeps live (its manifest names its superfiles)."""

    version: int
    path: str
    manifest: ManifestList


class Fanout(Protocol):
    """Where a query root sends the per-superfile work of a whole snapshot (``superfile.search.root``):
    scans and counts, and the searcher that plans a search and fans it out."""

    def scan_parts(self, snap: Snapshot, columns: list[str], where: Predicate | None) -> list[pa.Table]: ...

    def count(self, snap: Snapshot, where: Predicate) -> int: ...

    def searcher(self, snapshot: Snapshot) -> Any:
        """A ``superfile.table.search.Searcher`` for ``snapshot`` that runs its per-superfile work here."""
        ...


class TableFiles:
    """One table's storage, manifest store and open-superfile cache, shared by all its snapshots."""

    def __init__(
        self,
        storage: Storage,
        *,
        verify: bool = True,
        cache_dir: str | None = None,
        disk_cache: DiskCache | None = None,
        on_commit: Callable[[], None] | None = None,
        fanout: Fanout | None = None,
        name: str = "",
    ) -> None:
        self.name = name  # the table's name in its catalog (what a leaf request names)
        self.storage = storage
        self.fanout = fanout  # cache nodes that run the per-superfile work of reads (None: this process)
        self.on_commit = on_commit  # told after each version this process publishes (automatic maintenance)
        self.manifests = ManifestStore(storage)
        self.verify = verify
        self.cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self.disk_cache = disk_cache  # local copies of remote superfiles (None: each is read into memory)
        # superfiles open as local files (a property of the storage, not of a path: asked once, of its pointer)
        self._local = storage.local_path(POINTER) is not None
        self._readers = open_readers()  # shared by every table of the process: one budget
        self._owner = next(_owners)  # this table's keys in it: (owner, path)
        weakref.finalize(self, _gone.add, self._owner)
        self._pins = threading.Lock()
        self._recent: tuple[_Pin, ...] = ()  # the two newest versions pinned, newest last (see :meth:`pinned`)
        # the snapshots alive, by id (a snapshot is not hashable): their parts stay decoded (see :meth:`pinned`)
        self._live: weakref.WeakValueDictionary[int, Snapshot] = weakref.WeakValueDictionary()

    def pinned(self, snapshot: Snapshot) -> None:
        """Note a snapshot being made; one of a version newer than any before releases what this process holds
        of the superfiles the version it pushes out of the two newest named and neither of them names
        (:meth:`release`), the deletion vectors only it named, the decoded manifest parts no kept version and no
        live snapshot names, and the search state of every other snapshot.

        Two versions, not one: a search that pinned the previous version just before the commit is still
        reading its superfiles. Any older snapshot (a time-travel handle, a long search) still works: a released
        reader stays open for whoever holds it, and one asked for again is reopened while the file exists (its
        readers are left to the budget, and to an optimize or cleanup naming them). Commits that remove no
        superfile change few manifest parts: comparing parts first, they cost no listing of superfiles."""
        with self._pins:
            self._live[id(snapshot)] = snapshot
            if self._recent and snapshot.version <= self._recent[-1].version:
                return
            out = self._recent[0] if len(self._recent) == 2 else None
            self._recent = (*self._recent[-1:], _Pin(snapshot.version, snapshot.path, snapshot.manifest))
            gone: dict[str, int | None] = {}
            if out is not None:
                gone, deletes = self._unnamed(out, self._recent)
                manifests = [pin.manifest for pin in self._recent] + [s.manifest for s in list(self._live.values())]
                self.manifests.retain_parts({part.path for m in manifests for part in m.parts})
                self.manifests.release_deletes(deletes)
            self._release(gone, {p.path for p in self._recent})

    def release(self, paths: Collection[str] | Mapping[str, SuperfileEntry]) -> None:
        """Release what this process holds of ``paths``, superfiles the newest version no longer names (those an
        optimize replaced, a cleanup deleted): their readers, analyses, disk-cache copies (also those no
        reader has open) and, given their entries, full-text extractions, and the search state of every snapshot
        but the newest."""
        gone = {p: e.footer_crc32 for p, e in paths.items()} if isinstance(paths, Mapping) else dict.fromkeys(paths)
        with self._pins:
            self._release(gone, {self._recent[-1].path} if self._recent else set())
        if self.disk_cache is not None:
            for path in gone:
                self.disk_cache.discard(self.storage, path)

    def _unnamed(self, out: _Pin, kept: Sequence[_Pin]) -> tuple[dict[str, int | None], set[str]]:
        """What ``out`` names and none of ``kept`` does: its superfiles (with their footer checksums) and its
        deletion vectors, read only from the parts they do not share."""
        shared = {part.path for pin in kept for part in pin.manifest.parts}
        entries = [e for part in out.manifest.parts if part.path not in shared for e in self._entries(out, part)]
        gone: dict[str, int | None] = {e.path: e.footer_crc32 for e in entries}
        deletes = {e.deletes.path for e in entries if e.deletes is not None}
        if gone or deletes:
            old = {part.path for part in out.manifest.parts}
            for pin in kept:
                for part in pin.manifest.parts:
                    if part.path not in old:
                        for e in self._entries(pin, part):
                            gone.pop(e.path, None)
                            if e.deletes is not None:
                                deletes.discard(e.deletes.path)
        return gone, deletes

    def _entries(self, pin: _Pin, part: PartRef) -> list[SuperfileEntry]:
        return self.manifests.load_part(part, pin.manifest.schema)

    def _release(self, gone: Mapping[str, int | None], snapshots: Collection[str]) -> None:
        """Drop the search state of the snapshots not of ``snapshots`` (manifest paths), and the readers,
        analyses and disk-cache copies of the superfiles ``gone``; their full-text extractions (those whose
        footer checksum is given) go after a grace period (``archive.remove_later``). Dropping never closes:
        whoever still holds a reader or an index keeps a working one (a mapping lives until its last holder
        lets go)."""
        uri = self.storage.uri
        for drop in _snapshot_state:
            drop(uri, lambda key: key.split("#", 1)[0] in snapshots)
        if not gone:
            return
        archive.remove_later(
            extraction_dir(self.cache_dir, self.reader_name(path), crc) for path, crc in gone.items() if crc is not None
        )
        exact.release(uri, lambda path: path not in gone)
        dropped = {(self._owner, path) for path in gone}
        held = [k for k in self._readers if k in dropped]
        if not held:
            return
        self._readers.discard(lambda key: key not in dropped)
        if self.disk_cache is not None:
            for _, path in held:
                self.disk_cache.discard(self.storage, path)

    def reader_name(self, path: str) -> str:
        """The name a reader of the superfile at ``path`` goes by (in errors, and its extractions')."""
        return f"{self.storage.uri.rstrip('/')}/{path}"

    def open(self, entry: SuperfileEntry) -> SuperfileReader:
        key = (self._owner, entry.path)

        def opened(
            source: str | bytes | pa.Buffer, ensure: Callable[[int, int], None] | None = None, verify: bool = True
        ) -> SuperfileReader:
            reader = SuperfileReader.open(
                source,
                name=self.reader_name(entry.path),
                verify=self.verify and verify,
                cache_dir=self.cache_dir,
                expected_footer_crc32=entry.footer_crc32,
                ensure=ensure,
                handles=2 if isinstance(source, pa.Buffer) else None,  # a disk-cache copy: an mmap and its fd
            )
            reader.on_grow = functools.partial(self._readers.charge, key)  # no cycle: freed once evicted and unused
            return reader

        def from_copy(cache: DiskCache) -> SuperfileReader:
            """A reader of a whole local copy, checked whole only the first time this process opens it (the
            footer, against the manifest, every time: ``DiskCache.verified``)."""
            local, mapped = cache.open(self.storage, entry.path, entry.size)
            check = self.verify and not cache.verified(local)
            reader = opened(mapped, verify=check)
            if check:
                cache.mark_verified(local)
            return reader

        def load() -> SuperfileReader:
            local = self.storage.local_path(entry.path)
            if local is not None:
                return opened(local)
            if self.disk_cache is None:
                return opened(self.storage.read(entry.path))
            cache = self.disk_cache
            try:
                if not self.verify and not cache.resident(self.storage, entry.path):
                    # nothing to check whole: read the ranges a query needs while the copy downloads
                    return opened(*cache.open_filling(self.storage, entry.path, entry.size))
                try:
                    return from_copy(cache)
                except CorruptSuperfileError:  # a damaged local copy: fetch it once more (the object may be fine)
                    cache.discard(self.storage, entry.path)
                    return from_copy(cache)
            except OSError as e:  # the cache directory cannot take it (full, removed): read it as without a cache
                log.warning("disk cache %s: %s; reading %s into memory", cache.directory, e, entry.path)
                return opened(self.storage.read(entry.path))

        def load_or_name_missing() -> SuperfileReader:
            _drop_gone(self._readers)
            try:
                return load()
            except (FileNotFoundError, ObjectNotFoundError):
                raise SuperfileMissingError(entry.path, table=self.storage.uri) from None

        reader, loaded = self._readers.get_or_load(key, load_or_name_missing)
        if not loaded and self.disk_cache is not None:
            self.disk_cache.touch(self.storage, entry.path)
        return reader

    def cache_residency(self, entries: Callable[[], Sequence[SuperfileEntry]]) -> dict[str, int]:
        """How many of the ``entries()`` (and how many of their bytes) have a copy in the disk cache; without a
        cache, zeros and no call (listing the entries may fetch the lazy parts of a manifest)."""
        cache = self.disk_cache
        resident = [e for e in entries() if cache.resident(self.storage, e.path)] if cache is not None else []
        return {"resident_superfiles": len(resident), "resident_bytes": sum(e.size for e in resident)}

    def is_open(self, entry: SuperfileEntry) -> bool:
        return (self._owner, entry.path) in self._readers

    def _estimate(self, entry: SuperfileEntry) -> tuple[int, int]:
        """What opening ``entry`` will hold (``SuperfileReader.held``), from the manifest alone, before its
        indexes are opened, as :meth:`open` will open it: a local file past ``READ_WHOLE_BYTES`` is mapped (a
        handle), a disk-cache copy too (2: its mapping and descriptor), anything else is read into memory and
        charged its size; the footer taken as half a small file's size, at most 64 KiB."""
        footer = min(entry.size // 2, 64 * 1024)
        handles = int(entry.size > READ_WHOLE_BYTES) if self._local else (2 if self.disk_cache is not None else 0)
        return (0 if handles else entry.size) + READER_OVERHEAD + FOOTER_FACTOR * footer, handles

    def batches(self, entries: Sequence[SuperfileEntry]) -> list[Sequence[SuperfileEntry]]:
        """``entries`` in runs whose readers (estimated from the manifest) fit half of each budget: what one
        pass can open and use before the budget evicts them (a run holds one entry at least)."""
        limits = [limit // 2 for limit in self._readers.limits]
        runs: list[Sequence[SuperfileEntry]] = []
        start, used = 0, [0] * len(limits)
        for i, entry in enumerate(entries):
            weight = self._estimate(entry)
            if i > start and any(u + w > lim for u, w, lim in zip(used, weight, limits, strict=True)):
                runs.append(entries[start:i])
                start, used = i, [0] * len(limits)
            used = [u + w for u, w in zip(used, weight, strict=True)]
        if start < len(entries):
            runs.append(entries[start:])
        return runs


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of one table version. Every read of one call goes through one snapshot."""

    files: TableFiles
    path: str
    manifest: ManifestList
    only: frozenset[str] | None = None  # a leaf's share: the superfiles it searches (None: all)

    def restricted(self, paths: Sequence[str]) -> Snapshot:
        """The same version over only ``paths`` of its superfiles: what one leaf of a fan-out searches."""
        return replace(self, only=frozenset(paths))

    @property
    def key(self) -> str:
        """Names this view in caches of per-snapshot state: the manifest, and the share of a restricted one."""
        if self.only is None:
            return self.path
        digest = hashlib.blake2b("\x00".join(sorted(self.only)).encode(), digest_size=8).hexdigest()
        return f"{self.path}#{digest}"

    @property
    def fanout(self) -> Fanout | None:
        """The cache nodes this snapshot's reads fan out to (None on a leaf's share, or without any)."""
        return self.files.fanout if self.only is None else None

    def __post_init__(self) -> None:
        parts = self.manifest.parts
        if 1 < len(parts) <= self.manifest.options.manifest_eager_max_parts:
            self.map(lambda p: self.files.manifests.load_part(p, self.schema), parts)  # eager, in parallel
        self.files.pinned(self)

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def schema(self) -> pa.Schema:
        return self.manifest.schema

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Run ``fn`` over ``items`` on the query pool (inline for a single item)."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        return list(query_pool().map(fn, items))

    def each(self, fn: Callable[[SuperfileEntry], R], entries: Sequence[SuperfileEntry]) -> list[R]:
        """Run a per-superfile search kernel over ``entries`` on this thread, after opening the cold ones in
        parallel on the query pool.

        Opening (fetching, mapping, checking a superfile) is I/O and gains from the pool. Most kernels hold
        the GIL most of the time, so on the pool they mostly wait for each other: measured on 2 cores over 16
        superfiles of 62,500 rows, BM25 took 17.3 ms (24.5 ms of CPU) per query on the pool against 12.0 ms
        (12.6 ms of CPU) here, and vector search (nprobe 8) 9.1-10.7 ms against 5.7-6.6 ms. Kernels that spend
        their time in native code without the GIL use :meth:`map` instead. Queries from several client threads
        run in parallel with each other either way.

        Over more superfiles than the open budgets hold (``open_readers``), it goes run by run, each run
        opened and used before the next is, so a reader is not opened, evicted and opened again.
        """
        out: list[R] = []
        for run in self.files.batches(entries):
            cold = [e for e in run if not self.files.is_open(e)]
            if len(cold) > 1:
                self.map(self.files.open, cold)
            out.extend(fn(e) for e in run)
        return out

    def parts(self, where: Predicate | None = None) -> list[PartRef]:
        return [p for p in self.manifest.parts if p.live_rows and (where is None or where.might_match(p.stats))]

    def entries(self, where: Predicate | None = None) -> list[SuperfileEntry]:
        """Superfile entries the predicate may match: whole parts are pruned first, loading only the rest. Kept
        per predicate (and for none): checking 16 superfiles' statistics cost ~0.06 ms of a 0.5 ms filtered
        search, and listing them ~10 us of every search."""
        key = ("entries", None if where is None else str(where))
        return list(self._memos.get_or_load(key, lambda: self._entries(where))[0])

    def memo(self, key: Hashable) -> dict[Any, Any]:
        """A dict for values derived from this snapshot under ``key`` (a search's filter: each superfile's allowed
        rows), kept for the recent keys and shared by the snapshot's searches: a dict's reads and writes are
        atomic, and a value two searches compute at once is the same."""
        memo: dict[Any, Any] = self._memos.get_or_load(("memo", key), dict)[0]
        return memo

    @cached_property
    def _memos(self) -> LRU:
        """What recent reads resolved against this snapshot (by predicate text: its schema is fixed)."""
        return LRU(64)

    def _entries(self, where: Predicate | None) -> list[SuperfileEntry]:
        out: list[SuperfileEntry] = []
        text = text_pruner(where, self.manifest.options.fts_columns) if where is not None else None
        for part_entries in self.map(lambda p: self.files.manifests.load_part(p, self.schema), self.parts(where)):
            out.extend(
                e
                for e in part_entries
                if e.live_rows
                and (self.only is None or e.path in self.only)
                and (where is None or (where.might_match(e.stats) and (text is None or text(e))))
            )
        return out

    def deleted(self, entry: SuperfileEntry) -> pyroaring.AbstractBitMap:
        if entry.deletes is None:
            return pyroaring.FrozenBitMap()
        return self.files.manifests.load_deletes(entry.deletes.path)

    def live_offsets(self, entry: SuperfileEntry) -> np.ndarray:
        deleted = self.deleted(entry)
        if not len(deleted):
            return np.arange(entry.rows, dtype=np.int64)
        return offsets_of(pyroaring.BitMap(deleted).flip(0, entry.rows))

    def open(self, entry: SuperfileEntry) -> FileColumns:
        """One superfile's columns and indexes as this snapshot's schema sees them (``table/columns.py``)."""
        return FileColumns(self.files.open(entry), entry, self.schema, self.manifest.options)

    @cached_property
    def plain_schema(self) -> pa.Schema:
        """The schema results carry: the table's, without its field ids and defaults."""
        return plain(self.schema)

    @cached_property
    def schema_key(self) -> str:
        """Names this snapshot's schema in caches of what was resolved against it (a changed schema must not
        reuse their entries)."""
        return hashlib.blake2b(self.schema.to_string().encode(), digest_size=8).hexdigest()

    def predicate(self, where: str | None) -> Predicate | None:
        """``where`` parsed and type-checked against this snapshot's schema (None for no filter), kept for the next
        search with the same filter: parsing costs ~65 us, a tenth of a selective filtered search (bad input
        raises each time)."""
        if where is None:
            return None
        return _predicates.get_or_load((self.schema_key, where), lambda: parse_predicate(where, self.schema))[0]

    def matching_offsets(self, entry: SuperfileEntry, where: Predicate | None) -> np.ndarray:
        """Row offsets of live rows of one superfile that satisfy ``where``.

        When the superfile's indexes bound the predicate, only the candidate
        rows are decoded and re-checked; otherwise the predicate's columns are scanned.
        """
        if where is None:
            return self.live_offsets(entry)
        reader = self.open(entry)
        deleted = self.deleted(entry)
        bound = candidate_rows(where, reader, reader.text_indexed(list(self.manifest.options.fts_columns)))
        if bound is not None:
            candidates, exact = bound
            rows = offsets_of(candidates - deleted if len(deleted) else candidates)
            if exact or not len(rows):
                return rows  # the indexes answered the predicate: nothing to decode
            checked = where.evaluate(reader.read(sorted(where.columns), rows=rows))
            return rows[np.asarray(checked.to_numpy(zero_copy_only=False), dtype=bool)]
        mask = np.asarray(where.evaluate(reader.read(sorted(where.columns))).to_numpy(zero_copy_only=False), bool)
        if len(deleted):
            mask[offsets_of(deleted)] = False
        return np.flatnonzero(mask)

    def read_rows(self, entry: SuperfileEntry, offsets: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """The given rows of one superfile: Parquet columns decoded, vectors from their blob, columns the file
        lacks filled, all as this snapshot's schema has them."""
        # a few rows (a top-k's): decoding them on this thread beats handing the row groups to Arrow's pool
        return self.open(entry).read(columns, rows=offsets, use_threads=len(offsets) > _FEW_ROWS)

    def matching_rows(
        self, entry: SuperfileEntry, columns: Sequence[str], where: Predicate | None
    ) -> tuple[np.ndarray | None, Predicate | None]:
        """What :meth:`read_matching` reads of one superfile: the row offsets (None: every row) and what is left
        of ``where`` to evaluate on them (None: nothing).

        The superfile's scalar / term indexes bound ``where`` when they can. When they answer it exactly it is
        not evaluated again, and when the candidates are few (or no Parquet column is needed: ``_id`` comes
        from the raw id section) only those rows are read."""
        if where is None:
            return None, None
        reader = self.open(entry)
        bound = candidate_rows(where, reader, reader.text_indexed(list(self.manifest.options.fts_columns)))
        if bound is None:
            return None, where
        candidates, exact = bound
        decodes = not exact or any(c != ID and not reader.in_blob(c) for c in columns)
        if decodes and len(candidates) > entry.rows * INDEXED_FRACTION:
            return None, where
        deleted = self.deleted(entry)
        rows = offsets_of(candidates - deleted if len(deleted) else candidates)
        return rows, None if exact else where  # exact: the indexes answered it, the candidates are the matches

    def read_matching(
        self,
        entry: SuperfileEntry,
        columns: Sequence[str],
        where: Predicate | None,
        *,
        use_threads: bool = True,
        planned: tuple[np.ndarray | None, Predicate | None] | None = None,
    ) -> pa.Table:
        """Live rows of one superfile that satisfy ``where``, in row order, with ``columns`` typed as the schema.

        Only the rows :meth:`matching_rows` bounds (``planned``, when the caller has it) are read. Without
        such a bound, the needed columns and the predicate's are decoded once, whole, and deleted rows and
        rows failing ``where`` dropped by one mask. ``use_threads``: decode with Arrow's threads (off when the
        caller reads several superfiles in parallel already).
        """
        reader = self.open(entry)
        deleted = self.deleted(entry)
        blob = {c for c in columns if reader.in_blob(c)}  # vectors: decoded for the rows kept only
        scalar = [c for c in columns if c not in blob]
        rows, check = self.matching_rows(entry, columns, where) if planned is None else planned
        fields = [self.plain_schema.field(c) for c in columns]
        if rows is not None and not len(rows):  # the indexes rule out every row: nothing to decode
            return pa.schema(fields).empty_table()
        need = list(dict.fromkeys([*scalar, *(sorted(check.columns) if check is not None else ())]))
        # a few rows, as read_rows: on this thread (Arrow's pool cost ~0.1 ms more for one row of two columns)
        table = _read_columns(reader, need, rows, use_threads and (rows is None or len(rows) > _FEW_ROWS))
        keep: np.ndarray | None = None
        if rows is None and len(deleted):
            keep = np.ones(table.num_rows, dtype=bool)
            keep[offsets_of(deleted)] = False
        if check is not None:
            mask = np.asarray(check.evaluate(table).to_numpy(zero_copy_only=False), dtype=bool)
            keep = mask if keep is None else keep & mask
        if keep is not None:
            table = table.filter(pa.array(keep))
            if blob:
                rows = np.flatnonzero(keep) if rows is None else rows[keep]
        arrays = [reader.vectors(c, rows) if c in blob else table.column(c) for c in columns]
        if all(a.type == f.type for a, f in zip(arrays, fields, strict=True)):
            return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        return pa.Table.from_arrays(arrays, names=list(columns)).cast(pa.schema(fields))

    def scan_parts(self, columns: Sequence[str], where: Predicate | None = None) -> list[pa.Table]:
        """Every live row matching ``where``: one table per superfile that has some, in ``_id`` order of
        superfiles (rows of one file stay in order), read in parallel (on the cache nodes, with a fan-out)."""
        if self.fanout is not None:
            return self.fanout.scan_parts(self, list(columns), where)
        return [t for _, t in self.scan_named(columns, where)]

    def scan_named(self, columns: Sequence[str], where: Predicate | None = None) -> list[tuple[str, pa.Table]]:
        """:meth:`scan_parts` here, each table with the path of its superfile (a leaf's answer to a root)."""
        entries = sorted(self.entries(where), key=lambda e: (e.id_min, e.path))
        plans = self.each(lambda e: self.matching_rows(e, columns, where), entries)  # the indexes' look-ups
        picked = [rows for rows, _ in plans if rows is not None]
        if len(picked) == len(plans) and sum(len(rows) for rows in picked) <= _INLINE_ROWS:
            # a few rows picked by the indexes: read on this thread, where the pool's hand-offs cost more than
            # the reads (docs/design.md, "Row-level indexes for WHERE")
            tables = [
                self.read_matching(e, columns, where, use_threads=False, planned=p)
                for e, p in zip(entries, plans, strict=True)
            ]
        else:
            threads = len(entries) < query_threads()  # else one superfile per worker keeps every core busy

            def one(planned: tuple[SuperfileEntry, tuple[np.ndarray | None, Predicate | None]]) -> pa.Table:
                return self.read_matching(planned[0], columns, where, use_threads=threads, planned=planned[1])

            tables = self.map(one, list(zip(entries, plans, strict=True)))
        return [(e.path, t) for e, t in zip(entries, tables, strict=True) if t.num_rows]

    def scan(self, columns: Sequence[str] | None = None, where: Predicate | None = None) -> pa.Table:
        """Every live row matching ``where``, in ``_id`` order of superfiles (rows of one file stay in order)."""
        cols = list(columns) if columns is not None else list(self.schema.names)
        tables = self.scan_parts(cols, where)
        target = pa.schema([self.plain_schema.field(c) for c in cols])
        return pa.concat_tables(tables).combine_chunks() if tables else target.empty_table()

    def count(self, where: Predicate | None = None) -> int:
        if where is None and self.only is None:
            return self.manifest.rows
        if where is not None and self.fanout is not None:
            return self.fanout.count(self, where)
        return sum(self.map(lambda e: len(self.matching_offsets(e, where)), self.entries(where)))

    def ids(self, entry: SuperfileEntry, offsets: np.ndarray) -> np.ndarray:
        return np.array(self.files.open(entry).ids(offsets), dtype=np.uint64)  # the raw id section: no decode
