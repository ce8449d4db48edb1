"""The writer: stages appends, deletes and updates, then publishes them as one commit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyroaring

from superfile.arrow_input import is_streamed
from superfile.commit.build import build_shards
from superfile.commit.change import Change, Deletion, Rebase, bitmap_of, id_bytes, offsets_of
from superfile.commit.idempotency import AlreadyCommitted, committed_version
from superfile.commit.rebase import holding
from superfile.commit.requirements import Requirement
from superfile.commit.shard import shard
from superfile.commit.stage import WriteBuffer
from superfile.errors import ContentionError, InvalidInputError, SchemaMismatchError, SuperfileError, UnknownColumnError
from superfile.evolution import filled, physical_names, plain, schema_id
from superfile.expressions import Predicate, parse_predicate
from superfile.manifest.model import Pointer, SuperfileEntry
from superfile.manifest.store import Uploads, uploads
from superfile.pools import build_threads
from superfile.schema import ID, coerce, coerce_chunks, user_schema
from superfile.table.snapshot import Snapshot
from superfile.validate import check_key

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["Transaction"]


class Transaction:
    """Writes staged on one snapshot and published together: all visible after ``commit()`` or none.

    Deletes and updates resolve their predicate against the snapshot the
    transaction started from plus the rows it staged itself, and then apply to
    those rows by ``_id``: if a concurrent commit moved a row (``optimize``,
    another update) before this one publishes, the delete follows it; a row
    that a concurrent commit deleted stays deleted (an update of it adds
    nothing).

    ``commit()`` publishes one :class:`~superfile.commit.change.Change`: a value
    holding what was staged, the idempotency keys to record, the requirements
    (given at creation or with :meth:`require`) and what publish needs to
    follow moved rows; no callback into this object.
    """

    def __init__(self, table: Supertable, requires: Iterable[Requirement] = ()) -> None:
        self._table = table
        # Checked against the manifest each publish attempt builds on; one that fails aborts the commit.
        self._requires: list[Requirement] = list(requires)
        self._base, pointer = table.writable_snapshot()
        self._base_pointer: tuple[Pointer, str] | None = pointer
        self._schema = self._base.schema
        self._options = self._base.manifest.options
        self._buffer = WriteBuffer(plain(self._schema))
        self._flushed: list[SuperfileEntry] = []
        self._deletions: dict[str, _Deleting] = {}  # by superfile path: rows staged for deletion there
        self._operations: list[str] = []
        self._properties: dict[str, Any] = {}
        self._keys: dict[str, list[tuple[int, int]]] = {}  # idempotency key -> its append's (first _id, rows)s
        self._op_keys: list[str | None] = []  # each staged append, delete and update's key (None: none), in order
        self._known: int | None = None  # newest version that committed a key an append here repeated
        self._replaced: list[np.ndarray] = []  # _ids of rows updates replaced (their replacements carry them)
        self._done = False
        self.commit_version: int | None = None  # set by commit()

    # -- staging ----------------------------------------------------------------
    def append(self, data: Any, idempotency_key: str | None = None) -> int:
        """Stage rows; returns how many. With ``idempotency_key``, the commit records the key; if an earlier
        commit (or an earlier append of this transaction) already has it, this append stages nothing and
        returns 0 (see ``commit/idempotency.py`` for the retention). Other staged work is unaffected."""
        self._check_open()
        if self._repeated(idempotency_key):
            return 0
        spans: list[tuple[int, int]] = []  # (first _id, rows) of each chunk staged
        try:
            for rows in self._coerced(data):  # a stream: chunk by chunk, as read
                if rows.num_rows:
                    first = self._table.files.manifests.reserve_ids(
                        rows.num_rows, self._options.commit_max_attempts, self._base.manifest.table_uuid
                    )
                    spans.append((first, rows.num_rows))
                    self._stage(rows, first)
        except BaseException:
            if spans:  # part of the input is staged (maybe flushed): the transaction cannot commit part of it
                self.abort()
            raise
        if spans:
            self._staged("append", idempotency_key)
            if idempotency_key is not None:
                self._keys[idempotency_key] = spans
        return sum(n for _, n in spans)

    def delete(self, where: str, idempotency_key: str | None = None) -> int:
        """Stage the removal of every row matching ``where``; returns how many. A repeated
        ``idempotency_key`` stages nothing and returns 0, as for ``append``."""
        self._check_open()
        predicate = self._predicate(where)
        if self._repeated(idempotency_key):
            return 0
        deleted = self._take_matches(predicate)
        self._staged("delete", idempotency_key)
        return len(deleted)

    def update(self, where: str, data: Any, idempotency_key: str | None = None) -> int:
        """Replace the rows matching ``where``, in ``_id`` order, by the rows of ``data`` (same count).
        The replaced rows keep their ``_id``. A repeated ``idempotency_key`` stages nothing and returns 0."""
        self._check_open()
        predicate = self._predicate(where)
        rows = next(self._coerced(data, whole=True))
        if self._repeated(idempotency_key):
            return 0
        count = self._base.count(predicate) + self._count_staged(predicate)
        if rows.num_rows != count:
            raise InvalidInputError(f"update matched {count} rows but {rows.num_rows} replacement rows were given")
        ids = np.sort(self._take_matches(predicate))
        self._replaced.append(ids)
        self._buffer.add(rows.add_column(0, self._schema.field(ID), pa.array(ids, pa.uint64())))
        self._staged("update", idempotency_key)
        return rows.num_rows

    def set_properties(self, **properties: Any) -> None:
        """Record table properties (e.g. source offsets) in the same commit."""
        self._properties.update(properties)

    def require(self, *requirements: Requirement) -> None:
        """Add requirements (``superfile.commit.requirements``) the manifest each publish attempt builds on must
        meet; one that fails aborts the commit with ``RequirementFailedError``."""
        self._check_open()
        self._requires.extend(requirements)

    def flush(self) -> None:
        """Build and upload the rows staged so far now (they stay invisible until ``commit``): what is left
        for the commit is metadata. A caller whose requirements depend on time (a lease's deadline) flushes
        before it computes them."""
        self._check_open()
        self._flush()

    # -- commit -------------------------------------------------------------------
    def commit(self) -> int:
        """Publish everything staged as one new version; returns the version. If nothing is left to publish
        because every append repeated a committed idempotency key, returns the version that committed it."""
        self._check_open()
        self._done = True
        # the last superfiles upload while the commit writes its metadata: settled before the pointer swap
        with uploads() as batch:
            return self._commit(batch)

    def _commit(self, batch: Uploads) -> int:
        self._flush(batch)
        base: tuple[Pointer, str] | None = self._base_pointer
        for _ in range(len(self._keys) + 1):  # each lost key race drops at least one key
            change = self._change()
            if change.is_empty():
                self.commit_version = self._known if self._known is not None else self._base.version
                return self.commit_version
            try:
                _, manifest = self._table.commit(change, base=base)
            except AlreadyCommitted as done:  # concurrent commits recorded some keys first: drop those appends
                self._known = max(self._known or 0, *done.keys.values())
                if any(k in done.keys and k not in self._keys for k in self._op_keys):  # a keyed delete or update
                    if all(k is not None and k in done.keys for k in self._op_keys):
                        self.commit_version = self._known  # the whole transaction is a repeat: nothing to do
                        return self.commit_version
                    raise ContentionError(
                        "a concurrent commit recorded the idempotency key of a delete or update staged here "
                        "beside other work; nothing was committed"
                    ) from None
                self._drop_keyed(done.keys)
                base = None
                continue
            self.commit_version = manifest.version
            return manifest.version
        raise AssertionError("unreachable: every key was dropped, leaving an empty change")

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
    def _change(self) -> Change:
        ops = set(self._operations)
        replaced = np.unique(np.concatenate(self._replaced)) if self._replaced else np.zeros(0, np.uint64)
        return Change(
            table_uuid=self._base.manifest.table_uuid,
            operation=ops.pop() if len(ops) == 1 else "transaction",
            added=tuple(self._flushed),
            deletions={p: d.frozen() for p, d in self._deletions.items()},
            properties=dict(self._properties),
            requires=tuple(self._requires),
            record_keys=tuple(k for k in self._op_keys if k is not None),
            rebase=Rebase(id_bytes(replaced)),  # deletes follow rows a concurrent commit moved
        )

    def _drop_keyed(self, keys: Mapping[str, int]) -> None:
        """Unstage the appends tagged with ``keys`` (their rows, and replacements of them, are in flushed
        superfiles by now): delete them there, and leave out superfiles left without rows."""
        spans = [s for k in keys if k in self._keys for s in self._keys.pop(k)]
        kept = [(op, k) for op, k in zip(self._operations, self._op_keys, strict=True) if k is None or k not in keys]
        self._operations, self._op_keys = [op for op, _ in kept], [k for _, k in kept]
        ids = np.unique(np.concatenate([np.arange(a, a + n, dtype=np.uint64) for a, n in spans]))
        staged = {p: d.rows for p, d in self._deletions.items()}
        for d in holding(self._table.files.manifests, self._flushed, ids, staged):
            self._delete_rows(d.entry, offsets_of(d.rows), d.ids_of(d.rows))
        empty = {
            e.path for e in self._flushed if e.path in self._deletions and len(self._deletions[e.path].rows) == e.rows
        }
        self._flushed = [e for e in self._flushed if e.path not in empty]
        for path in empty:
            del self._deletions[path]

    def _repeated(self, key: str | None) -> bool:
        """True when ``key`` was staged here already or committed before the base (then remembered as known)."""
        if key is None:
            return False
        if check_key(key) in self._op_keys:
            return True
        done = committed_version(self._table.files.storage, self._base.manifest.properties, [key])
        if done is not None:
            self._known = max(self._known or 0, done)
        return done is not None

    def _staged(self, operation: str, key: str | None) -> None:
        self._operations.append(operation)
        self._op_keys.append(key)

    def _check_open(self) -> None:
        if self._done:
            raise SuperfileError("this transaction is already committed or aborted")

    def _predicate(self, where: str) -> Predicate:
        try:
            return parse_predicate(where, self._schema)
        except UnknownColumnError:
            if not self._move_up():
                raise
            return parse_predicate(where, self._schema)

    def _coerced(self, data: Any, *, whole: bool = False) -> Iterator[pa.Table]:
        """``data`` coerced to the transaction's schema (one table if ``whole``, else chunk by chunk); rows that
        fit only a newer schema (a schema change landed since the transaction began) move it up to that
        schema first (:meth:`_move_up`; input read once only cannot be read again, and is refused)."""
        chunks = (
            iter([coerce(data, self._schema, self._options)])
            if whole
            else coerce_chunks(data, self._schema, self._options)
        )
        try:
            first = next(chunks, None)
        except SchemaMismatchError:
            if is_streamed(data) or not self._move_up():
                raise
            chunks = (
                iter([coerce(data, self._schema, self._options)])
                if whole
                else coerce_chunks(data, self._schema, self._options)
            )
            first = next(chunks, None)
        if first is None:
            return
        yield first
        yield from chunks

    def _move_up(self) -> bool:
        """Stage on the table's latest schema if a schema change landed since this transaction began: rows
        buffered so far are carried over by field id (renamed, dropped, filled, widened); superfiles already
        flushed keep the schema they were written under (publish reads them through it). False when the
        schema is still the latest."""
        latest = self._table.snapshot()
        if schema_id(latest.schema) <= schema_id(self._schema):
            return False
        staged = self._buffer.take()
        old = schema_id(self._schema)
        self._schema, self._options = latest.schema, latest.manifest.options
        # deletes still resolve against the version the transaction began on, read with the new schema
        base = self._base
        self._base = Snapshot(base.files, base.path, replace(base.manifest, schema=self._schema, options=self._options))
        self._base_pointer = None  # the commit builds on the latest version (one with this schema or a newer)
        self._buffer = WriteBuffer(plain(self._schema))
        if staged.num_rows:
            names = physical_names(self._schema, old)
            columns: list[pa.Array | pa.ChunkedArray] = [staged.column(ID)]
            for f in user_schema(self._schema):
                then = names.get(f.name)
                if then is None:  # added since: its default, or nulls
                    columns.append(filled(self._schema.field(f.name), staged.num_rows))
                    continue
                column = staged.column(then)
                columns.append(column if column.type == f.type else column.cast(f.type))
            self._buffer.add(pa.Table.from_arrays(columns, schema=plain(self._schema)))
        return True

    def _stage(self, rows: pa.Table, first_id: int) -> None:
        ids = pa.array(np.arange(first_id, first_id + rows.num_rows, dtype=np.uint64))
        self._buffer.add(rows.add_column(0, self._schema.field(ID), ids))
        if self._buffer.nbytes >= self._options.write_buffer_bytes:
            self._flush()

    def _flush(self, batch: Uploads | None = None) -> None:
        """Build and upload staged rows now (they stay invisible until commit), bounding the buffer. With
        ``batch`` (the commit's), the uploads may still run on return."""
        rows = self._buffer.take()
        if rows.num_rows:
            shards = shard(rows, self._options, build_threads())
            # a small write commits level-0 superfiles: no full-text or vector index until compaction
            indexed = rows.num_rows > self._options.level0_max_rows
            sid = schema_id(self._schema)
            storage = self._table.files.storage
            built = build_shards(shards, self._options, storage, sid, indexed=indexed, uploads=batch)
            self._flushed.extend(built)

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

    def _delete_rows(self, entry: SuperfileEntry, offsets: np.ndarray, ids: np.ndarray) -> None:
        """Stage the deletion of rows of ``entry`` (offsets not staged yet) carrying ``ids``."""
        self._deletions.setdefault(entry.path, _Deleting(entry)).add(offsets, ids)

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
                found = self._base.ids(entry, offsets)
                self._delete_rows(entry, offsets, found)
                ids.append(found)
        return np.concatenate(ids) if ids else np.zeros(0, np.uint64)


class _Deleting:
    """Rows of one superfile a transaction stages for deletion, as they accumulate (a commit takes them as a
    :class:`~superfile.commit.change.Deletion` value)."""

    def __init__(self, entry: SuperfileEntry) -> None:
        self.entry = entry
        self.rows = pyroaring.BitMap()
        self._offsets: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []

    def add(self, offsets: np.ndarray, ids: np.ndarray) -> None:
        self.rows |= bitmap_of(offsets)
        self._offsets.append(np.asarray(offsets, np.int64))
        self._ids.append(np.asarray(ids, np.uint64))

    def frozen(self) -> Deletion:
        if not self._offsets:
            return Deletion(self.entry)
        return Deletion.of(self.entry, np.concatenate(self._offsets), np.concatenate(self._ids))
