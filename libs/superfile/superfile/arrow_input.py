"""What ``append``, ``update`` and ``create_table`` accept, read without importing the library that made it.

In memory already: a pyarrow ``Table`` or ``RecordBatch``, a list of dicts (rows), a dict of columns, an
object exporting one record batch (``__arrow_c_array__``).

Streamed, read batch by batch: anything exporting the Arrow PyCapsule stream interface
(``__arrow_c_stream__``: polars and pandas DataFrames, DuckDB relations, pyarrow ``RecordBatchReader`` and
``Dataset`` scanners, nanoarrow and arro3 objects, ...), an iterator (or generator) of record batches or of
such exporters, and a list of record batches. ``chunks`` turns a stream into tables of a bounded size as it
reads it, so a writer can stage a large input without holding all of it.

Which library produced the data is never asked: no class names, no imports of polars, pandas or DuckDB.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from superfile.errors import InvalidInputError, SchemaMismatchError

__all__ = ["CHUNK_BYTES", "chunks", "is_streamed", "schema_and_data", "to_table"]

CHUNK_BYTES = 64 * 1024 * 1024  # the largest chunk ``chunks`` yields from a stream, before a writer's own limit

ACCEPTED = (
    "data must be a pyarrow Table or RecordBatch, a list of dicts, a dict of columns, an object exporting "
    "Arrow's C stream interface (__arrow_c_stream__: a polars or pandas DataFrame, a DuckDB relation, a "
    "RecordBatchReader) or an iterator of record batches"
)

_PANDAS_INDEX = re.compile(r"__index_level_\d+__")


def _exports_stream(obj: object) -> bool:
    return hasattr(type(obj), "__arrow_c_stream__")


def _exports_batch(obj: object) -> bool:
    return hasattr(type(obj), "__arrow_c_array__")


def _batch_like(obj: object) -> bool:
    return isinstance(obj, (pa.RecordBatch, pa.Table)) or _exports_stream(obj) or _exports_batch(obj)


def is_streamed(data: Any) -> bool:
    """True when ``data`` is read as a stream (possibly once only) rather than being a table in memory."""
    if isinstance(data, (pa.Table, pa.RecordBatch, dict, str, bytes)):
        return False
    if isinstance(data, list):
        return bool(data) and all(_batch_like(x) for x in data)
    return _exports_stream(data) or (not _exports_batch(data) and isinstance(data, Iterator))


def _open(data: Any) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]]:
    """A streamed input's schema (None when only its batches tell) and its batches, read lazily."""
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if _exports_stream(data):
        reader = _reader(data)
        return reader.schema, iter(reader)
    return None, _flatten(data)


def _reader(obj: Any) -> pa.RecordBatchReader:
    try:
        return pa.RecordBatchReader.from_stream(obj)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise InvalidInputError(f"cannot read {type(obj).__name__} as a stream of record batches: {e}") from None


def _flatten(items: Iterable[Any]) -> Iterator[pa.RecordBatch]:
    """The record batches of an iterable of batches, tables, stream exporters and batch exporters."""
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
        elif isinstance(item, pa.Table):
            yield from item.to_batches()
        elif _exports_stream(item):
            yield from _reader(item)
        elif _exports_batch(item):
            yield _record_batch(item)
        else:
            raise InvalidInputError(
                f"an iterator given as data must yield record batches (or objects with __arrow_c_stream__ or "
                f"__arrow_c_array__), got {type(item).__name__}"
            )


def _record_batch(obj: Any) -> pa.RecordBatch:
    try:
        return pa.record_batch(obj)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise InvalidInputError(f"cannot read {type(obj).__name__} as a record batch: {e}") from None


def _without_pandas_index(table: pa.Table) -> pa.Table:
    """Drop the columns pyarrow makes of a pandas DataFrame's unnamed index (a named index stays: it is data)."""
    meta = table.schema.metadata
    if not meta or b"pandas" not in meta:
        return table
    try:
        index = json.loads(meta[b"pandas"]).get("index_columns", [])
    except (ValueError, AttributeError):
        return table
    drop = [c for c in index if isinstance(c, str) and _PANDAS_INDEX.fullmatch(c) and c in table.column_names]
    return table.drop_columns(drop) if drop else table


# View types and the offset-based types the engine stores for them (polars exports strings as string_view).
# Not list views: pyarrow 26 casts them to lists with invalid offsets.
_VIEWS: dict[pa.DataType, pa.DataType] = {
    pa.string_view(): pa.string(),
    pa.binary_view(): pa.binary(),
}


