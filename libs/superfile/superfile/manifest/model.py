"""Typed manifest metadata and its JSON form.

A version of a table is one :class:`ManifestList`: table configuration, the
newest entries of the version history (older ones are in history segments,
``manifest/log.py``), and references to manifest *parts*. A part is an immutable
file holding :class:`SuperfileEntry` summaries; successor versions reference
the parts they carry forward instead of copying them.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from superfile.evolution import current_names, identified, physical_names, schema_id, since_valid
from superfile.expressions import ColumnStats
from superfile.format import Section
from superfile.manifest.bloom import BloomFilter
from superfile.options import TableOptions

__all__ = [
    "DeletionRef",
    "HistoryEntry",
    "ManifestList",
    "PartRef",
    "Pointer",
    "SuperfileEntry",
    "TextSummary",
    "VectorSummary",
    "decode_value",
    "encode_value",
]

FORMAT_VERSION = 2  # 2: the history moved out of the manifest list (a tail and segments); 1 carried all of it


def encode_value(value: Any, type_: pa.DataType) -> Any:
    """A statistics value as JSON: temporal values as their storage integer, bytes as base64."""
    if value is None:
        return None
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if pa.types.is_temporal(type_):
        arr = pa.array([value], type_)
        return arr.view(pa.int64() if type_.bit_width == 64 else pa.int32())[0].as_py()
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def decode_value(value: Any, type_: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_temporal(type_):
        storage = pa.int64() if type_.bit_width == 64 else pa.int32()
        return pa.array([value], storage).view(type_)[0].as_py()
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    if pa.types.is_decimal(type_):
        return decimal.Decimal(value)
    return value


def _stats_to_json(
    stats: dict[str, ColumnStats], schema: pa.Schema, names: dict[str, str] | None = None
) -> dict[str, list[Any]]:
    """``names``: the key each column is written under (its name in the superfile; default: its own)."""
    out = {}
    for name, s in stats.items():
        t = schema.field(name).type
        out[name if names is None else names[name]] = [
            encode_value(s.min, t),
            encode_value(s.max, t),
            s.null_count,
            s.row_count,
        ]
    return out


def _stats_from_json(
    d: dict[str, list[Any]], schema: pa.Schema, names: dict[str, str] | None = None
) -> dict[str, ColumnStats]:
    """``names``: the superfile's column name -> the schema's (default: the same); others are dropped."""
    out = {}
    for key, (lo, hi, nulls, rows) in d.items():
        name = key if names is None else names.get(key)
        if name is None or name not in schema.names:
            continue
        t = schema.field(name).type
        out[name] = ColumnStats(decode_value(lo, t), decode_value(hi, t), nulls, rows)
    return out


def _renamed(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {names[k]: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class TextSummary:
    """Per full-text column: which terms a superfile may hold, and their lexicographic range."""

    bloom: BloomFilter | None  # None for aggregated (part-level) summaries
    min_term: str | None
    max_term: str | None

    def may_hold(self, terms: list[str], *, every: bool) -> bool:
        """Whether the superfile may hold every one of ``terms`` (``every``) or one of them; only the bloom
        filter can say no, so a summary without one says yes."""
        if self.bloom is None:
            return True
        present = self.bloom.might_contain_many(terms)
        return bool(present.all() if every else present.any())

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"min": self.min_term, "max": self.max_term}
        if self.bloom is not None:
            d["bloom"] = self.bloom.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TextSummary:
        bloom = BloomFilter.from_json(d["bloom"]) if "bloom" in d else None
        return cls(bloom, d["min"], d["max"])


@dataclass(frozen=True)
class VectorSummary:
    """Per vector column: a centroid and the radius around it holding every vector."""

    centroid: np.ndarray
    radius: float

    def to_json(self) -> dict[str, Any]:
        return {
            "centroid": base64.b64encode(np.asarray(self.centroid, "<f4").tobytes()).decode(),
            "radius": float(self.radius),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VectorSummary:
        return cls(np.frombuffer(base64.b64decode(d["centroid"]), "<f4"), float(d["radius"]))


@dataclass(frozen=True)
class DeletionRef:
    """A deletion vector: a Roaring bitmap of deleted row offsets, stored beside the superfile."""

    path: str
    count: int


@dataclass(frozen=True)
class SuperfileEntry:
    """Everything the table needs to route, prune and open one superfile without reading it.

    ``schema_id``: the table schema the superfile was written under (``superfile.evolution``): its columns
    carry that schema's names. In memory, the per-column facts (``stats``, ``text``, ``vectors``,
    ``fts_tokens``) are keyed by the names of the schema the entry was read with; in JSON by the
    superfile's own names, so a rename or a drop rewrites no entry. ``sections`` are the file's own.
    """

    path: str
    size: int
    rows: int
    id_min: int
    id_max: int
    footer_crc32: int
    sections: dict[str, Section]
    stats: dict[str, ColumnStats]
    text: dict[str, TextSummary]
    vectors: dict[str, VectorSummary]
    partition: str | None
    added_version: int
    deletes: DeletionRef | None = None
    fts_tokens: dict[str, int] = field(default_factory=dict)  # per full-text column: total analysed length
    schema_id: int = 0

    @property
    def live_rows(self) -> int:
        return self.rows - (self.deletes.count if self.deletes else 0)

    def to_json(self, schema: pa.Schema) -> dict[str, Any]:
        """JSON keyed by the superfile's own column names; ``schema`` is the one the entry was read with."""
        names = None if self.schema_id == schema_id(schema) else physical_names(schema, self.schema_id)
        keyed = (lambda d: d) if names is None else (lambda d: _renamed(d, names))
        stats = self.stats if names is None else {k: v for k, v in self.stats.items() if k in names}
        d = {
            "path": self.path,
            "size": self.size,
            "rows": self.rows,
            "id_range": [self.id_min, self.id_max],
            "footer_crc32": self.footer_crc32,
            "sections": {n: [s.kind, s.offset, s.length, s.crc32] for n, s in self.sections.items()},
            "stats": _stats_to_json(stats, schema, names),
            "text": {c: t.to_json() for c, t in keyed(self.text).items()},
            "vectors": {c: v.to_json() for c, v in keyed(self.vectors).items()},
            "partition": self.partition,
            "added_version": self.added_version,
            "deletes": None if self.deletes is None else [self.deletes.path, self.deletes.count],
            "fts_tokens": keyed(self.fts_tokens),
        }
        if self.schema_id:
            d["schema_id"] = self.schema_id
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], schema: pa.Schema) -> SuperfileEntry:
        """The entry as ``schema`` (the table's, at the version read) names its columns."""
        dels = d.get("deletes")
        sid = d.get("schema_id", 0)
        entry = cls(
            path=d["path"],
            size=d["size"],
            rows=d["rows"],
            id_min=d["id_range"][0],
            id_max=d["id_range"][1],
            footer_crc32=d["footer_crc32"],
            sections={n: Section(n, k, o, ln, c) for n, (k, o, ln, c) in d["sections"].items()},
            stats={},
            text={c: TextSummary.from_json(t) for c, t in d["text"].items()},
            vectors={c: VectorSummary.from_json(v) for c, v in d["vectors"].items()},
            partition=d["partition"],
            added_version=d["added_version"],
            deletes=None if dels is None else DeletionRef(dels[0], dels[1]),
            fts_tokens=d.get("fts_tokens", {}),
            schema_id=sid,
        )
        if sid == schema_id(schema):
            return replace(entry, stats=_stats_from_json(d["stats"], schema))
        return entry.as_of(schema, stats=d["stats"])

    def as_of(self, schema: pa.Schema, *, stats: dict[str, list[Any]] | None = None) -> SuperfileEntry:
        """This entry, keyed by the superfile's own column names (a fresh one, built under its own schema),
        keyed by ``schema``'s names instead: renamed columns follow their field ids, dropped ones go, and the
        index summaries of a column whose index was created after the superfile was written are left out.
        ``stats``: the JSON statistics, when decoding."""
        names = current_names(schema, self.schema_id)
        indexed = {now for now in names.values() if since_valid(schema, now, self.schema_id)}
        kept = {k: v for k, v in names.items() if v in indexed}
        return replace(
            self,
            stats=_stats_from_json(stats, schema, names)
            if stats is not None
            else {names[k]: v for k, v in self.stats.items() if k in names},
            text=_renamed(self.text, kept),
            vectors=_renamed(self.vectors, kept),
            fts_tokens=_renamed(self.fts_tokens, kept),
        )


