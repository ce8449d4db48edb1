"""Spark Structured Streaming -> the broker (tansu) -> a builder -> a table on the S3 server (moto).

Real Spark in local mode streams the bundled Cranfield sample; a real builder
subprocess applies the events. A test waits until the manifest records every
offset of the topic (all events applied or skipped), then reads the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from e2e_support import BuilderProcess, wait_until
from ingest_support import QUERY_TIMEOUT_S, applied, events, failure, finish, topic_exists
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery
from superfile.errors import TableNotFoundError
from superfile.events import Event, EventLog, topic_for
from superfile.schema import coerce
from superfile.telemetry import render
from superfile_gateway import BackgroundServer, Settings
from superfile_ingest import ForeachBatchSink, source_for
from superfile_ingest.example import stream_files
from superfile_ingest.metrics import instrument
from superfile_ingest.publish import canonical, chunks, publish_batch
from superfile_suite import Server, free_port

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"
DOCS = pq.read_table(CRANFIELD / "docs.parquet")
QUERIES = pq.read_table(CRANFIELD / "queries.parquet").slice(0, 5)
PROJECTION = ["id", "title"]


def _create(s3_uri: str, schema: pa.Schema = DOCS.schema) -> superfile.Supertable:
    name = f"cran{uuid.uuid4().hex[:8]}"
    db = superfile.connect(s3_uri)
    return db.create_table(name, schema, fts_columns=["title", "text"], vector_columns={"embedding": 384})


def _parquet_files(directory: Path, rows: pa.Table, parts: int) -> Path:
    directory.mkdir()
    size = -(-rows.num_rows // parts)
    for n in range(parts):
        pq.write_table(rows.slice(n * size, size), directory / f"part-{n}.parquet")
    return directory


def _ingest_metric(name: str, query: str) -> float | None:
    """One series of ``superfile_ingest_<name>`` for a query, from this process's metrics."""
    for line in render().decode().splitlines():
        if line.startswith(f"superfile_ingest_{name}{{") and f'query="{query}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _assert_holds_exactly(table: superfile.Supertable, expected: pa.Table) -> None:
    """Every expected row once, nothing else, values unchanged."""
    got = table.to_arrow().drop_columns(["_id"]).sort_by("id")
    assert got.num_rows == expected.num_rows
    assert len(set(got["id"].to_pylist())) == got.num_rows
    assert got.equals(expected.sort_by("id").cast(got.schema))


@pytest.mark.parametrize("sink", ["datasource", "foreach_batch"])
def test_cranfield_streams_into_a_table_searchable_alike_over_rest_sdk_and_embedded(
    sink: str,
    spark: SparkSession,
    s3_uri: str,
    kafka: Server,
    builders: Callable[..., BuilderProcess],
    tmp_path: Path,
) -> None:
    table = _create(s3_uri)
    builder = builders([table.name])
    instrument(spark)
    query = stream_files(
        spark,
        source_dir=str(_parquet_files(tmp_path / "src", DOCS, 4)),
        file_format="parquet",
        table=table.name,
        storage=s3_uri,
        bootstrap=kafka.url,
        checkpoint=str(tmp_path / "checkpoint"),
        max_files_per_trigger=1,
        once=True,
        sink=sink,
    )
    finish(query)
    logged = applied(table, kafka.url, builder)
    assert {e.source for e in logged} == {source_for(str(query.id))}
    seqs = [e.seq for e in logged]
    assert seqs == sorted(set(seqs)), "a query's seqs reach the log in increasing order"
    assert {s[0] for s in seqs} == {0, 1, 2, 3}  # one micro-batch per file
    _assert_holds_exactly(table, DOCS)
    # The job's /metrics, from Spark's progress reports on the driver (listener events arrive asynchronously).
    wait_until(
        lambda: (
            _ingest_metric("rows_total", table.name) == DOCS.num_rows
            and _ingest_metric("batches_total", table.name) == 4
        ),
        30,
        f"the ingest metrics of {table.name}",
    )
    assert _ingest_metric("processed_rows_per_second", table.name) > 0

    settings = Settings(storage=s3_uri, kafka=kafka.url, auth=False)
    with (
        BackgroundServer(settings) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as http,
        superfile.connect(gateway.url) as sdk,
    ):
        remote = sdk.open_table(table.name)
        url = f"/tables/{table.name}/search"
        for text, vector in zip(QUERIES["text"].to_pylist(), QUERIES["embedding"].to_pylist(), strict=True):
            bm25 = table.bm25_search("text", text, k=10, projection=PROJECTION)
            assert bm25.num_rows == 10
            assert remote.bm25_search("text", text, k=10, projection=PROJECTION).equals(bm25)
            body = {"column": "text", "query": text, "k": 10, "projection": PROJECTION}
            assert http.post(f"{url}/bm25", json=body).json()["rows"] == bm25.to_pylist()

            nearest = table.vector_search("embedding", vector, k=10, projection=PROJECTION)
            assert nearest.num_rows == 10
            assert remote.vector_search("embedding", vector, k=10, projection=PROJECTION).equals(nearest)
            body = {"column": "embedding", "vector": vector, "k": 10, "projection": PROJECTION}
            assert http.post(f"{url}/vector", json=body).json()["rows"] == nearest.to_pylist()

        tokens = ["boundary", "layer", "shock"]
        matched = table.token_match("text", tokens, projection=PROJECTION).sort_by("id")
        assert 0 < matched.num_rows < DOCS.num_rows
        assert remote.token_match("text", tokens, projection=PROJECTION).sort_by("id").equals(matched)
        body = {"column": "text", "tokens": tokens, "projection": PROJECTION}
        rows = http.post(f"{url}/token_match", json=body).json()["rows"]
        assert sorted(rows, key=lambda r: r["id"]) == matched.to_pylist()


