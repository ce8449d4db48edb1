"""Spark -> Kafka publish rate of the ingest sinks, for Cranfield rows (a 384-d vector and text per row).

    flock /tmp/supertable-bench.lock .venv/bin/python bench/spark_ingest_bench.py --rows 100000 --file-rows 10000

Starts tansu (Kafka protocol, memory storage) and moto's S3 server (the sinks
open the table to check the schema) on 127.0.0.1 and a local Spark session
(``local[2]``). The Cranfield sample is repeated (fresh ids) into Parquet
files of ``--file-rows`` rows; a query reads them with ``maxFilesPerTrigger``
``--files-per-batch`` and the ``availableNow`` trigger, so it runs
``rows / (file_rows * files_per_batch)`` micro-batches and stops. Timed from
``start()`` until the query terminated (every batch acknowledged by the
broker); the topic's records are then decoded and their rows counted.

Measured for the data source (``format("superfile")``) and the
``foreachBatch`` helper, each on a fresh table and checkpoint after a warm-up
query (the session's first query starts Spark's Python workers), and for the
bare producer (``EventLog.publish`` of the same rows in the same chunks, no
Spark) as the upper bound. Saves bench/results/spark_ingest.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import superfile
from kafka import KafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SAMPLE, save
from superfile.events import EventLog, decode, topic_for
from superfile.schema import coerce
from superfile_ingest.example import local_session, stream_files
from superfile_ingest.publish import publish_batch
from superfile_suite import start_moto, start_tansu

SINKS = ("datasource", "foreach_batch")
_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def write_files(directory: Path, rows: int, file_rows: int) -> pa.Table:
    """Cranfield repeated to ``rows`` rows with unique ids, as Parquet files; returns the first file's rows."""
    base = pq.read_table(SAMPLE / "cranfield" / "docs.parquet")
    first = None
    for n, start in enumerate(range(0, rows, file_rows)):
        count = min(file_rows, rows - start)
        idx = pa.array([(start + i) % base.num_rows for i in range(count)])
        part = base.take(idx).set_column(0, "id", pa.array(range(start, start + count), pa.int64()))
        pq.write_table(part, directory / f"part-{n:05d}.parquet")
        first = part if first is None else first
    assert first is not None
    return first


def topic_rows(bootstrap: str, topic: str) -> tuple[int, int, set[str]]:
    """(records, rows, sources) in a topic, read from offset 0 to its end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        end = int(consumer.end_offsets([partition])[partition])
        records = rows = 0
        sources: set[str] = set()
        deadline = time.monotonic() + 120
        while records < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500, max_records=50).values():
                for r in batch:
                    event = decode(r.value, [(k, v) for k, v in r.headers])
                    records += 1
                    rows += event.data.num_rows if event.data is not None else 0
                    sources.add(event.source)
        return records, rows, sources
    finally:
        consumer.close()


def timed_query(start: Callable[..., Any], *args: Any) -> tuple[float, list[dict[str, Any]]]:
    """Run ``start(*args)``'s query to its end; (seconds, each micro-batch's durations)."""
    t0 = time.perf_counter()
    query = start(*args)
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return elapsed, [p["durationMs"] for p in query.recentProgress]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--file-rows", type=int, default=10_000)
    p.add_argument("--files-per-batch", type=int, default=1)
    p.add_argument("--name", default="spark_ingest")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spark-ingest-bench-"))
    (work / "src").mkdir()
    sample = write_files(work / "src", args.rows, args.file_rows)
    bytes_per_row = sample.nbytes / sample.num_rows
    with start_moto() as s3, start_tansu() as kafka:
        os.environ.update({**_AWS, "AWS_ENDPOINT_URL": s3.url})
        boto3.client("s3", endpoint_url=s3.url).create_bucket(Bucket="bench")
        storage = f"s3://bench/tables?endpoint_url={s3.url}"
        db = superfile.connect(storage)
        for name in ("producer", *SINKS, *(f"warm_{sink}" for sink in SINKS)):
            db.create_table(name, sample.schema, fts_columns=["title", "text"], vector_columns={"embedding": 384})
        results: dict[str, Any] = {}

        # Upper bound: the same rows and chunks straight from a producer, no Spark.
        log = EventLog(kafka.url)
        table = db.open_table("producer")
        files = sorted((work / "src").iterdir())
        t0 = time.perf_counter()
        for batch_id, path in enumerate(files):
            rows = coerce(pq.read_table(path), table.schema, table.options)
            publish_batch(log, "producer", "bench", batch_id, rows)
        elapsed = time.perf_counter() - t0
        log.close()
        results["producer"] = {"seconds": round(elapsed, 2), "rows_per_s": round(args.rows / elapsed)}

        t0 = time.perf_counter()
        spark = local_session()
        session_s = time.perf_counter() - t0

        def run(sink: str, table: str, source: Path, checkpoint: Path) -> Any:
            return stream_files(
                spark,
                source_dir=str(source),
                file_format="parquet",
                table=table,
                storage=storage,
                bootstrap=kafka.url,
                checkpoint=str(checkpoint),
                max_files_per_trigger=args.files_per_batch,
                once=True,
                sink=sink,
            )

        # Warm-up: the first query of a session pays for starting the Python workers (~8 s here).
        (work / "warm").mkdir()
        pq.write_table(sample.slice(0, 100), work / "warm" / "part.parquet")
        for sink in SINKS:
            timed_query(run, sink, f"warm_{sink}", work / "warm", work / f"ck-warm-{sink}")

        for name in SINKS:
            elapsed, progress = timed_query(run, name, name, work / "src", work / f"ck-{name}")
            records, rows, sources = topic_rows(kafka.url, topic_for(name))
            assert rows == args.rows, f"{name}: {rows} rows in the topic, expected {args.rows}"
            assert len(sources) == 1 and next(iter(sources)).startswith("spark:")
            add_batch = sorted(d.get("addBatch", 0) for d in progress)
            results[name] = {
                "seconds": round(elapsed, 2),
                "rows_per_s": round(args.rows / elapsed),
                "micro_batches": len(progress),
                "records": records,  # events: each micro-batch is cut into chunks of at most 3 MiB
                "add_batch_ms_median": add_batch[len(add_batch) // 2],
                "trigger_ms_median": sorted(d.get("triggerExecution", 0) for d in progress)[len(progress) // 2],
            }
            print(name, results[name], flush=True)
        spark.stop()

    out = {
        "rows": args.rows,
        "rows_per_batch": args.file_rows * args.files_per_batch,
        "bytes_per_row": round(bytes_per_row),
        "spark_session_start_s": round(session_s, 1),
        "results": results,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
        "python": platform.python_version(),
    }
    print(save(args.name, out))


if __name__ == "__main__":
    main()
