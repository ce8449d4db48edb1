"""Spark's types through both sinks, end to end: Spark -> the broker (tansu) -> a builder -> a table on S3 (moto).

The rate source (a ``timestamp`` column) and a typed Parquet directory (timestamps with and without a zone,
dates, decimals, binary, small integers, floats, a vector array) land in tables with the values Spark holds;
a column the engine does not store is refused naming the column and its Spark type, and a batch that cannot
be converted fails the query (nothing of it is published), never a query that runs and writes nothing.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from e2e_support import BuilderProcess, wait_until
from ingest_support import applied, failure, finish, topic_exists
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
    YearMonthIntervalType,
)
from superfile.errors import InvalidInputError, SchemaMismatchError
from superfile.options import TableOptions
from superfile.schema import user_schema
from superfile_ingest import ForeachBatchSink
from superfile_ingest.convert import check_stream
from superfile_ingest.datasource import _StreamWriter
from superfile_ingest.publish import Target
from superfile_suite import Server

SINKS = ["datasource", "foreach_batch"]
SESSION_TZ = "Asia/Kolkata"  # +05:30 and no daylight saving since 1945: a wall clock that differs from UTC
UTC = dt.UTC
DIM = 4

# What the table stores, and the Spark type each column is read as (from Parquet files).
TABLE = pa.schema(
    [
        ("id", pa.int64()),
        ("at", pa.timestamp("us", tz="UTC")),  # TIMESTAMP: the same instant
        ("at_paris", pa.timestamp("us", tz="Europe/Paris")),  # TIMESTAMP into another zone: the same instant
        ("wall", pa.timestamp("us")),  # TIMESTAMP into a column without a zone: the session's wall clock
        ("ntz", pa.timestamp("us")),  # TIMESTAMP_NTZ: the same wall clock
        ("day", pa.date32()),
        ("price", pa.decimal128(12, 4)),  # from DECIMAL(10,3): widened
        ("payload", pa.binary()),
        ("flag", pa.bool_()),
        ("tiny", pa.int8()),
        ("small", pa.int16()),
        ("ratio", pa.float32()),
        ("weight", pa.float64()),
        ("text", pa.string()),
        ("embedding", pa.list_(pa.float32())),  # a vector column: fixed_size_list<float32>[4] in the table
    ]
)
SPARK = StructType(
    [
        StructField("id", LongType()),
        StructField("at", TimestampType()),
        StructField("at_paris", TimestampType()),
        StructField("wall", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 3)),
        StructField("payload", BinaryType()),
        StructField("flag", BooleanType()),
        StructField("tiny", ByteType()),
        StructField("small", ShortType()),
        StructField("ratio", FloatType()),
        StructField("weight", DoubleType()),
        StructField("text", StringType()),
        StructField("embedding", ArrayType(FloatType())),
    ]
)
# The Parquet files' own types (Spark reads a zoned timestamp as TIMESTAMP, a zoneless one as TIMESTAMP_NTZ).
FILES = pa.schema(
    [
        ("id", pa.int64()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("at_paris", pa.timestamp("us", tz="UTC")),
        ("wall", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("day", pa.date32()),
        ("price", pa.decimal128(10, 3)),
        ("payload", pa.binary()),
        ("flag", pa.bool_()),
        ("tiny", pa.int8()),
        ("small", pa.int16()),
        ("ratio", pa.float32()),
        ("weight", pa.float64()),
        ("text", pa.string()),
        ("embedding", pa.list_(pa.float32())),
    ]
)
INSTANTS = [
    dt.datetime(2024, 3, 31, 0, 30, 0, 123456, tzinfo=UTC),  # Paris moves to summer time half an hour later
    dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC),  # before the epoch
    dt.datetime(2000, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),  # the next day in Kolkata
    dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),  # past 32-bit seconds
    dt.datetime(2024, 10, 27, 1, 0, 0, tzinfo=UTC),  # Paris back to winter time
]


def _input_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n, instant in enumerate(INSTANTS):
        rows.append(
            {
                "id": n,
                "at": instant,
                "at_paris": instant,
                "wall": instant,
                "ntz": instant.replace(tzinfo=None) + dt.timedelta(hours=n),
                "day": dt.date(1960 + 16 * n, 2, 29) if n % 2 else dt.date(1960 + 16 * n, 12, 31),
                "price": Decimal(f"{(-1) ** n * (1234567 + n)}.{n}25"),
                "payload": bytes([0, 255, n]) * (n + 1),
                "flag": n % 2 == 0,
                "tiny": -128 + n,
                "small": 32767 - n,
                "ratio": 0.25 * n,
                "weight": 1e300 / (n + 1),
                "text": f"row {n} \u00e9\u00e8 \U0001f600",
                "embedding": [float(n), 0.5, -1.25, 1e-3],
            }
        )
    # Every nullable column null (a vector column is never null).
    rows.append({"id": len(rows), **{f.name: None for f in FILES if f.name not in ("id", "embedding")}})
    rows[-1]["embedding"] = [0.0, 0.0, 0.0, 1.0]
    return rows


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the table returns it."""
    out = dict(row)
    if row["at"] is not None:
        out["wall"] = row["at"].astimezone(ZoneInfo(SESSION_TZ)).replace(tzinfo=None)
    out["embedding"] = [float(pa.scalar(v, pa.float32()).as_py()) for v in row["embedding"]]
    return out