@pytest.mark.parametrize("sink", ["datasource", "foreach_batch"])
def test_a_replayed_micro_batch_is_not_duplicated(
    sink: str,
    spark: SparkSession,
    s3_uri: str,
    kafka: Server,
    builders: Callable[..., BuilderProcess],
    tmp_path: Path,
) -> None:
    table = _create(s3_uri)
    builder = builders([table.name])
    source = tmp_path / "src"
    source.mkdir()
    # Two micro-batches (one file each, in modification order); the second is big enough to travel as two events.
    pq.write_table(DOCS.slice(0, 200), source / "part-0.parquet")
    pq.write_table(DOCS.slice(200), source / "part-1.parquet")
    older = time.time() - 60
    os.utime(source / "part-0.parquet", (older, older))
    checkpoint = tmp_path / "checkpoint"

    def start() -> StreamingQuery:
        return stream_files(
            spark,
            source_dir=str(source),
            file_format="parquet",
            table=table.name,
            storage=s3_uri,
            bootstrap=kafka.url,
            checkpoint=str(checkpoint),
            max_files_per_trigger=1,
            once=True,
            sink=sink,
        )

    first = finish(start())
    published = events(kafka.url, topic_for(table.name))
    original = [e for e in published if e.seq[0] == 1]
    assert [e.seq for e in published] == [(0, 0), (1, 0), (1, 1)]

    # Spark re-runs a micro-batch whose offsets are logged but whose commit is not: as after a crash
    # between publishing the batch and recording it as done.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink()
    second = finish(start())
    assert second.id == first.id and second.runId != first.runId  # the same query, resumed

    logged = applied(table, kafka.url, builder)
    _assert_holds_exactly(table, DOCS)
    replayed = logged[len(published) :]
    assert len(replayed) == 2, "the restarted query published batch 1 again"
    assert [(e.source, e.seq) for e in replayed] == [(e.source, e.seq) for e in original]
    assert [e.data for e in replayed] == [e.data for e in original]  # the same rows, chunked the same way


def test_a_partly_published_batch_is_completed_exactly_whatever_the_replay_row_order(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess]
) -> None:
    """A first run that got only the batch's first event out, then a replay whose partitions came in another order."""
    table = _create(s3_uri)
    builder = builders([table.name])
    rows = coerce(DOCS, table.schema, table.options)
    first_chunk = chunks(canonical(rows))[0]
    assert 0 < first_chunk.num_rows < rows.num_rows
    log = EventLog(kafka.url)
    try:
        log.publish(Event("append", table.name, source_for("q1"), (0, 0), first_chunk))  # then the driver died
        shuffled = rows.take(np.random.default_rng(7).permutation(rows.num_rows))
        publish_batch(log, table.name, "q1", 0, shuffled)
    finally:
        log.close()
    applied(table, kafka.url, builder)
    _assert_holds_exactly(table, DOCS)


def test_the_example_job_streams_json_files(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], tmp_path: Path
) -> None:
    """``python -m superfile_ingest.example`` as documented, in its own process (its own Spark)."""
    table = _create(s3_uri)
    builder = builders([table.name])
    rows = DOCS.slice(0, 300)
    source = tmp_path / "json"
    source.mkdir()
    for n, part in enumerate((rows.slice(0, 150), rows.slice(150))):
        (source / f"part-{n}.json").write_text("".join(json.dumps(r) + "\n" for r in part.to_pylist()))
    argv = [
        *(sys.executable, "-m", "superfile_ingest.example", "--source-dir", str(source), "--format", "json"),
        *("--table", table.name, "--storage", s3_uri, "--bootstrap", kafka.url),
        *("--checkpoint", str(tmp_path / "checkpoint"), "--once", "--metrics-port", str(port := free_port())),
    ]
    job = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    assert job.returncode == 0, job.stderr[-4000:]
    assert f"streaming {source} into {table.name}" in job.stdout
    assert f"metrics at http://127.0.0.1:{port}/metrics" in job.stdout
    applied(table, kafka.url, builder)
    _assert_holds_exactly(table, rows)


def test_a_missing_table_or_mismatched_schema_fails_the_query_clearly(
    spark: SparkSession, s3_uri: str, kafka: Server, tmp_path: Path
) -> None:
    source = _parquet_files(tmp_path / "src", DOCS.slice(0, 10), 1)
    frame = spark.readStream.schema(from_arrow_schema(DOCS.schema)).parquet(str(source))

    def start(options: dict[str, str], checkpoint: str) -> Callable[[], StreamingQuery]:
        writer = frame.writeStream.format("superfile").options(**options)
        return writer.option("checkpointLocation", str(tmp_path / checkpoint)).trigger(availableNow=True).start

    options = {"storage": s3_uri, "bootstrap": kafka.url}
    assert "table 'nosuch' does not exist" in failure(start({**options, "table": "nosuch"}, "missing"))
    other = _create(s3_uri, DOCS.schema.remove(DOCS.schema.get_field_index("author")))
    assert "unknown columns ['author']" in failure(start({**options, "table": other.name}, "schema"))
    assert "needs the options ['bootstrap']" in failure(start({"storage": s3_uri, "table": other.name}, "option"))
    counts = frame.groupBy("source").count().writeStream.format("superfile").outputMode("complete")
    complete = counts.options(**options, table=other.name).option("checkpointLocation", str(tmp_path / "complete"))
    assert "only appends" in failure(complete.trigger(availableNow=True).start)
    assert not topic_exists(kafka.url, other.name)  # nothing was published

    with pytest.raises(TableNotFoundError):
        ForeachBatchSink(table="nosuch", storage=s3_uri, bootstrap=kafka.url)
