"""Table schemas and input coercion: bad input is rejected here, before anything is written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from superfile.arrow_input import CHUNK_BYTES, chunks, to_table
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidVectorError,
    SchemaMismatchError,
    VectorDimensionError,
)
from superfile.evolution import default_of, filled, former_names, identified, plain, plain_field
from superfile.options import TableOptions

__all__ = [
    "ID",
    "SCORE",
    "check_column_name",
    "check_column_type",
    "coerce",
    "coerce_chunks",
    "is_vector_type",
    "rows_schema",
    "table_schema",
    "to_arrow_table",
    "user_schema",
]

ID = "_id"
SCORE = "score"
_ID_FIELD = pa.field(ID, pa.uint64(), nullable=False)


MAX_COLUMN_NAME = 255


def check_column_name(name: str) -> None:
    """A user column's name: not reserved, printable, at most ``MAX_COLUMN_NAME`` characters."""
    if not isinstance(name, str) or name.startswith("_") or name == SCORE or not name:
        raise InvalidOptionError(
            f"column name {name!r} is reserved (names starting with '_' and 'score' are the table's)"
        )
    if len(name) > MAX_COLUMN_NAME or not name.isprintable():
        # the name is checked in full, as a table name is: "a\n" must not pass as a second "a"
        raise InvalidOptionError(f"invalid column name {name!r}: use at most {MAX_COLUMN_NAME} printable characters")


def is_vector_type(t: pa.DataType) -> bool:
    """A column of vectors a vector index can be built on: ``fixed_size_list<float32>[dim]``."""
    return pa.types.is_fixed_size_list(t) and t.value_type == pa.float32()


def check_column_type(f: pa.Field) -> None:
    """A column type the table stores: no nested types but dictionaries and vectors
    (``fixed_size_list<float32>[dim]``, which a vector index may be created on later)."""
    if pa.types.is_nested(f.type) and not pa.types.is_dictionary(f.type) and not is_vector_type(f.type):
        raise InvalidOptionError(
            f"column {f.name!r} has nested type {f.type}; only vector columns (fixed_size_list<float32>) may be lists"
        )


def table_schema(schema: pa.Schema, options: TableOptions) -> pa.Schema:
    """The stored schema: ``_id`` first, vector columns as ``fixed_size_list<float32>[dim]``, a field id on
    every column (``superfile.evolution``; a schema read back from another table gets fresh ones)."""
    if not isinstance(schema, pa.Schema):
        raise InvalidInputError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if len(set(schema.names)) != len(schema.names):
        raise InvalidOptionError(f"schema has duplicate column names: {schema.names}")
    fields: list[pa.Field] = []
    for f in schema:
        f = plain_field(f)
        if f.name == ID and len(fields) == 0 and f.type == pa.uint64():
            continue  # a schema read back from a table already has _id
        check_column_name(f.name)
        if f.name in options.vector_columns:
            dim = options.vector_columns[f.name].dim
            fields.append(pa.field(f.name, pa.list_(pa.float32(), dim), nullable=False))
        else:
            check_column_type(f)
            fields.append(f)
    out = identified(plain(pa.schema([_ID_FIELD, *fields]).with_metadata(schema.metadata or {})))
    options.check_schema(out)
    return out


def user_schema(schema: pa.Schema) -> pa.Schema:
    """The table schema without ``_id`` (and without the table's own field metadata): what callers supply on
    append."""
    return plain(schema.remove(schema.get_field_index(ID)))


def to_arrow_table(data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """``data`` as one table: a pyarrow Table or RecordBatch, a list of dicts (typed by ``schema`` when given),
    a dict of columns, anything exporting ``__arrow_c_stream__`` or ``__arrow_c_array__`` (polars, pandas,
    DuckDB, readers), or an iterator of record batches, read to its end. See ``superfile.arrow_input``."""
    return to_table(data, schema)


def _compatible(src: pa.DataType, dst: pa.DataType) -> bool:
    if src == dst or pa.types.is_null(src):
        return True
    kinds = (
        (pa.types.is_integer, pa.types.is_integer),
        (pa.types.is_integer, pa.types.is_floating),
        (pa.types.is_floating, pa.types.is_floating),
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),) * 2,
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),) * 2,
        (pa.types.is_timestamp, pa.types.is_timestamp),
        (pa.types.is_date, pa.types.is_date),
        (pa.types.is_decimal, pa.types.is_decimal),
        (pa.types.is_dictionary, lambda t: True),
    )
    return any(a(src) and b(dst) for a, b in kinds)