@pytest.fixture
def session_tz(spark: SparkSession) -> Iterator[str]:
    """The session time zone set to ``SESSION_TZ`` for the test."""
    key = "spark.sql.session.timeZone"
    previous = spark.conf.get(key)
    spark.conf.set(key, SESSION_TZ)
    yield SESSION_TZ
    spark.conf.set(key, previous)


def _create(s3_uri: str, schema: pa.Schema, **kwargs: Any) -> superfile.Supertable:
    return superfile.connect(s3_uri).create_table(f"t{uuid.uuid4().hex[:8]}", schema, **kwargs)


def _writer(frame: DataFrame, sink: str, table: str, s3_uri: str, kafka: Server, checkpoint: Path) -> DataStreamWriter:
    if sink == "datasource":
        writer = frame.writeStream.format("superfile").options(table=table, storage=s3_uri, bootstrap=kafka.url)
    else:
        writer = frame.writeStream.foreachBatch(ForeachBatchSink(table=table, storage=s3_uri, bootstrap=kafka.url))
    return writer.option("checkpointLocation", str(checkpoint))


def _files(directory: Path, *parts: list[dict[str, Any]]) -> Path:
    """One Parquet file per part, modified in that order (one micro-batch each with ``maxFilesPerTrigger`` 1)."""
    directory.mkdir()
    now = time.time()
    for n, rows in enumerate(parts):
        path = directory / f"part-{n}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=FILES), path)
        os.utime(path, (now - 60 + n, now - 60 + n))
    return directory


def _typed_stream(spark: SparkSession, source: Path) -> DataFrame:
    return spark.readStream.schema(SPARK).option("maxFilesPerTrigger", 1).parquet(str(source))


def _utc(row: dict[str, Any]) -> dict[str, Any]:
    """Zoned datetimes in UTC: Python never finds an ambiguous local time (fold=1) equal to another zone's."""
    return {k: v.astimezone(UTC) if isinstance(v, dt.datetime) and v.tzinfo else v for k, v in row.items()}


def _table_rows(table: superfile.Supertable) -> list[dict[str, Any]]:
    return [_utc(r) for r in table.to_arrow().drop_columns(["_id"]).sort_by("id").to_pylist()]


