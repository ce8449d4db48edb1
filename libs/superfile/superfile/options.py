"""Table options: what a table was created with, fixed in its manifest, readable back.

Options are typed and validated once at creation; every later reader gets the
same values from the manifest, so embedded and remote handles agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pyarrow as pa

from superfile.errors import InvalidOptionError, UnknownColumnError

__all__ = ["CONSISTENCY_LEVELS", "TOKENIZERS", "PartitionSpec", "TableOptions", "VectorColumn"]

TOKENIZERS = ("english", "simple", "raw", "whitespace")
METRICS = ("cosine", "l2", "dot")
CONSISTENCY_LEVELS = ("strong", "bounded", "snapshot")
SCALAR_INDEX_KINDS = ("auto", "bitmap", "sorted", "none")
_TRANSFORM = re.compile(r"^(identity|year|month|day|bucket\[(\d+)\])$")


@dataclass(frozen=True)
class VectorColumn:
    """A vector column: fixed dimension and the metric its distances use."""

    dim: int
    metric: str = "cosine"
    index: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or not 1 <= self.dim <= 65536:
            raise InvalidOptionError(f"vector dim must be an integer in 1..65536, got {self.dim!r}")
        if self.metric not in METRICS:
            raise InvalidOptionError(f"vector metric must be one of {METRICS}, got {self.metric!r}")


@dataclass(frozen=True)
class PartitionSpec:
    """How superfiles are assigned to partitions; chosen at creation, immutable after.

    ``transform`` is ``identity`` (one partition per value), ``bucket[N]``
    (hash of the value into N buckets), or ``year``/``month``/``day`` of a
    timestamp or date column.
    """

    column: str
    transform: str = "identity"

    def __post_init__(self) -> None:
        m = _TRANSFORM.match(self.transform)
        if not m or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 65536):
            raise InvalidOptionError(
                f"partition transform must be identity, year, month, day or bucket[N] (1<=N<=65536), "
                f"got {self.transform!r}"
            )

    @property
    def buckets(self) -> int | None:
        m = _TRANSFORM.match(self.transform)
        return int(m.group(2)) if m and m.group(2) else None


@dataclass(frozen=True)
class TableOptions:
    """Everything a table is created with besides its schema."""

    fts_columns: Mapping[str, str] = field(default_factory=dict)  # column -> tokenizer
    vector_columns: Mapping[str, VectorColumn] = field(default_factory=dict)
    partition: PartitionSpec | None = None
    # column -> "auto" | "bitmap" | "sorted" | "none"; unlisted scalar columns get "auto" (see commit/build.py)
    scalar_indexes: Mapping[str, str] = field(default_factory=dict)
    consistency: str = "strong"
    max_staleness_s: float = 1.0
    max_rows_per_superfile: int = 100_000
    min_rows_per_shard: int = 20_000
    write_buffer_bytes: int = 256 * 1024 * 1024
    manifest_part_max_entries: int = 500
    manifest_part_max_bytes: int = 4 * 1024 * 1024
    manifest_eager_max_parts: int = 8
    commit_max_attempts: int = 40
    # a write of at most this many rows commits a level-0 superfile: no full-text or vector index (searched
    # exactly, table/exact.py) until compaction merges it into an indexed one; 0 (for now the default): every
    # write builds them. 5000 is the measured choice (docs/maintenance.md, "Small writes: level 0")
    level0_max_rows: int = 0

    def __post_init__(self) -> None:
        for name, tok in self.fts_columns.items():
            if tok not in TOKENIZERS:
                raise InvalidOptionError(f"tokenizer for {name!r} must be one of {TOKENIZERS}, got {tok!r}")
        for name, kind in self.scalar_indexes.items():
            if kind not in SCALAR_INDEX_KINDS:
                raise InvalidOptionError(f"scalar index for {name!r} must be one of {SCALAR_INDEX_KINDS}, got {kind!r}")
        if self.consistency not in CONSISTENCY_LEVELS:
            raise InvalidOptionError(f"consistency must be one of {CONSISTENCY_LEVELS}, got {self.consistency!r}")
        for name in (
            "max_rows_per_superfile",
            "min_rows_per_shard",
            "write_buffer_bytes",
            "manifest_part_max_entries",
            "manifest_part_max_bytes",
            "manifest_eager_max_parts",
            "commit_max_attempts",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
        if (
            not isinstance(self.level0_max_rows, int)
            or isinstance(self.level0_max_rows, bool)
            or self.level0_max_rows < 0
        ):
            raise InvalidOptionError(f"level0_max_rows must be a non-negative integer, got {self.level0_max_rows!r}")
        if not 0 <= self.max_staleness_s < float("inf"):  # finite: options travel as strict JSON
            raise InvalidOptionError(f"max_staleness_s must be finite and >= 0, got {self.max_staleness_s!r}")

    def check_schema(self, schema: pa.Schema) -> None:
        """Indexed columns must exist and have the right type."""
        names = set(schema.names)
        for col in self.fts_columns:
            if col not in names:
                raise UnknownColumnError(f"full-text column {col!r} is not in the schema")
            if not (pa.types.is_string(schema.field(col).type) or pa.types.is_large_string(schema.field(col).type)):
                raise InvalidOptionError(f"full-text column {col!r} must be a string column")
        for col in self.scalar_indexes:
            if col not in names:
                raise UnknownColumnError(f"scalar index column {col!r} is not in the schema")
            if col in self.vector_columns:
                raise InvalidOptionError(f"vector column {col!r} cannot have a scalar index")
        for col, spec in self.vector_columns.items():
            if col not in names:
                raise UnknownColumnError(f"vector column {col!r} is not in the schema")
            if col in self.fts_columns:
                raise InvalidOptionError(f"column {col!r} cannot be both a full-text and a vector column")
            t = schema.field(col).type
            if not (pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
                raise InvalidOptionError(f"vector column {col!r} must be a list of floats, got {t}")
            if pa.types.is_fixed_size_list(t) and t.list_size != spec.dim:
                raise InvalidOptionError(
                    f"vector column {col!r} has list size {t.list_size} but dim {spec.dim} was given"
                )
        if self.partition is not None:
            if self.partition.column not in names:
                raise UnknownColumnError(f"partition column {self.partition.column!r} is not in the schema")
            if self.partition.column in self.vector_columns:
                raise InvalidOptionError("a vector column cannot partition a table")
            t = schema.field(self.partition.column).type
            if self.partition.transform in ("year", "month", "day") and not (
                pa.types.is_timestamp(t) or pa.types.is_date(t)
            ):
                raise InvalidOptionError(
                    f"partition transform {self.partition.transform} needs a timestamp or date column"
                )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fts_columns"] = dict(self.fts_columns)
        d["scalar_indexes"] = dict(self.scalar_indexes)
        d["vector_columns"] = {
            k: {"dim": v.dim, "metric": v.metric, "index": dict(v.index)} for k, v in self.vector_columns.items()
        }
        d["partition"] = None if self.partition is None else asdict(self.partition)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InvalidOptionError(f"unknown table options: {sorted(unknown)}")
        kw = dict(d)
        kw["fts_columns"] = dict(d.get("fts_columns") or {})
        kw["scalar_indexes"] = dict(d.get("scalar_indexes") or {})
        kw["vector_columns"] = {
            k: v if isinstance(v, VectorColumn) else VectorColumn(**v)
            for k, v in (d.get("vector_columns") or {}).items()
        }
        p = d.get("partition")
        kw["partition"] = p if (p is None or isinstance(p, PartitionSpec)) else PartitionSpec(**p)
        return cls(**kw)
