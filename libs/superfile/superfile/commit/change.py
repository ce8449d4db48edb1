"""A change: everything one commit publishes, as values that can be logged, compared and sent.

A :class:`Change` holds no code. What used to be callbacks into the writer and the compaction is data that
``publish`` interprets itself, against the manifest each publish attempt builds on:

- ``requires``: :mod:`superfile.commit.requirements` values (a builder's fencing, a caller's
  ``transaction(requires=...)``); each is checked before the attempt builds anything.
- ``record_keys``: idempotency keys the commit records (:mod:`superfile.commit.idempotency`); the attempt
  aborts with ``AlreadyCommitted`` when the manifest has one already.
- ``carry`` (:class:`Carry`, a rewrite such as ``optimize``): the ``_id`` of every row of each added
  superfile. When a removed superfile gained deletes after the change read it (its entry in ``removed``
  names the deletion vector as read), publish reads the ``_id``s of the newly deleted rows from the removed
  superfile and deletes the same ``_id``s in the added ones (``commit/rebase.py``).
- ``rebase`` (:class:`Rebase`, a transaction's deletes and updates): every :class:`Deletion` names its rows
  by offset *and* ``_id``; when they are no longer live where they were staged (the superfile was
  rewritten, or a concurrent update moved the row), publish finds the live rows carrying those ``_id``s in
  the manifest it builds on and deletes them there. ``Rebase.replaced`` (the ``_id``s this change's updates
  replaced) lets it drop a replacement whose original a concurrent commit deleted.

- ``schema`` (:class:`SchemaUpdate`, a schema evolution: ``superfile.evolution``): the table's next schema
  and options. Such a change carries no rows; it requires (``AssertSchemaId``) the schema it was staged
  against. A data change staged under an older schema than the one it publishes over is still valid: its
  superfiles record the schema they were written under, and publish re-keys their entries to the current
  column names (``SuperfileEntry.as_of``).

``to_json(schema)`` / ``from_json(d, schema)`` round-trip a change exactly (entries as the manifest writes
them; bitmaps in the portable Roaring format and ``_id`` arrays as little-endian uint64, both base64). The
schema is the table's, as for a manifest's own entries.
"""

from __future__ import annotations

import array
import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyroaring

from superfile.commit.requirements import Requirement, requirement_from_json
from superfile.errors import ContentionError
from superfile.manifest.model import SuperfileEntry
from superfile.options import TableOptions

__all__ = [
    "Carry",
    "Change",
    "Deletion",
    "Rebase",
    "SchemaUpdate",
    "StaleSuperfileError",
    "bitmap_of",
    "id_array",
    "id_bytes",
    "offsets_of",
]


class StaleSuperfileError(ContentionError):
    """A superfile the change deletes from or replaces was removed or changed by a concurrent commit in a way
    the change cannot follow."""


def offsets_of(rows: pyroaring.AbstractBitMap) -> np.ndarray:
    """Row offsets of a bitmap, ascending."""
    return np.frombuffer(rows.to_array(), np.uint32).astype(np.int64)


def bitmap_of(offsets: np.ndarray) -> pyroaring.FrozenBitMap:
    """The bitmap of some row offsets (an ``array`` of C unsigned ints is pyroaring's fast path)."""
    return pyroaring.FrozenBitMap(array.array("I", np.asarray(offsets, np.uint32).tobytes()))


def id_bytes(ids: np.ndarray) -> bytes:
    """``_id``s as stored in a change: little-endian uint64."""
    return np.asarray(ids, "<u8").tobytes()


def id_array(raw: bytes) -> np.ndarray:
    """``_id``s stored by :func:`id_bytes` (a read-only view)."""
    return np.frombuffer(raw, "<u8")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _bitmap_json(rows: pyroaring.AbstractBitMap) -> str:
    return _b64(rows.serialize())


def _bitmap_from_json(text: str) -> pyroaring.FrozenBitMap:
    return pyroaring.FrozenBitMap.deserialize(_unb64(text))


@dataclass(frozen=True)
class Deletion:
    """Rows newly deleted from one superfile (``entry`` as staged): their offsets, and the ``_id`` of each,
    in ascending offset order (so a rebase can follow a row a concurrent commit moved)."""

    entry: SuperfileEntry
    rows: pyroaring.FrozenBitMap = field(default_factory=pyroaring.FrozenBitMap)
    ids: bytes = b""  # id_bytes: the _id of each of ``rows``, in ascending offset order

    def __post_init__(self) -> None:
        if len(self.ids) != 8 * len(self.rows):
            raise ValueError(f"a deletion of {len(self.rows)} rows needs as many _ids, got {len(self.ids) // 8}")

    @classmethod
    def of(cls, entry: SuperfileEntry, offsets: np.ndarray, ids: np.ndarray) -> Deletion:
        """The deletion of rows at ``offsets`` (any order, repeats ignored) carrying ``ids``."""
        offsets = np.asarray(offsets, np.int64)
        ids = np.asarray(ids, np.uint64)
        if offsets.shape != ids.shape:
            raise ValueError(f"{len(offsets)} offsets but {len(ids)} _ids")
        unique, first = np.unique(offsets, return_index=True)
        return cls(entry, bitmap_of(unique), id_bytes(ids[first]))

    def ids_of(self, rows: pyroaring.AbstractBitMap) -> np.ndarray:
        """The ``_id``s of some of this deletion's rows."""
        if not rows.issubset(self.rows):
            raise ValueError("rows without a recorded _id")  # a caller bug: every row is staged with its _id
        return id_array(self.ids)[np.searchsorted(offsets_of(self.rows), offsets_of(rows))]

    def to_json(self, schema: pa.Schema) -> dict[str, Any]:
        return {"entry": self.entry.to_json(schema), "rows": _bitmap_json(self.rows), "ids": _b64(self.ids)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], schema: pa.Schema) -> Deletion:
        return cls(SuperfileEntry.from_json(d["entry"], schema), _bitmap_from_json(d["rows"]), _unb64(d["ids"]))