@pytest.mark.parametrize("sink", SINKS)
def test_the_rate_source_streams_timestamped_rows_into_a_table(
    sink: str,
    spark: SparkSession,
    s3_uri: str,
    kafka: Server,
    builders: Callable[..., BuilderProcess],
    tmp_path: Path,
) -> None:
    """The rate source's ``timestamp`` (TIMESTAMP) and ``value`` (BIGINT), at 50 rows/s, until 50 rows are done."""
    table = _create(s3_uri, pa.schema([("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.int64())]))
    builder = builders([table.name])
    frame = spark.readStream.format("rate").option("rowsPerSecond", 50).option("numPartitions", 2).load()
    started = dt.datetime.now(UTC)
    writer = _writer(frame, sink, table.name, s3_uri, kafka, tmp_path / "checkpoint")
    query = writer.trigger(processingTime="1 second").start()

    def processed() -> int:
        if not query.isActive:
            pytest.fail(f"the query ended: {query.exception()}")
        return sum(int(p["numInputRows"]) for p in query.recentProgress)

    try:
        done: int = wait_until(lambda: (n := processed()) >= 50 and n, 120, "the query to process 50 rows")
    finally:
        query.stop()
    stopped = dt.datetime.now(UTC)
    assert query.exception() is None

    applied(table, kafka.url, builder)
    rows = table.to_arrow().sort_by("value")
    values = rows["value"].to_pylist()
    assert len(values) >= done
    assert values == list(range(len(values))), "every row once, none missing"
    stamps = rows["timestamp"].to_pylist()
    assert None not in stamps
    assert stamps == sorted(stamps)
    assert started - dt.timedelta(seconds=5) <= stamps[0] and stamps[-1] <= stopped + dt.timedelta(seconds=5)


@pytest.mark.parametrize("sink", SINKS)
def test_a_typed_parquet_source_lands_every_type_with_the_session_time_zone(
    sink: str,
    spark: SparkSession,
    session_tz: str,
    s3_uri: str,
    kafka: Server,
    builders: Callable[..., BuilderProcess],
    tmp_path: Path,
) -> None:
    table = _create(s3_uri, TABLE, vector_columns={"embedding": DIM})
    builder = builders([table.name])
    rows = _input_rows()
    source = _files(tmp_path / "src", rows[:3], rows[3:])
    writer = _writer(_typed_stream(spark, source), sink, table.name, s3_uri, kafka, tmp_path / "checkpoint")
    finish(writer.trigger(availableNow=True).start())
    logged = applied(table, kafka.url, builder)
    assert {e.seq[0] for e in logged} == {0, 1}  # two micro-batches

    got = _table_rows(table)
    assert got == [_utc(_expected(r)) for r in rows]
    assert table.schema.field("at_paris").type == pa.timestamp("us", tz="Europe/Paris")
    # The wall clock is the session's: 2000-02-29 23:59:59.999999 UTC is already March 1st in Kolkata.
    assert got[2]["wall"] == dt.datetime(2000, 3, 1, 5, 29, 59, 999999)


@pytest.mark.parametrize("sink", SINKS)
def test_a_batch_that_cannot_be_converted_fails_the_query_and_publishes_nothing(
    sink: str,
    spark: SparkSession,
    s3_uri: str,
    kafka: Server,
    builders: Callable[..., BuilderProcess],
    tmp_path: Path,
) -> None:
    """DECIMAL(10,3) into DECIMAL(9,3): the first batch fits, the second batch's 1234567.125 does not."""
    table = _create(s3_uri, TABLE.set(6, pa.field("price", pa.decimal128(9, 3))), vector_columns={"embedding": DIM})
    builder = builders([table.name])
    rows = _input_rows()
    fits = [{**r, "price": Decimal("123456.125")} for r in rows[:2]]
    source = _files(tmp_path / "src", fits, rows[2:3])
    writer = _writer(_typed_stream(spark, source), sink, table.name, s3_uri, kafka, tmp_path / "checkpoint")
    error = failure(writer.trigger(availableNow=True).start)
    assert "'price'" in error and "decimal128(9, 3)" in error, error[-2000:]
    logged = applied(table, kafka.url, builder)
    assert {e.seq[0] for e in logged} == {0}, "the failed batch published nothing"
    assert [r["id"] for r in _table_rows(table)] == [0, 1]


# Spark types the engine cannot store (the error names each as Spark shows it).
REFUSED: list[DataType] = [
    StructType([StructField("a", LongType()), StructField("b", StringType())]),
    MapType(StringType(), LongType()),
    ArrayType(StringType()),
    ArrayType(FloatType()),  # an array, but 'meta' is not a vector column
    DayTimeIntervalType(),
    YearMonthIntervalType(),
    VariantType(),
]
META = pa.schema([pa.field("_id", pa.uint64(), False), pa.field("id", pa.int64()), pa.field("meta", pa.string())])


@pytest.mark.parametrize("spark_type", REFUSED, ids=lambda t: t.simpleString())
def test_a_spark_type_the_engine_does_not_store_is_refused_naming_the_column(spark_type: DataType) -> None:
    stream = StructType([StructField("id", LongType()), StructField("meta", spark_type)])
    expected = f"column 'meta' has Spark type {spark_type.simpleString()};"
    with pytest.raises(SchemaMismatchError, match=re.escape(expected)):
        check_stream(stream, META, TableOptions())


def test_a_column_the_engine_does_not_store_fails_the_query_before_anything_is_published(
    spark: SparkSession, s3_uri: str, kafka: Server, tmp_path: Path
) -> None:
    rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    table = _create(s3_uri, user_schema(META))
    frame = rate.selectExpr("value AS id", "named_struct('a', value, 'b', 'x') AS meta")
    error = failure(_writer(frame, "datasource", table.name, s3_uri, kafka, tmp_path / "struct").start)
    assert "column 'meta' has Spark type struct<a:bigint,b:string>; " in error, error[-2000:]

    # A zoneless TIMESTAMP_NTZ into a column of instants: which zone it means is the job's to say.
    zoned = _create(s3_uri, pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC"))]))
    frame = rate.selectExpr("value AS id", "cast(timestamp AS timestamp_ntz) AS at")
    error = failure(_writer(frame, "foreach_batch", zoned.name, s3_uri, kafka, tmp_path / "ntz").start)
    assert "column 'at' has Spark type timestamp_ntz" in error, error[-2000:]
    assert not topic_exists(kafka.url, table.name) and not topic_exists(kafka.url, zoned.name)


def test_a_commit_without_the_rows_of_every_task_raises() -> None:
    """Spark hands ``commit`` one message per task; a message that is not a task's rows must not pass as none."""
    writer = _StreamWriter(Target("t", "file:///nowhere", "127.0.0.1:1"), META, TableOptions())
    with pytest.raises(InvalidInputError, match="commit message"):
        writer.commit([None], 0)
    writer.commit([], 0)  # a micro-batch of no partitions: nothing to publish
