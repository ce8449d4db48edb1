"""The Supertable handle: synchronous reads and writes over a table's snapshots."""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from superfile.api import Table
from superfile.commit import idempotency as _idempotency
from superfile.commit.publish import Change, publish
from superfile.commit.requirements import Requirement
from superfile.errors import (
    InvalidOptionError,
    InvalidVectorError,
    ObjectNotFoundError,
    ReadOnlyTableError,
    SchemaMismatchError,
    UnknownColumnError,
    VersionNotFoundError,
)
from superfile.manifest.log import full_history, oldest_retained
from superfile.manifest.model import HistoryEntry, ManifestList, Pointer
from superfile.options import TableOptions
from superfile.schema import coerce
from superfile.search.request import SearchRequest
from superfile.table import changes as _changes
from superfile.table import cleanup as _cleanup
from superfile.table import evolve as _evolve
from superfile.table import history as _history
from superfile.table import optimize as _optimize
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot, TableFiles
from superfile.table.writer import Transaction
from superfile.validate import DEFAULT_RETENTION, check_key, check_version, to_ms

__all__ = ["Supertable", "Transaction"]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Supertable(Table):
    """A table of many immutable superfiles. Obtain one from a Connection.

    Each call reads one snapshot chosen by the table's consistency policy
    (``strong``: the latest commit; ``bounded``: at most ``max_staleness_s``
    old; ``snapshot``: the version the handle opened, advanced only by its own
    writes). A handle opened at an explicit version is read-only.
    """

    def __init__(
        self,
        name: str,
        files: TableFiles,
        snapshot: Snapshot,
        *,
        pinned: bool = False,
        consistency: str | None = None,
    ) -> None:
        self.name = name
        self._files = files
        self._snapshot = snapshot
        self._pinned = pinned
        self._consistency = consistency or snapshot.manifest.options.consistency
        self._checked = time.monotonic()
        self._newest: Snapshot | None = None  # the last snapshot newest() loaded, for a read that meets it first
        self._lock = threading.Lock()

    # -- snapshots ----------------------------------------------------------------
    def _current(self) -> Snapshot:
        """The snapshot this read uses, refreshed as the consistency policy says."""
        if self.consistency == "snapshot":
            return self._snapshot
        if self._consistency == "bounded":
            staleness = self._snapshot.manifest.options.max_staleness_s
            if time.monotonic() - self._checked < staleness:
                return self._snapshot
        return self._refresh()

    def snapshot(self) -> Snapshot:
        """The snapshot a read would use now (its manifest path, entries and schema): a query root pins it."""
        return self._current()

    def _refresh(self) -> Snapshot:
        return self._refresh_with_pointer()[0]

    def _refresh_with_pointer(self) -> tuple[Snapshot, tuple[Pointer, str]]:
        pointer, etag = self._files.manifests.read_pointer()
        with self._lock:
            self._checked = time.monotonic()
            if pointer.manifest != self._snapshot.path and pointer.version >= self._snapshot.version:
                self._snapshot = self._at(pointer.manifest)
            snapshot = self._snapshot
        if snapshot.path != pointer.manifest:  # a newer commit of our own raced ahead of this read
            snapshot = self._at(pointer.manifest)
        return snapshot, (pointer, etag)

    def _at(self, path: str) -> Snapshot:
        """The snapshot of manifest ``path``: this handle's, the one :meth:`newest` loaded, or loaded now."""
        for known in (self._snapshot, self._newest):
            if known is not None and known.path == path:
                return known
        return Snapshot(self._files, path, self._files.manifests.load_list(path))

    # -- seams for the table's own modules (writer, optimize, history, cleanup) and the services ----------
    @property
    def consistency(self) -> str:
        """How this handle picks the snapshot a read uses: ``strong``, ``bounded`` or ``snapshot``."""
        return "snapshot" if self._pinned else self._consistency

    def newest(self) -> tuple[Snapshot, float]:
        """The snapshot this handle's reads will move to, and when that was known (``time.monotonic()``),
        without moving the handle: the latest commit (one pointer read), or for a handle that does not follow
        commits (pinned, or ``snapshot`` consistency) its own. A serving process opens what the snapshot's
        searches need, then has the handle :meth:`serve` it, so that a ``bounded`` read is served a snapshot
        already warm, as a search engine serves its last refreshed reader (``docs/design.md``, "Snapshots and
        consistency")."""
        checked = time.monotonic()
        if self.consistency == "snapshot":
            return self._snapshot, checked
        pointer, _ = self._files.manifests.read_pointer()
        snapshot = self._at(pointer.manifest)  # loaded outside the lock: reads go on meanwhile
        with self._lock:
            if snapshot is not self._snapshot:
                self._newest = snapshot
        return snapshot, checked

    def serve(self, snapshot: Snapshot, checked: float) -> None:
        """Serve ``snapshot``, the latest at ``checked`` (from :meth:`newest`), unless this handle is already
        past it (its own commit, or a read that refreshed meanwhile). Either way the handle's snapshot is at
        least as new as the latest at ``checked``, so a ``bounded`` read may count its staleness from then."""
        if self.consistency == "snapshot":
            return
        with self._lock:
            if snapshot.version > self._snapshot.version:
                self._snapshot = snapshot
            self._checked = max(self._checked, checked)
            if self._newest is not None and self._newest.version <= self._snapshot.version:
                self._newest = None

    @property
    def files(self) -> TableFiles:
        """The table's storage, manifest store and superfile readers."""
        return self._files

    @property
    def pinned(self) -> bool:
        """Whether the handle is open at an explicit version (read-only)."""
        return self._pinned

    @property
    def last_snapshot(self) -> Snapshot:
        """The snapshot this handle last read or committed, without reading storage (a builder's own commits
        advance it; another writer's only on the next read)."""
        return self._snapshot

    def writable_snapshot(self) -> tuple[Snapshot, tuple[Pointer, str]]:
        """The latest snapshot and the pointer (with its etag) a writer's first publish attempt is guarded by."""
        if self._pinned:
            raise ReadOnlyTableError(
                f"table {self.name!r} is open at version {self._snapshot.version}; open it without a version to write"
            )
        return self._refresh_with_pointer()

    def commit(self, change: Change, *, base: tuple[Pointer, str] | None = None) -> tuple[str, ManifestList]:
        """Publish ``change`` as the next version (guarded by ``base``, the pointer it was staged against) and
        advance this handle to it; the one way the table's writers commit a ``Change``."""
        path, manifest = publish(
            self._files.manifests, change, max_attempts=self.options.commit_max_attempts, base=base
        )
        self.advance(path, manifest)
        return path, manifest

    def coerce(self, data: Any) -> pa.Table:
        """``data`` checked and converted as this table stores rows (``superfile.schema.coerce``), against the
        schema this handle last read, or, for rows that need it, against the table's latest: what a service
        validating writes for another process (the gateway in suite mode, a builder) checks rows with, so a
        schema change made elsewhere is taken as soon as rows use it."""
        tried = self._snapshot
        try:
            return coerce(data, tried.schema, tried.manifest.options)
        except SchemaMismatchError:
            latest = self._current() if not self._pinned else tried
            if latest.schema.equals(tried.schema, check_metadata=True):
                raise
            return coerce(data, latest.schema, latest.manifest.options)

    def advance(self, path: str, manifest: ManifestList) -> None:
        """Move this handle to a version it published (a restore publishes a whole manifest, not a change)."""
        with self._lock:
            if manifest.version > self._snapshot.version:
                self._snapshot = Snapshot(self._files, path, manifest)
        if self._files.on_commit is not None:
            self._files.on_commit()

    def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> Supertable:
        """A read-only handle on an earlier version (while it is retained), or on the version that was
        current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds)."""
        if (version is None) == (as_of is None):
            raise InvalidOptionError("give exactly one of version and as_of")
        entry = self.history_entry(check_version(version)) if version is not None else self._entry_as_of(as_of)
        try:
            manifest = self._files.manifests.load_list(entry.manifest)
        except ObjectNotFoundError:
            raise VersionNotFoundError(f"table {self.name!r} version {entry.version} is no longer retained") from None
        return Supertable(self.name, self._files, Snapshot(self._files, entry.manifest, manifest), pinned=True)

    def is_retained(self) -> bool:
        """Whether this handle's version is still retained: a cleanup (in this process or another) may have
        expired a past version since its handle was opened. One small read of storage."""
        return self.version >= oldest_retained(self._files.storage)

    def _retained_history(self) -> tuple[HistoryEntry, ...]:
        storage = self._files.storage
        oldest = oldest_retained(storage)
        return tuple(h for h in full_history(storage, self._refresh_for_history().manifest) if h.version >= oldest)

    def history_entry(self, version: int) -> HistoryEntry:
        """The retained history entry of ``version`` (VersionNotFoundError past retention)."""
        manifest = self._refresh_for_history().manifest
        tail = manifest.history_tail
        if tail[0].version <= version <= tail[-1].version and version >= oldest_retained(self._files.storage):
            return tail[version - tail[0].version]  # recent: no segment to read
        history = self._retained_history()
        for h in history:
            if h.version == version:
                return h
        raise VersionNotFoundError(
            f"table {self.name!r} has no retained version {version} "
            f"(versions {history[0].version}..{history[-1].version})"
        )

    def _entry_as_of(self, as_of: datetime.datetime | int | float | None) -> HistoryEntry:
        assert as_of is not None
        ms = to_ms(as_of)
        history = self._retained_history()
        earlier = [h for h in history if h.timestamp_ms <= ms]
        if not earlier:  # before the table existed, or before the oldest retained version
            raise VersionNotFoundError(f"table {self.name!r} has no retained version as of {as_of!r}")
        return earlier[-1]

    def _refresh_for_history(self) -> Snapshot:
        return self._snapshot if self._pinned else self._refresh()

    # -- metadata -----------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version reads see now: refreshed as the consistency policy says (a pinned handle: its own)."""
        return self._current().version

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema, ``_id`` first."""
        return self._snapshot.schema

    @property
    def options(self) -> TableOptions:
        """What the table was created with: full-text and vector columns, partitioning, consistency."""
        return self._snapshot.manifest.options

    @property
    def properties(self) -> dict[str, Any]:
        """Properties commits recorded (e.g. the event-log offsets a builder applied), as of the current snapshot."""
        return dict(self._current().manifest.properties)

    def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if none retained does): lets a log
        consumer skip one keyed event without making its whole transaction a no-op."""
        key = check_key(idempotency_key)
        return _idempotency.committed_version(self._files.storage, self._current().manifest.properties, [key])

    def stats(self) -> dict[str, Any]:
        """Snapshot facts from the manifest alone (no superfile bytes read), plus process memory and, on remote
        storage, how much of the table the disk cache holds (which lists every superfile: a lazy manifest's
        parts are fetched)."""
        snap = self._current()
        m = snap.manifest
        return {
            "name": self.name,
            "version": m.version,
            "manifest_id": snap.path,
            "superfile_count": m.superfile_count,
            "row_count": m.rows,
            "deleted_rows": sum(p.rows - p.live_rows for p in m.parts),
            "manifest_parts": len(m.parts),
            "manifest_parts_fetched": self._files.manifests.parts_fetched,
            "unindexed_superfiles": self._unindexed(snap),
            "resident_memory_bytes": _rss_bytes(),
            "cache_budget_bytes": self._files.disk_cache.budget_bytes if self._files.disk_cache else 0,
            **{f"cache_{k}": v for k, v in self._files.cache_residency(snap.entries).items()},
        }

    def versions(self) -> list[dict[str, Any]]:
        """Every retained version: number, time, operation and row counts."""
        return [
            {
                "version": h.version,
                "timestamp_ms": h.timestamp_ms,
                "operation": h.operation,
                "rows_added": h.rows_added,
                "rows_deleted": h.rows_deleted,
                "row_count": h.row_count,
            }
            for h in self._retained_history()
        ]

    def _unindexed(self, snap: Snapshot) -> int:
        """Superfiles still without an index created after they were written (0 once the background rewrite
        is done); counted only on tables with full-text or vector columns."""
        options = snap.manifest.options
        if not options.fts_columns and not options.vector_columns:
            return 0
        return sum(1 for e in snap.entries() if _optimize.unindexed(e, options))

    # -- reads --------------------------------------------------------------------
    def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """Every live row (optionally filtered and projected), vectors included."""
        snap = self._current()
        if columns is not None:
            unknown = [c for c in columns if c not in snap.schema.names]
            if unknown:
                raise UnknownColumnError(f"unknown columns {unknown}; the table has {snap.schema.names}")
        predicate = snap.predicate(where)
        return snap.scan(columns, predicate)

    def count_rows(self, where: str | None = None) -> int:
        """How many rows (match ``where``); without a predicate the manifest's count, no superfile opened."""
        snap = self._current()
        return snap.count(snap.predicate(where))

    # -- search -------------------------------------------------------------------
    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search on the current snapshot (the keyword methods of :class:`superfile.api.Table`
        build the request): in this process, or fanned out to cache nodes on a query service."""
        return Searcher.of(self._current()).search(request)

    # -- writes -------------------------------------------------------------------
    def transaction(self, *, requires: Iterable[Requirement] = ()) -> Transaction:
        """Stage several writes into one commit: ``with table.transaction() as tx: ...``.
        ``requires``: requirement values (``superfile.commit.requirements``, e.g. ``AssertVersion``) checked
        against the manifest each publish attempt builds on; one that fails aborts the commit
        (``RequirementFailedError``)."""
        return Transaction(self, requires)

    def append(self, data: Any, *, idempotency_key: str | None = None) -> int:
        """Add rows; returns the new version (the current one if ``data`` is empty). A repeated
        ``idempotency_key`` adds nothing and returns the version that committed it first."""
        with self.transaction() as tx:
            tx.append(data, idempotency_key=idempotency_key)
        assert tx.commit_version is not None
        return tx.commit_version

    def delete(self, where: str, *, idempotency_key: str | None = None) -> int:
        """Delete every row matching the SQL predicate; returns the new version. The predicate is resolved
        on the current snapshot; rows a concurrent commit moved meanwhile (``optimize``) are followed.
        A repeated ``idempotency_key`` deletes nothing and returns the version that committed it."""
        with self.transaction() as tx:
            tx.delete(where, idempotency_key=idempotency_key)
        assert tx.commit_version is not None
        return tx.commit_version

    def update(self, where: str, data: Any, *, idempotency_key: str | None = None) -> int:
        """Replace the rows matching ``where`` 1:1 (in ``_id`` order) by ``data``, keeping their ``_id``.
        A repeated ``idempotency_key`` changes nothing and returns the version that committed it."""
        with self.transaction() as tx:
            tx.update(where, data, idempotency_key=idempotency_key)
        assert tx.commit_version is not None
        return tx.commit_version

    # -- maintenance and history ------------------------------------------------------
    def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Compact: merge small superfiles per partition into ones of about ``target_rows`` rows (default
        ``max_rows_per_superfile``; or sized from ``target_bytes``) and drop deleted rows. Safe to run
        while others write. Returns counts and the version published."""
        return _optimize.optimize(self, target_rows, target_bytes)

    def cleanup(
        self,
        older_than: datetime.timedelta | float = DEFAULT_RETENTION,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """Delete files no version of the last ``older_than`` (a timedelta or seconds) needs; returns
        files and bytes removed. Versions older than the window can no longer be opened. Unreferenced
        files younger than ``safety_margin`` (default: the window) are kept: commits still in flight
        wrote them, so the margin must exceed the longest commit."""
        return _cleanup.cleanup(self, older_than, dry_run=dry_run, safety_margin=safety_margin)

    def restore(self, version: int, *, idempotency_key: str | None = None) -> int:
        """Publish a retained version's contents as the newest version; returns the new version. A repeated
        ``idempotency_key`` publishes nothing and returns the version that committed it."""
        return _history.restore(self, version, idempotency_key)

    # -- schema evolution: each one commit, metadata only (``table/evolve.py``, docs/schema.md) ------------------
    def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """Add columns at the end: nullable, or not null with a value in ``defaults``, which rows written before
        (and appends that leave the column out) read. No superfile is rewritten. Returns the new version."""
        return _evolve.evolve(self, "add_columns", _evolve.add_columns(fields, defaults))

    def rename_column(self, old: str, new: str) -> int:
        """Rename a column; its indexes and partitioning follow. Older versions keep the old name."""
        return _evolve.evolve(self, "rename_column", _evolve.rename_column(old, new))

    def drop_columns(self, names: str | Sequence[str]) -> int:
        """Drop columns and their indexes (not ``_id``, not the partition column). Older versions still have
        them; their bytes go when ``optimize`` rewrites the superfiles."""
        return _evolve.evolve(self, "drop_columns", _evolve.drop_columns(names))

    def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """Widen a column's type (int8 -> int16 -> int32 -> int64, unsigned to wider, ints of up to 32 bits to
        float64, float32 -> float64, string -> large_string, ...); a change that could alter a value is a
        SchemaChangeError. Stored values are converted as they are read."""
        return _evolve.evolve(self, "alter_column_type", _evolve.alter_column_type(name, new_type))

    def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """Index a string column for full-text search. The index is part of the new version at once: searches
        use it in superfiles written from now on, and search the others exactly (same results) while a
        background rewrite builds it into them (``optimize`` does too)."""
        version = _evolve.evolve(self, "create_index", _evolve.create_fts_index(column, tokenizer))
        _evolve.index_in_background(self)
        return version

    def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """Index a not-null ``fixed_size_list<float32>[dim]`` column for vector search under ``metric`` (``index``:
        the index parameters, as ``vector_columns`` takes them). Built into existing superfiles in the
        background; until then they are searched exactly."""
        if metric == "cosine":
            self._no_zero_vectors(column)
        version = _evolve.evolve(self, "create_index", _evolve.create_vector_index(column, metric, index))
        _evolve.index_in_background(self)
        return version

    def drop_index(self, column: str) -> int:
        """Drop a column's full-text or vector index (the column stays)."""
        return _evolve.evolve(self, "drop_index", _evolve.drop_index(column))

    def _no_zero_vectors(self, column: str) -> None:
        """A cosine index cannot hold a zero vector: refuse it before committing, from the column's values."""
        snap = self._current()
        if column not in snap.schema.names or column in snap.manifest.options.vector_columns:
            return  # the plan names the error, or the column is indexed already
        values = snap.scan([column]).column(column)
        if values.null_count or not pa.types.is_fixed_size_list(values.type):
            return  # the plan refuses nullable and non-vector columns
        flat = np.asarray(pc.list_flatten(values).to_numpy(zero_copy_only=False), np.float32)
        zero = int(np.count_nonzero(~flat.reshape(len(values), -1).any(axis=1))) if len(values) else 0
        if zero:
            raise InvalidVectorError(f"column {column!r} holds {zero} zero vectors, which cosine cannot index")

    def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions (default to: the current one), with
        ``_change`` ("insert"/"delete") and ``_id``; an update shows as both. See ``table/changes.py``."""
        old = self.checkout(from_version).last_snapshot
        new = self.checkout(to_version).last_snapshot if to_version is not None else self._current()
        return _changes.changes(old, new, columns)

    def __repr__(self) -> str:
        return f"Supertable({self.name!r}, version={self._snapshot.version})"
