"""Schema evolution of a table: add, rename, drop and widen columns, create and drop full-text and vector
indexes. Each change is one commit of metadata only (``docs/schema.md``).

Every function here is a *plan*: from the table's current schema and options to the next ones, checked
(typed errors, nothing committed on a bad change). :func:`evolve` commits a plan as one
:class:`~superfile.commit.change.Change` carrying a :class:`~superfile.commit.change.SchemaUpdate` and
requiring the schema it was planned on (``AssertSchemaId``): if another schema change lands first, the plan
is made again on the newer schema (it may then fail: the column it adds exists now). Appends, deletes and
optimizes that land meanwhile do not conflict with it; a write staged under the old schema publishes over
the new one (its superfiles record the schema they were written under).

What a change rewrites: nothing in storage but the manifest list. Superfiles keep their column names and
types; reads map them through field ids (``table/columns.py``). A new full-text or vector index is recorded in
the options at once and built into existing superfiles by rewriting them in the background
(:func:`index_in_background`, ``optimize``); until then, searches scan the superfiles without it exactly
(``table/exact.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from superfile.commit.change import Change, SchemaUpdate
from superfile.commit.requirements import AssertSchemaId, RequirementFailedError
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidVectorError,
    SchemaChangeError,
    UnknownColumnError,
)
from superfile.evolution import (
    columns_to_add,
    default_of,
    next_schema,
    schema_id,
    widens,
    with_default,
    with_since,
)
from superfile.format.vector_index import VectorIndexParams
from superfile.manifest.store import backoff
from superfile.options import TOKENIZERS, PartitionSpec, TableOptions, VectorColumn
from superfile.schema import ID, check_column_name, check_column_type, is_vector_type
from superfile.table.optimize import optimize, stale

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = [
    "add_columns",
    "alter_column_type",
    "create_fts_index",
    "create_vector_index",
    "drop_columns",
    "drop_index",
    "evolve",
    "index_in_background",
    "rename_column",
]

log = logging.getLogger("superfile.evolution")

Plan = Callable[[pa.Schema, TableOptions], tuple[pa.Schema, TableOptions]]

_ATTEMPTS = 8  # plans made again after a concurrent schema change


def evolve(table: Supertable, operation: str, plan: Plan) -> int:
    """Commit ``plan`` (made on the latest schema) as the next version; returns it. A plan that changes
    nothing commits nothing and returns the current version."""
    for attempt in range(_ATTEMPTS):
        snap, pointer = table.writable_snapshot()
        schema, options = plan(snap.schema, snap.manifest.options)
        if schema.equals(snap.schema, check_metadata=True) and options == snap.manifest.options:
            return snap.version
        options.check_schema(schema)
        change = Change(
            table_uuid=snap.manifest.table_uuid,
            operation=operation,
            schema=SchemaUpdate(schema, options),
            requires=(AssertSchemaId(schema_id(snap.schema)),),
        )
        try:
            _, manifest = table.commit(change, base=pointer)
            return manifest.version
        except RequirementFailedError as failed:
            if not isinstance(failed.requirement, AssertSchemaId) or attempt + 1 == _ATTEMPTS:
                raise
            backoff(attempt, base=0.02)  # another schema change landed first: plan again on it
    raise AssertionError("unreachable")


# -- plans ---------------------------------------------------------------------------------------------------
def _column(schema: pa.Schema, name: str) -> pa.Field:
    if not isinstance(name, str):
        raise InvalidInputError(f"a column name must be a string, got {name!r}")
    if name == ID:
        raise SchemaChangeError(f"{ID!r} is the table's row id: it cannot be renamed, dropped or changed")
    if name not in schema.names:
        raise UnknownColumnError(f"unknown column {name!r}; the table has {schema.names}")
    return schema.field(name)


def _replace_field(schema: pa.Schema, name: str, field: pa.Field) -> list[pa.Field]:
    return [field if f.name == name else f for f in schema]


def add_columns(fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None) -> Plan:
    """New columns at the end: nullable, or not null with a default. Rows written before (and appends that
    leave a column out) read its default, or null; no superfile is rewritten."""
    new = columns_to_add(fields, defaults)

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        if not new:
            raise InvalidInputError("add_columns needs at least one column")
        names = [f.name for f in new]
        if len(set(names)) != len(names):
            raise SchemaChangeError(f"columns named twice: {names}")
        for f in new:
            check_column_name(f.name)
            if f.name in schema.names:
                raise SchemaChangeError(f"column {f.name!r} already exists")
            check_column_type(f)
            if default_of(f) is None and not f.nullable:
                raise SchemaChangeError(
                    f"column {f.name!r} is not nullable: give it a default, which the rows already in the table read"
                )
        return next_schema(schema, [*schema, *new]), options

    return plan


def rename_column(old: str, new: str) -> Plan:
    """Rename a column (metadata only: superfiles keep the old name, reads follow the field id). Its indexes,
    partitioning and scalar-index option follow it."""

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        field = _column(schema, old)
        check_column_name(new)
        if new == old:
            return schema, options
        if new in schema.names:
            raise SchemaChangeError(f"column {new!r} already exists")

        def moved(mapping: Mapping[str, Any]) -> dict[str, Any]:
            return {new if k == old else k: v for k, v in mapping.items()}

        partition = options.partition
        if partition is not None and partition.column == old:
            partition = PartitionSpec(new, partition.transform)
        renamed = replace(
            options,
            fts_columns=moved(options.fts_columns),
            vector_columns=moved(options.vector_columns),
            scalar_indexes=moved(options.scalar_indexes),
            partition=partition,
        )
        return next_schema(schema, _replace_field(schema, old, field.with_name(new))), renamed

    return plan


def drop_columns(names: str | Sequence[str]) -> Plan:
    """Drop columns (and their indexes). Older versions keep reading them; the bytes stay in the superfiles
    until they are rewritten (``optimize``)."""
    dropped = [names] if isinstance(names, str) else list(names)

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        if not dropped:
            raise InvalidInputError("drop_columns needs at least one column")
        for name in dropped:
            _column(schema, name)
            if options.partition is not None and options.partition.column == name:
                raise SchemaChangeError(f"column {name!r} partitions the table: it cannot be dropped")
        kept = [f for f in schema if f.name not in dropped]
        if len(kept) == 1:
            raise SchemaChangeError("a table keeps at least one column besides _id")

        def without(mapping: Mapping[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in mapping.items() if k not in dropped}

        return next_schema(schema, kept), replace(
            options,
            fts_columns=without(options.fts_columns),
            vector_columns=without(options.vector_columns),
            scalar_indexes=without(options.scalar_indexes),
        )

    return plan


def alter_column_type(name: str, new_type: pa.DataType) -> Plan:
    """Widen a column's type (``superfile.evolution.widens``: no value can change); stored values are cast when
    read. Anything else is a SchemaChangeError."""
    if not isinstance(new_type, pa.DataType):
        raise InvalidInputError(f"new_type must be a pyarrow.DataType, got {new_type!r}")

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        field = _column(schema, name)
        if field.type == new_type:
            return schema, options
        if options.partition is not None and options.partition.column == name:
            raise SchemaChangeError(f"column {name!r} partitions the table: its type cannot change")
        if not widens(field.type, new_type):
            raise SchemaChangeError(
                f"column {name!r} cannot change from {field.type} to {new_type}: only widening changes that keep "
                "every value exactly are allowed (a wider integer or float, an integer of up to 32 bits to "
                "float64, string to large_string, binary to large_binary, a decimal with more digits)"
            )
        changed = pa.field(name, new_type, nullable=field.nullable, metadata=field.metadata)
        if default_of(field) is not None:
            changed = with_default(changed, default_of(field).cast(new_type).as_py())  # type: ignore[union-attr]
        return next_schema(schema, _replace_field(schema, name, changed)), options

    return plan


def create_fts_index(column: str, tokenizer: str = "english") -> Plan:
    """A full-text index on a string column, with ``tokenizer``. Committed at once; superfiles written before
    it are indexed in the background and searched exactly until then. On a column indexed with another
    tokenizer, the index is replaced."""
    if tokenizer not in TOKENIZERS:
        raise InvalidOptionError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        field = _column(schema, column)
        if options.fts_columns.get(column) == tokenizer:
            return schema, options
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            raise InvalidOptionError(f"a full-text index needs a string column; {column!r} is {field.type}")
        if column in options.vector_columns:
            raise InvalidOptionError(f"column {column!r} has a vector index")
        since = schema_id(schema) + 1  # superfiles written under the next schema on carry the index
        fields = _replace_field(schema, column, with_since(field, since))
        return next_schema(schema, fields), replace(options, fts_columns={**options.fts_columns, column: tokenizer})

    return plan


def create_vector_index(column: str, metric: str = "cosine", index: Mapping[str, Any] | None = None) -> Plan:
    """A vector index on a not-null ``fixed_size_list<float32>[dim]`` column, under ``metric`` (``index``:
    ``VectorIndexParams``). Committed at once; superfiles written before it are indexed in the background and
    searched exactly until then. On a column indexed otherwise, the index is replaced."""
    params = dict(index or {})
    try:
        VectorIndexParams(**params)
    except TypeError as e:
        raise InvalidOptionError(f"invalid vector index parameters {params}: {e}") from None

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        field = _column(schema, column)
        if not is_vector_type(field.type):
            raise InvalidOptionError(
                f"a vector index needs a fixed_size_list<float32>[dim] column; {column!r} is {field.type}"
            )
        spec = VectorColumn(field.type.list_size, metric, params)
        if options.vector_columns.get(column) == spec:
            return schema, options
        if field.nullable:
            raise SchemaChangeError(
                f"column {column!r} is nullable: a vector index needs a vector in every row (add the column as "
                "not null with a default vector)"
            )
        if column in options.fts_columns:
            raise InvalidOptionError(f"column {column!r} has a full-text index")
        default = default_of(field)
        if metric == "cosine" and default is not None and not any(default.as_py() or []):
            raise InvalidVectorError(f"column {column!r}'s default is a zero vector, which cosine cannot index")
        since = schema_id(schema) + 1
        fields = _replace_field(schema, column, with_since(field, since))
        scalar = {k: v for k, v in options.scalar_indexes.items() if k != column}
        return next_schema(schema, fields), replace(
            options, vector_columns={**options.vector_columns, column: spec}, scalar_indexes=scalar
        )

    return plan


def drop_index(column: str) -> Plan:
    """Drop the full-text or vector index of a column; the column stays (a vector column's values are then
    stored in Parquet by later writes, and read from the old superfiles' blobs)."""

    def plan(schema: pa.Schema, options: TableOptions) -> tuple[pa.Schema, TableOptions]:
        field = _column(schema, column)
        if column in options.fts_columns:
            changed = replace(options, fts_columns={k: v for k, v in options.fts_columns.items() if k != column})
        elif column in options.vector_columns:
            changed = replace(options, vector_columns={k: v for k, v in options.vector_columns.items() if k != column})
        else:
            raise UnknownColumnError(f"column {column!r} has no full-text or vector index")
        return next_schema(schema, _replace_field(schema, column, with_since(field, None))), changed

    return plan


# -- indexing the superfiles written before an index ---------------------------------------------------------
_running: set[int] = set()  # id(table files) of the tables with an indexing thread
_wanted: set[int] = set()  # ... asked again since that thread last looked at the table's options
_guard = threading.Lock()


def index_in_background(table: Supertable) -> None:
    """Rewrite the table's superfiles that lack an index, on a daemon thread (one per table at a time, which
    looks again when asked while it runs); a failure is logged, and the next ``optimize`` (or index creation)
    tries again."""
    key = id(table.files)

    def run() -> None:
        try:
            while True:
                with _guard:
                    _wanted.discard(key)
                options = table.snapshot().manifest.options
                if optimize(table, select=stale(options), parallel=False)["superfiles_removed"]:
                    continue  # superfiles written meanwhile under an older schema may lack it too
                with _guard:
                    if key not in _wanted:
                        _running.discard(key)
                        return
        except Exception:
            log.exception("table %s: building indexes into existing superfiles failed", table.name)
            with _guard:
                _running.discard(key)

    with _guard:
        _wanted.add(key)
        if key in _running:
            return
        _running.add(key)
    threading.Thread(target=run, name=f"superfile-index-{table.name}", daemon=True).start()
