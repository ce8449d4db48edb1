"""The writer: stages appends, deletes and updates, then publishes them as one commit."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyroaring

from superfile.commit.build import build_shards
from superfile.commit.publish import Change, Deletion, publish
from superfile.commit.shard import shard
from superfile.commit.stage import WriteBuffer
from superfile.errors import InvalidInputError, SuperfileError
from superfile.expressions import Predicate, parse_predicate
from superfile.manifest.model import ManifestList, SuperfileEntry
from superfile.pools import build_pool
from superfile.schema import ID, coerce
from superfile.table.idempotency import PROPERTY as KEYS_PROPERTY
from superfile.table.idempotency import AlreadyCommitted, check_key, committed_version, record

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["Transaction"]


class Transaction:
    """Writes staged on one snapshot and published together: all visible after ``commit()`` or none.

    Deletes and updates resolve their predicate against the snapshot the
    transaction started from plus the rows it staged itself.
    """

    def __init__(self, table: Supertable, precondition: Callable[[ManifestList], None] | None = None) -> None:
        self._table = table
        # Checked against the manifest each publish attempt builds on; raising aborts the commit (log fencing).
        self._precondition = precondition
        self._base, self._base_pointer = table._writable_snapshot()
        self._schema = self._base.schema
        self._options = self._base.manifest.options
        self._buffer = WriteBuffer(self._schema)
        self._flushed: list[SuperfileEntry] = []
        self._deletions: dict[str, Deletion] = {}
        self._operations: list[str] = []
        self._properties: dict[str, Any] = {}
        self._keys: list[str] = []  # idempotency keys this commit records
        self._duplicate: int | None = None  # version that already committed one of the keys
        self._done = False
        self.commit_version: int | None = None  # set by commit()

    # -- staging ----------------------------------------------------------------
    def append(self, data: Any, idempotency_key: str | None = None) -> int:
        """Stage rows; returns how many. With ``idempotency_key``, the commit records the key, and if an
        earlier commit already did, this whole transaction is a no-op whose ``commit()`` returns that
        commit's version (see ``table/idempotency.py`` for the retention)."""
        self._check_open()
        if idempotency_key is not None:
            key = check_key(idempotency_key)
            done = committed_version(self._table._files.storage, self._base.manifest.properties, [key])
            if done is not None:
                self._duplicate = max(self._duplicate or 0, done)
                return 0
            self._keys.append(key)
        rows = coerce(data, self._schema, self._options)
        if rows.num_rows:
            self._stage(
                rows,
                self._table._files.manifests.reserve_ids(rows.num_rows, self._options.commit_max_attempts),
            )
            self._operations.append("append")
        return rows.num_rows

    def delete(self, where: str) -> int:
        """Stage the removal of every row matching ``where``; returns how many."""
        self._check_open()
        predicate = self._predicate(where)
        deleted = self._take_matches(predicate)
        self._operations.append("delete")
        return len(deleted)

    def update(self, where: str, data: Any) -> int:
        """Replace the rows matching ``where``, in ``_id`` order, by the rows of ``data`` (same count).
        The replaced rows keep their ``_id``."""
        self._check_open()
        predicate = self._predicate(where)
        rows = coerce(data, self._schema, self._options)
        count = self._base.count(predicate) + self._count_staged(predicate)
        if rows.num_rows != count:
            raise InvalidInputError(f"update matched {count} rows but {rows.num_rows} replacement rows were given")
        ids = np.sort(self._take_matches(predicate))
        self._buffer.add(rows.add_column(0, self._schema.field(ID), pa.array(ids, pa.uint64())))
        self._operations.append("update")
        return rows.num_rows

    def set_properties(self, **properties: Any) -> None:
        """Record table properties (e.g. source offsets) in the same commit."""
        self._properties.update(properties)

    # -- commit -------------------------------------------------------------------
    def commit(self) -> int:
        """Publish everything staged as one new version; returns the version."""
        self._check_open()
        self._done = True
        if self._duplicate is not None:
            self.commit_version = self._duplicate
            return self._duplicate
        self._flush()
        ops = set(self._operations)
        change = Change(
            table_uuid=self._base.manifest.table_uuid,
            operation=ops.pop() if len(ops) == 1 else "transaction",
            added=self._flushed,
            deletions=self._deletions,
            properties=self._properties,
            precondition=self._precondition,
            derive_properties=self._record_keys if self._keys else None,
        )
        if change.is_empty():
            self.commit_version = self._base.version
            return self.commit_version
        files = self._table._files
        try:
            path, manifest = publish(
                files.manifests, change, max_attempts=self._options.commit_max_attempts, base=self._base_pointer
            )
        except AlreadyCommitted as done:  # a concurrent commit with the same key won
            self.commit_version = done.version
            return done.version
        self._table._published(path, manifest)
        self.commit_version = manifest.version
        return manifest.version

    def abort(self) -> None:
        """Drop everything staged. Superfiles already flushed stay unreferenced (cleanup removes them)."""
        self._done = True

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    # -- internals ------------------------------------------------------------------
    def _record_keys(self, current: ManifestList) -> dict[str, Any]:
        """Run by publish against the manifest it builds on: no-op if a key is there, else record them."""
        storage = self._table._files.storage
        done = committed_version(storage, current.properties, self._keys)
        if done is not None:
            raise AlreadyCommitted(done)
        return {KEYS_PROPERTY: record(storage, current.properties, self._keys, current.version + 1)}

    def _check_open(self) -> None:
        if self._done:
            raise SuperfileError("this transaction is already committed or aborted")

    def _predicate(self, where: str) -> Predicate:
        return parse_predicate(where, self._schema)

    def _stage(self, rows: pa.Table, first_id: int) -> None:
        ids = pa.array(np.arange(first_id, first_id + rows.num_rows, dtype=np.uint64))
        self._buffer.add(rows.add_column(0, self._schema.field(ID), ids))
        if self._buffer.nbytes >= self._options.write_buffer_bytes:
            self._flush()

    def _flush(self) -> None:
        """Build and upload staged rows now (they stay invisible until commit), bounding the buffer."""
        rows = self._buffer.take()
        if rows.num_rows:
            shards = shard(rows, self._options, build_pool()._max_workers)
            self._flushed.extend(build_shards(shards, self._options, self._table._files.storage))

    def _count_staged(self, predicate: Predicate) -> int:
        staged = self._buffer.table()
        n = int(np.count_nonzero(predicate.evaluate(staged).to_numpy(zero_copy_only=False))) if staged.num_rows else 0
        return n + sum(len(self._matching(e, predicate)) for e in self._flushed)

    def _matching(self, entry: SuperfileEntry, predicate: Predicate) -> np.ndarray:
        offsets = self._base.matching_offsets(entry, predicate)
        already = self._deletions.get(entry.path)
        if already is not None and len(already.rows):
            offsets = offsets[~np.isin(offsets, np.fromiter(already.rows, np.int64, len(already.rows)))]
        return offsets

    def _take_matches(self, predicate: Predicate) -> np.ndarray:
        """Stage deletion of every visible row matching ``predicate``; returns their ``_id``s."""
        ids: list[np.ndarray] = []
        staged = self._buffer.table()
        if staged.num_rows:
            mask = predicate.evaluate(staged)
            ids.append(np.asarray(staged.filter(mask).column(ID).to_numpy(), np.uint64))
            self._buffer.replace(staged.filter(pc.invert(mask)))
        candidates = self._base.entries(predicate) + [e for e in self._flushed if predicate.might_match(e.stats)]

        def one(entry: SuperfileEntry) -> tuple[SuperfileEntry, np.ndarray]:
            return entry, self._matching(entry, predicate)

        for entry, offsets in self._base.map(one, candidates):
            if len(offsets):
                deletion = self._deletions.setdefault(entry.path, Deletion(entry, pyroaring.BitMap()))
                deletion.rows.update(offsets.astype(np.uint32).tolist())
                ids.append(self._base.ids(entry, offsets))
        return np.concatenate(ids) if ids else np.zeros(0, np.uint64)