@dataclass(frozen=True)
class PartRef:
    """A manifest part as the manifest list names it, with aggregate summaries for pruning whole parts."""

    path: str
    partition: str | None
    entry_count: int
    byte_size: int
    rows: int
    live_rows: int
    id_min: int
    id_max: int
    stats: dict[str, ColumnStats]
    text: dict[str, TextSummary]
    sealed: bool

    def to_json(self, schema: pa.Schema) -> dict[str, Any]:
        return {
            "path": self.path,
            "partition": self.partition,
            "entry_count": self.entry_count,
            "byte_size": self.byte_size,
            "rows": self.rows,
            "live_rows": self.live_rows,
            "id_range": [self.id_min, self.id_max],
            "stats": _stats_to_json(self.stats, schema),
            "text": {c: t.to_json() for c, t in self.text.items()},
            "sealed": self.sealed,
        }

    def renamed(self, names: dict[str, str]) -> PartRef:
        """The summaries under new column names (``names``: old -> new; columns not in it are dropped)."""
        return replace(self, stats=_renamed(self.stats, names), text=_renamed(self.text, names))

    @classmethod
    def from_json(cls, d: dict[str, Any], schema: pa.Schema) -> PartRef:
        return cls(
            path=d["path"],
            partition=d["partition"],
            entry_count=d["entry_count"],
            byte_size=d["byte_size"],
            rows=d["rows"],
            live_rows=d["live_rows"],
            id_min=d["id_range"][0],
            id_max=d["id_range"][1],
            stats=_stats_from_json(d["stats"], schema),
            text={c: TextSummary.from_json(t) for c, t in d["text"].items()},
            sealed=d["sealed"],
        )