@dataclass(frozen=True)
class Carry:
    """What a rewrite needs to keep deletes that race it: for each added superfile (by path), the ``_id`` of
    each of its rows in offset order (:func:`id_bytes`; ascending, as a rewrite writes them)."""

    ids: Mapping[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ids": {path: _b64(raw) for path, raw in self.ids.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Carry:
        return cls({path: _unb64(raw) for path, raw in d["ids"].items()})


@dataclass(frozen=True)
class Rebase:
    """Deletions follow their rows by ``_id`` when a concurrent commit moved them. ``replaced``: the
    ``_id``s of rows this change's updates replaced (:func:`id_bytes`, ascending, unique); their
    replacements are rows of the added superfiles that carry the same ``_id``s."""

    replaced: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {"replaced": _b64(self.replaced)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Rebase:
        return cls(_unb64(d["replaced"]))


@dataclass(frozen=True)
class SchemaUpdate:
    """One schema evolution: the table's next schema (``superfile.evolution.next_schema``: field ids, the
    next schema id, earlier schemas' names) and options (indexed columns, tokenizers, vector metrics)."""

    schema: pa.Schema
    options: TableOptions

    def to_json(self) -> dict[str, Any]:
        return {"schema": _b64(self.schema.serialize().to_pybytes()), "options": self.options.to_dict()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SchemaUpdate:
        return cls(pa.ipc.read_schema(pa.py_buffer(_unb64(d["schema"]))), TableOptions.from_dict(d["options"]))


@dataclass(frozen=True)
class Change:
    """Everything one commit publishes (see the module docstring)."""

    table_uuid: str
    operation: str
    added: tuple[SuperfileEntry, ...] = ()
    deletions: Mapping[str, Deletion] = field(default_factory=dict)  # by the path of the superfile
    properties: Mapping[str, Any] = field(default_factory=dict)
    # Superfiles this change replaces (a rewrite), by path, as the change read them.
    removed: Mapping[str, SuperfileEntry] = field(default_factory=dict)
    # Checked against the manifest each publish attempt builds on; one that fails aborts the commit.
    requires: tuple[Requirement, ...] = ()
    # Idempotency keys recorded by the commit; the attempt aborts (AlreadyCommitted) if one is there.
    record_keys: tuple[str, ...] = ()
    # Without it, a delete that lands on a removed superfile meanwhile fails the publish (StaleSuperfileError).
    carry: Carry | None = None
    # Without it, a deletion whose superfile is gone fails the publish (StaleSuperfileError).
    rebase: Rebase | None = None
    # A schema evolution: the next schema and options (with no rows; requires AssertSchemaId).
    schema: SchemaUpdate | None = None

    @property
    def rows_added(self) -> int:
        """Rows the change adds to the table's content (a rewrite that keeps the content adds none)."""
        return sum(e.rows for e in self.added) - sum(e.live_rows for e in self.removed.values())

    def is_empty(self) -> bool:
        return (
            not self.added
            and not self.removed
            and not any(len(d.rows) for d in self.deletions.values())
            and not self.properties
            and self.schema is None
        )

    def to_json(self, schema: pa.Schema) -> dict[str, Any]:
        """The change as JSON values; :meth:`from_json` with the same schema gives it back."""
        return {
            "table_uuid": self.table_uuid,
            "operation": self.operation,
            "added": [e.to_json(schema) for e in self.added],
            "deletions": [d.to_json(schema) for d in self.deletions.values()],
            "properties": dict(self.properties),
            "removed": [e.to_json(schema) for e in self.removed.values()],
            "requires": [r.to_json() for r in self.requires],
            "record_keys": list(self.record_keys),
            "carry": None if self.carry is None else self.carry.to_json(),
            "rebase": None if self.rebase is None else self.rebase.to_json(),
            "schema": None if self.schema is None else self.schema.to_json(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], schema: pa.Schema) -> Change:
        deletions = [Deletion.from_json(x, schema) for x in d["deletions"]]
        removed = [SuperfileEntry.from_json(x, schema) for x in d["removed"]]
        return cls(
            table_uuid=d["table_uuid"],
            operation=d["operation"],
            added=tuple(SuperfileEntry.from_json(x, schema) for x in d["added"]),
            deletions={x.entry.path: x for x in deletions},
            properties=dict(d["properties"]),
            removed={e.path: e for e in removed},
            requires=tuple(requirement_from_json(r) for r in d["requires"]),
            record_keys=tuple(d["record_keys"]),
            carry=None if d["carry"] is None else Carry.from_json(d["carry"]),
            rebase=None if d["rebase"] is None else Rebase.from_json(d["rebase"]),
            schema=None if d.get("schema") is None else SchemaUpdate.from_json(d["schema"]),
        )
