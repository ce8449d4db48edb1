"""Spark's types to the table's: the one mapping both sinks apply, checked when a query starts, applied to every batch.

:func:`check_stream` runs on the Spark schema before any row moves (the data
source at query start, ``ForeachBatchSink`` at a batch whose schema it has not
checked yet): a column of a type the engine does not store fails the query with
an error naming the column and its Spark type, and the engine's own ``coerce``
then checks the columns against the table (unknown, missing, incompatible).
:func:`conform` converts one batch's Arrow data to the table's schema; a value
that does not fit (a decimal too wide, an integer out of range, a timestamp
finer than the column's unit) raises, so the batch, and with it the query,
fails and nothing of the batch is published.

Timestamps. Spark's ``TIMESTAMP`` is an instant; Spark hands it to Python
tagged with the session time zone (``spark.sql.session.timeZone``; the data
source's Arrow batches) or with UTC (``DataFrame.toArrow``, which
``ForeachBatchSink`` uses; it passes the session zone explicitly). Into a table
column with a zone it is the same instant; into a column without a zone it is
the wall clock in the session time zone, as Spark's own ``CAST(ts AS
TIMESTAMP_NTZ)`` and ``df.show()`` give it. ``TIMESTAMP_NTZ`` (a wall clock)
goes into a column without a zone unchanged and is refused by a column with
one: which zone it is in is for the query to say.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    CalendarIntervalType,
    CharType,
    DataType,
    DayTimeIntervalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructType,
    UserDefinedType,
    VarcharType,
    VariantType,
    YearMonthIntervalType,
)
from superfile.errors import SchemaMismatchError
from superfile.options import TableOptions
from superfile.schema import coerce, user_schema

__all__ = ["SESSION_TIME_ZONE", "check_stream", "conform", "stream_arrow_schema"]

SESSION_TIME_ZONE = "spark.sql.session.timeZone"

_VECTOR_ELEMENTS = (FloatType, DoubleType, ByteType, ShortType, IntegerType, LongType)
_NESTED = "the engine stores no nested columns (only a vector column is an array, of numbers)"
# Spark types the engine cannot store, and what to write instead ({name}: the column).
_REFUSED: tuple[tuple[type[DataType] | tuple[type[DataType], ...], str], ...] = (
    (StructType, _NESTED + ": select its fields as columns ({name}.field AS {name}_field) or store to_json({name})"),
    (MapType, _NESTED + ": store to_json({name}), or select the keys you need as columns"),
    (ArrayType, _NESTED + ": make it a vector column of the table, or store to_json({name})"),
    (VariantType, "the engine stores no variant values: store to_json({name})"),
    (
        (DayTimeIntervalType, YearMonthIntervalType, CalendarIntervalType),
        "the engine stores no intervals: store a number (seconds, months) or CAST({name} AS STRING)",
    ),
)


def _spark_arrow_type(name: str, spark: DataType, vector: bool) -> pa.DataType:
    """The Arrow type Spark hands a column over as (``TIMESTAMP`` tagged UTC), or a clear refusal."""
    if isinstance(spark, UserDefinedType):
        spark = spark.sqlType()
    shown = spark.simpleString()
    if vector:
        if isinstance(spark, ArrayType) and isinstance(spark.elementType, _VECTOR_ELEMENTS):
            return pa.list_(to_arrow_type(spark.elementType))
        raise SchemaMismatchError(
            f"column {name!r} has Spark type {shown}; a vector column takes an array of numbers "
            "(array<float>, array<double> or an array of integers)"
        )
    if isinstance(spark, (CharType, VarcharType)):
        return pa.string()  # Spark holds them as strings (pyspark has no Arrow form of its own for them)
    for kinds, hint in _REFUSED:
        if isinstance(spark, kinds):
            raise SchemaMismatchError(f"column {name!r} has Spark type {shown}; {hint.format(name=name)}")
    try:
        return to_arrow_type(spark, timezone="UTC")
    except Exception as exc:  # pyspark raises its own error classes for types without an Arrow form
        raise SchemaMismatchError(f"column {name!r} has Spark type {shown}, which has no Arrow form: {exc}") from None


def stream_arrow_schema(spark: StructType, options: TableOptions) -> pa.Schema:
    """The Arrow schema of a stream's batches (``TIMESTAMP`` as UTC), refusing types the engine does not store."""
    return pa.schema(
        [
            pa.field(f.name, _spark_arrow_type(f.name, f.dataType, f.name in options.vector_columns), f.nullable)
            for f in spark.fields
        ]
    )


def _ntz_refusal(name: str, target: pa.DataType) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"column {name!r} has Spark type timestamp_ntz (a wall clock without a time zone) and the table stores "
        f"instants ({target}); say which zone it is in: to_utc_timestamp({name}, 'Area/City'), or "
        f"CAST({name} AS TIMESTAMP) for the session time zone"
    )


def check_stream(spark: StructType, schema: pa.Schema, options: TableOptions) -> None:
    """Raise ``SchemaMismatchError`` unless batches of ``spark`` can be written to the table (``schema``)."""
    # Conforming no rows of the stream's schema runs every column check the engine makes.
    conform(stream_arrow_schema(spark, options).empty_table(), schema, options)


def _wall_clock(name: str, column: pa.ChunkedArray, zone: str) -> pa.ChunkedArray:
    """Instants as the wall clock of ``zone`` (timestamps without a zone)."""
    try:
        zoned: Any = column.cast(pa.timestamp(column.type.unit, tz=zone))  # pyarrow's stubs want the unit literal
        wall: pa.ChunkedArray = pc.local_timestamp(zoned)
        return wall
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(f"column {name!r}: cannot take the wall clock of time zone {zone!r}: {exc}") from None


def conform(
    data: pa.Table | pa.RecordBatch, schema: pa.Schema, options: TableOptions, time_zone: str | None = None
) -> pa.Table:
    """One batch of a stream in the table's user schema (no ``_id``), or ``SchemaMismatchError`` and nothing.

    ``time_zone``: the session time zone, for instants going into columns without a zone; ``None`` takes the
    zone each column is tagged with (the data source's batches carry the session's).
    """
    rows = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    target = user_schema(schema)
    columns: list[pa.ChunkedArray] = []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        if name in target.names and name not in options.vector_columns:
            want = target.field(name).type
            if pa.types.is_timestamp(column.type) and pa.types.is_timestamp(want):
                if column.type.tz is not None and want.tz is None:
                    column = _wall_clock(name, column, time_zone or column.type.tz)
                elif column.type.tz is None and want.tz is not None:
                    raise _ntz_refusal(name, want)
        columns.append(column)
    return coerce(pa.table(columns, names=rows.column_names), schema, options)