def _normalized(table: pa.Table) -> pa.Table:
    """``table`` without a pandas index column and with view types cast to the types the engine stores."""
    table = _without_pandas_index(table)
    views = [i for i, f in enumerate(table.schema) if f.type in _VIEWS]
    if not views:
        return table
    plain = table.schema
    for i in views:
        plain = plain.set(i, plain.field(i).with_type(_VIEWS[plain.field(i).type]))
    try:
        return table.cast(plain)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"cannot convert the input's view types: {e}") from None


def _in_memory(data: Any, rows_schema: pa.Schema | None) -> pa.Table:
    """A table from input that is not streamed (``rows_schema`` types a list of dicts when given)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, list):
        if not all(isinstance(r, dict) for r in data):
            raise InvalidInputError("a list given as data must hold dicts (rows) or record batches")
        if rows_schema is not None:
            extra = set().union(*(r.keys() for r in data)) - set(rows_schema.names) if data else set()
            if extra:
                raise SchemaMismatchError(f"unknown columns {sorted(extra)}; the table has {rows_schema.names}")
            try:
                return pa.Table.from_pylist(data, schema=rows_schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                raise SchemaMismatchError(f"rows do not match the table schema: {e}") from None
        return pa.Table.from_pylist(data)
    if isinstance(data, dict):
        try:
            return pa.table(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise InvalidInputError(f"cannot build a table from the given columns: {e}") from None
    if _exports_batch(data):
        return pa.Table.from_batches([_record_batch(data)])
    raise InvalidInputError(f"{ACCEPTED}, got {type(data).__name__}")


def _slices(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in zero-copy slices of at most about ``max_bytes`` (one producer chunk can be huge)."""
    if batch.nbytes <= max_bytes or batch.num_rows <= 1:
        yield batch
        return
    step = max(1, batch.num_rows * max_bytes // batch.nbytes)
    for start in range(0, batch.num_rows, step):
        yield batch.slice(start, step)


def chunks(data: Any, rows_schema: pa.Schema | None = None, max_bytes: int = CHUNK_BYTES) -> Iterator[pa.Table]:
    """``data`` as tables. Input in memory is one table; a stream is read lazily into tables of about
    ``max_bytes`` (each of one schema; batches whose schema changes start a new table). A stream with a
    schema and no rows yields one empty table of that schema (so it is still checked); an empty iterator
    yields nothing. ``rows_schema`` types a list of dicts."""
    if not is_streamed(data):
        yield _normalized(_in_memory(data, rows_schema))
        return
    schema, batches = _open(data)
    held: list[pa.RecordBatch] = []
    size = 0
    yielded = False
    for batch in batches:
        for part in _slices(batch, max_bytes):
            if held and part.schema != held[0].schema:
                yield _normalized(pa.Table.from_batches(held))
                held, size, yielded = [], 0, True
            held.append(part)
            size += part.nbytes
            if size >= max_bytes:
                yield _normalized(pa.Table.from_batches(held))
                held, size, yielded = [], 0, True
    if held:
        yield _normalized(pa.Table.from_batches(held))
    elif not yielded and schema is not None:
        yield _normalized(schema.empty_table())


def to_table(data: Any, rows_schema: pa.Schema | None = None) -> pa.Table:
    """``data`` whole, as one table (a stream is read to its end)."""
    parts = list(chunks(data, rows_schema, max_bytes=1 << 62))
    if not parts:
        return pa.table({})
    if len(parts) == 1:
        return parts[0]
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise InvalidInputError(f"the batches of the input do not share one schema: {e}") from None


def schema_and_data(data: Any) -> tuple[pa.Schema, Any]:
    """The schema of ``data``, and data to read in its place that still holds every row: a stream is opened
    once (its first batch read when only that tells the schema), so a reader or a generator is not spent
    on the schema. For ``create_table(data=...)``, which needs the schema before it appends."""
    if not is_streamed(data):
        table = next(chunks(data))
        return table.schema, table
    schema, batches = _open(data)
    if schema is not None:  # one schema for every batch: a reader keeps it, and an empty stream its check
        rest: Any = pa.RecordBatchReader.from_batches(schema, batches)
    else:
        first = next(batches, None)
        if first is None:
            raise InvalidInputError("cannot take a schema from an empty iterator: give a schema")
        schema, rest = first.schema, itertools.chain([first], batches)
    return _normalized(schema.empty_table()).schema, rest