def _coerce_vector(name: str, col: pa.ChunkedArray | pa.Array, dim: int, *, nullable: bool = False) -> pa.Array:
    """Vectors of ``dim`` finite float32s; null rows only in a ``nullable`` column (a vector-shaped column
    without a vector index)."""
    arr = col if isinstance(col, pa.Array) else col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = arr.type
    if nullable and arr.null_count:
        missing = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
        valid = _coerce_vector(name, arr.filter(pa.array(~missing)), dim)
        matrix = np.zeros((len(arr), dim), np.float32)
        flat = np.asarray(pc.list_flatten(valid).to_numpy(zero_copy_only=False), np.float32)
        matrix[~missing] = flat.reshape(-1, dim)
        return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), dim, mask=pa.array(missing))
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise SchemaMismatchError(f"vector column {name!r} must hold lists of floats, got {t}")
    if arr.null_count:
        raise InvalidVectorError(f"vector column {name!r} has {arr.null_count} null vectors")
    if len(arr) == 0:
        return pa.FixedSizeListArray.from_arrays(pa.array([], pa.float32()), dim)
    lengths = np.asarray(pc.list_value_length(arr).to_numpy(zero_copy_only=False))
    bad = np.flatnonzero(lengths != dim)
    if bad.size:
        raise VectorDimensionError(
            f"vector column {name!r} expects {dim} values per vector; row {int(bad[0])} has {int(lengths[bad[0]])}"
        )
    values = pc.list_flatten(arr)
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise SchemaMismatchError(f"vector column {name!r} must hold numbers, got {values.type}")
    if values.null_count:
        raise InvalidVectorError(f"vector column {name!r} has null components")
    flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
    if not np.isfinite(flat).all():
        row = int(np.flatnonzero(~np.isfinite(flat))[0]) // dim
        raise InvalidVectorError(f"vector column {name!r} has NaN or infinite values (row {row})")
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim)


def coerce(data: Any, schema: pa.Schema, options: TableOptions) -> pa.Table:
    """Validate and convert user data to the table's user schema (no ``_id``), or raise a typed error.
    A streamed input is read whole; ``coerce_chunks`` reads it in bounded pieces."""
    parts = list(coerce_chunks(data, schema, options, max_bytes=1 << 62))
    if not parts:
        return user_schema(schema).empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def coerce_chunks(
    data: Any, schema: pa.Schema, options: TableOptions, max_bytes: int | None = None
) -> Iterator[pa.Table]:
    """``coerce`` one chunk at a time: a stream is read lazily in pieces of about ``max_bytes`` (by default
    the smaller of the table's ``write_buffer_bytes`` and ``arrow_input.CHUNK_BYTES``), each validated and
    converted as it arrives. A chunk that does not match raises, after the earlier ones were yielded."""
    target = user_schema(schema)
    defaults = {f.name: f for f in schema if default_of(f) is not None}  # columns an input may leave out
    former = former_names(schema)
    if max_bytes is None:
        max_bytes = min(options.write_buffer_bytes, CHUNK_BYTES)
    for table in chunks(data, rows_schema(schema, data), max_bytes):
        yield _coerce_table(_current_names(table, target, former), target, options, defaults)


def _current_names(table: pa.Table, target: pa.Schema, former: dict[str, str | None]) -> pa.Table:
    """Input columns under names the table's columns had before a rename take their current names; those of
    columns dropped since are left out (a writer that had not seen the change: its rows were valid then)."""
    stale = [n for n in table.column_names if n not in target.names and n in former]
    if not stale:
        return table
    gone = [n for n in stale if former[n] is None or former[n] in table.column_names]
    table = table.drop_columns(gone) if gone else table
    names = {n: former[n] for n in stale if n not in gone}
    return table.rename_columns([names.get(n) or n for n in table.column_names]) if names else table


def rows_schema(schema: pa.Schema, data: Any) -> pa.Schema:
    """The schema a list of row dicts is typed by (the user schema): a column with a default that no row
    names is left out, so the rows get its default rather than nulls."""
    target = user_schema(schema)
    missing = {f.name for f in schema if default_of(f) is not None}
    if missing and isinstance(data, list):
        named = set().union(*(r.keys() for r in data if isinstance(r, dict)))
        target = pa.schema([f for f in target if f.name in named or f.name not in missing])
    return target


def _coerce_table(
    table: pa.Table, target: pa.Schema, options: TableOptions, defaults: dict[str, pa.Field] | None = None
) -> pa.Table:
    if ID in table.column_names:
        raise SchemaMismatchError(f"{ID!r} is assigned by the table and cannot be supplied")
    extra = [n for n in table.column_names if n not in target.names]
    if extra:
        raise SchemaMismatchError(f"unknown columns {extra}; the table has {target.names}")
    if len(set(table.column_names)) != len(table.column_names):
        raise SchemaMismatchError(f"duplicate columns in data: {table.column_names}")
    columns: list[pa.Array | pa.ChunkedArray] = []
    for f in target:
        if f.name not in table.column_names:
            if defaults and f.name in defaults:
                columns.append(filled(defaults[f.name], table.num_rows))
                continue
            if not f.nullable:
                raise SchemaMismatchError(f"required column {f.name!r} is missing")
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        if f.name in options.vector_columns:
            columns.append(_coerce_vector(f.name, col, options.vector_columns[f.name].dim))
            continue
        if is_vector_type(f.type):  # a vector-shaped column without an index: checked as vectors, nulls allowed
            if col.null_count and not f.nullable:
                raise SchemaMismatchError(f"column {f.name!r} is not nullable but has {col.null_count} nulls")
            columns.append(_coerce_vector(f.name, col, f.type.list_size, nullable=f.nullable))
            continue
        if col.type != f.type:
            if not _compatible(col.type, f.type):
                raise SchemaMismatchError(f"column {f.name!r} has type {col.type}, the table expects {f.type}")
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaMismatchError(f"column {f.name!r} cannot be converted to {f.type}: {e}") from None
        if not f.nullable and col.null_count:
            raise SchemaMismatchError(f"column {f.name!r} is not nullable but has {col.null_count} nulls")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=target)