@dataclass(frozen=True)
class HistoryEntry:
    """One committed version, as listed by the version history."""

    version: int
    manifest: str
    timestamp_ms: int
    operation: str
    rows_added: int
    rows_deleted: int
    row_count: int

    def to_json(self) -> list[Any]:
        return [
            self.version,
            self.manifest,
            self.timestamp_ms,
            self.operation,
            self.rows_added,
            self.rows_deleted,
            self.row_count,
        ]

    @classmethod
    def from_json(cls, v: list[Any]) -> HistoryEntry:
        return cls(*v)


@dataclass(frozen=True)
class ManifestList:
    """One immutable version of a table."""

    table_uuid: str
    version: int
    parent: str | None
    timestamp_ms: int
    operation: str
    schema: pa.Schema
    options: TableOptions
    parts: tuple[PartRef, ...]
    history_tail: tuple[HistoryEntry, ...]  # the newest history entries, this version's last
    properties: dict[str, Any] = field(default_factory=dict)
    history_segment: str | None = None  # the newest history segment (older entries), None if none yet
    history_depth: int = 0  # segments written since the last checkpoint
    format_version: int = FORMAT_VERSION

    @property
    def rows(self) -> int:
        return sum(p.live_rows for p in self.parts)

    @property
    def superfile_count(self) -> int:
        return sum(p.entry_count for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "supertable",
            "format_version": FORMAT_VERSION,
            "table_uuid": self.table_uuid,
            "version": self.version,
            "parent": self.parent,
            "timestamp_ms": self.timestamp_ms,
            "operation": self.operation,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "schema_fields": [f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in self.schema],
            "options": self.options.to_dict(),
            "parts": [p.to_json(self.schema) for p in self.parts],
            "history_tail": [h.to_json() for h in self.history_tail],
            "history_segment": self.history_segment,
            "history_depth": self.history_depth,
            "properties": self.properties,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ManifestList:
        # a table from before field ids gets them by position, as its superfiles were written
        schema = identified(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(d["schema"]))))
        return cls(
            table_uuid=d["table_uuid"],
            version=d["version"],
            parent=d["parent"],
            timestamp_ms=d["timestamp_ms"],
            operation=d["operation"],
            schema=schema,
            options=TableOptions.from_dict(d["options"]),
            parts=tuple(PartRef.from_json(p, schema) for p in d["parts"]),
            # format 1 carried the whole history: read as a tail, it is the same history
            history_tail=tuple(HistoryEntry.from_json(h) for h in d.get("history_tail", d.get("history", ()))),
            properties=d.get("properties", {}),
            history_segment=d.get("history_segment"),
            history_depth=d.get("history_depth", 0),
            format_version=d.get("format_version", 1),
        )


@dataclass(frozen=True)
class Pointer:
    """The table's current version: the only object that is ever overwritten (by compare-and-swap)."""

    version: int
    manifest: str
    table_uuid: str

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "manifest": self.manifest, "table_uuid": self.table_uuid}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pointer:
        return cls(d["version"], d["manifest"], d["table_uuid"])


def now_ms() -> int:
    return int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
