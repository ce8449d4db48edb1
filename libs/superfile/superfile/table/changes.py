"""The change feed: rows inserted and deleted between two versions, from manifest differences.

Semantics: the feed is the *net* difference of the two snapshots, keyed by
``_id``. A row present in ``to`` but not in ``from`` is an ``insert``; one
present in ``from`` but not in ``to`` a ``delete``; a row present in both
with different values (an update) is a ``delete`` of the old values and an
``insert`` of the new ones. A row inserted and deleted inside the range
appears not at all, and neither does a row whose values are the same at both
ends (rows only moved by ``optimize`` or ``restore``, or updated and then
updated back).

How: manifest parts shared by both versions are skipped unread; of the other
superfile entries, those with the same deletion vector at both ends are
unchanged. Only the changed rows are read: live rows of superfiles present
at one end only, and rows whose deletion bit differs. Rows with the same
``_id`` on both sides are then compared and cancelled when equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from superfile.errors import InvalidInputError, UnknownColumnError
from superfile.evolution import schema_id
from superfile.manifest.model import ManifestList, SuperfileEntry
from superfile.manifest.store import ManifestStore
from superfile.schema import ID
from superfile.table.snapshot import Snapshot

__all__ = ["CHANGE", "changes", "diff", "entries_by_path", "id_delta"]

CHANGE = "_change"

Rows = dict[str, tuple[SuperfileEntry, np.ndarray]]  # superfile path -> (entry, row offsets)


def entries_by_path(
    store: ManifestStore, ml: ManifestList, skip_parts: frozenset[str] = frozenset()
) -> dict[str, SuperfileEntry]:
    """Every superfile entry of a version by path, except those in the parts named in ``skip_parts``."""
    return {e.path: e for p in ml.parts if p.path not in skip_parts for e in store.load_part(p, ml.schema)}


def diff(old: Snapshot, new: Snapshot) -> tuple[Rows, Rows]:
    """Physical rows live in ``old`` and not in ``new`` (gone), and the reverse (came), from the manifests:
    parts both reference are skipped unread, and so are superfiles with the same deletion vector."""
    store = old.files.manifests
    shared = frozenset(p.path for p in old.manifest.parts) & frozenset(p.path for p in new.manifest.parts)
    a = entries_by_path(store, old.manifest, shared)
    b = entries_by_path(store, new.manifest, shared)
    gone: Rows = {}
    came: Rows = {}
    for path, e in a.items():
        if path not in b:
            gone[path] = (e, old.live_offsets(e))
    for path, e in b.items():
        if path not in a:
            came[path] = (e, new.live_offsets(e))
        elif e.deletes != a[path].deletes:
            before, after = old.deleted(a[path]), new.deleted(e)
            gone[path] = (a[path], np.fromiter(after - before, np.int64))
            came[path] = (e, np.fromiter(before - after, np.int64))
    return gone, came


def _ids(snap: Snapshot, rows: Rows) -> np.ndarray:
    items = [(e, o) for e, o in rows.values() if len(o)]
    found = snap.map(lambda item: snap.ids(item[0], item[1]), items)
    return np.concatenate(found) if found else np.zeros(0, np.uint64)


def id_delta(old: Snapshot, new: Snapshot) -> tuple[int, int]:
    """(``_id``s live in ``new`` but not ``old``, ``_id``s live in ``old`` but not ``new``): reads only the
    ``_id`` column of the superfiles that differ."""
    gone, came = diff(old, new)
    a, b = _ids(old, gone), _ids(new, came)
    return len(np.setdiff1d(b, a)), len(np.setdiff1d(a, b))


def _side(snap: Snapshot, rows: Rows, columns: list[str]) -> pa.Table:
    """The given rows of the given superfiles of one snapshot, all columns, sorted by ``_id``."""
    items = [(e, o) for e, o in rows.values() if len(o)]
    tables = snap.map(lambda item: snap.read_rows(item[0], item[1], columns), items)
    if not tables:
        return snap.schema.empty_table().select(columns)
    return pa.concat_tables(tables).combine_chunks().sort_by(ID)


def _equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Per position: do the two columns hold the same value (nulls equal to nulls)?"""
    t = a.type
    if pa.types.is_fixed_size_list(t) and pa.types.is_floating(t.value_type) and not (a.null_count or b.null_count):
        size = t.list_size  # vectors: compare the flat values row by row (they are never null)
        x = np.asarray(pc.list_flatten(a).to_numpy(zero_copy_only=False)).reshape(-1, size)
        y = np.asarray(pc.list_flatten(b).to_numpy(zero_copy_only=False)).reshape(-1, size)
        return np.asarray((x == y).all(axis=1), dtype=bool)
    if pa.types.is_nested(t):
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
    equal: Any = pc.equal(a, b)  # pyarrow's stubs type this loosely
    same = np.asarray(equal.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    nulls = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return same | (nulls & np.asarray(b.is_null().to_numpy(zero_copy_only=False), dtype=bool))


def _cancel(deleted: pa.Table, inserted: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Drop rows present on both sides with equal values: they did not change."""
    d_ids = deleted.column(ID).to_numpy()
    i_ids = inserted.column(ID).to_numpy()
    common = np.intersect1d(d_ids, i_ids, assume_unique=True)
    if not len(common):
        return deleted, inserted
    d_pos = np.searchsorted(d_ids, common)
    i_pos = np.searchsorted(i_ids, common)
    d_rows, i_rows = deleted.take(d_pos), inserted.take(i_pos)
    same = np.ones(len(common), dtype=bool)
    for name in deleted.column_names:
        same &= _equal(d_rows.column(name), i_rows.column(name))
    keep_d = np.ones(deleted.num_rows, dtype=bool)
    keep_i = np.ones(inserted.num_rows, dtype=bool)
    keep_d[d_pos[same]] = False
    keep_i[i_pos[same]] = False
    return deleted.filter(pa.array(keep_d)), inserted.filter(pa.array(keep_i))


def changes(old: Snapshot, new: Snapshot, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows changed from ``old`` to ``new`` (see the module docstring): ``_change``, ``_id``, then ``columns``
    (default: every column, vectors included), ordered by ``_id`` with a row's delete before its insert."""
    if old.version > new.version:
        raise InvalidInputError(f"from_version {old.version} is after to_version {new.version}")
    if columns is not None:
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise InvalidInputError("columns must be a list of column names")
        unknown = [c for c in columns if c not in new.schema.names]
        if unknown:
            raise UnknownColumnError(f"unknown columns {unknown}; the table has {new.schema.names}")
    if schema_id(old.schema) != schema_id(new.schema):  # a schema change in the range: both ends in new's columns
        old = Snapshot(old.files, old.path, replace(old.manifest, schema=new.schema, options=new.manifest.options))
    gone, came = diff(old, new)
    everything = list(new.schema.names)
    deleted, inserted = _cancel(_side(old, gone, everything), _side(new, came, everything))
    wanted = [ID, *[c for c in (columns if columns is not None else everything) if c != ID]]
    out = pa.concat_tables(
        [
            t.select(wanted).add_column(0, CHANGE, pa.array([kind] * t.num_rows, pa.string()))
            for kind, t in (("delete", deleted), ("insert", inserted))
        ]
    )
    order = pc.sort_indices(out, sort_keys=[(ID, "ascending"), (CHANGE, "ascending")])
    return out.take(order).combine_chunks()
