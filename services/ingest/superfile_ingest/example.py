"""Stream a directory of Parquet or JSON-lines files into a table: ``python -m superfile_ingest.example``.

The read schema is the table's (vector columns as arrays of float), so files
need no schema inference; files that appear later are picked up by the next
micro-batch. ``--once`` processes what is there and exits (Spark's
``availableNow`` trigger); otherwise the job runs until interrupted.
Restarting with the same ``--checkpoint`` resumes the same query: a
micro-batch that was published but not recorded as done is re-run and the
builder drops its events.
"""

from __future__ import annotations

import argparse
import os
import sys

import superfile
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType
from superfile.errors import InvalidOptionError
from superfile.schema import user_schema
from superfile.telemetry import serve

from superfile_ingest import ForeachBatchSink, register
from superfile_ingest.metrics import instrument

__all__ = ["local_session", "main", "read_schema", "stream_files"]


def local_session(master: str = "local[2]", app_name: str = "superfile-ingest") -> SparkSession:
    """A Spark session whose Python workers use this interpreter, with the ``superfile`` sink registered.

    Sets ``SPARK_LOCAL_IP`` (127.0.0.1) and ``PYSPARK_PYTHON`` in the environment unless they are set:
    Spark reads them from there when it launches the JVM and its Python workers.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    register(spark)
    return spark


def read_schema(storage: str, table: str) -> StructType:
    """The Spark schema matching a table's columns (without ``_id``)."""
    schema = superfile.connect(storage).open_table(table).schema
    return from_arrow_schema(user_schema(schema))


def stream_files(
    spark: SparkSession,
    *,
    source_dir: str,
    file_format: str,
    table: str,
    storage: str,
    bootstrap: str,
    checkpoint: str,
    topic_prefix: str = "superfile",
    max_files_per_trigger: int | None = None,
    once: bool = False,
    sink: str = "foreach_batch",
    query_name: str | None = None,
) -> StreamingQuery:
    """Start the query streaming ``source_dir`` into ``table``; returns the running query.

    ``sink`` is ``foreach_batch`` (:class:`ForeachBatchSink`, the faster) or ``datasource`` (``format("superfile")``).
    The query is named ``query_name`` (default: the table; names must differ among a session's active
    queries): the ``query`` label of the job's metrics.
    """
    reader = spark.readStream.schema(read_schema(storage, table))
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    frame: DataFrame = reader.format(file_format).load(source_dir)
    if sink == "datasource":
        writer = frame.writeStream.format("superfile").options(
            table=table, storage=storage, bootstrap=bootstrap, topic_prefix=topic_prefix
        )
    elif sink == "foreach_batch":
        target = ForeachBatchSink(table=table, storage=storage, bootstrap=bootstrap, topic_prefix=topic_prefix)
        writer = frame.writeStream.foreachBatch(target)
    else:
        raise InvalidOptionError(f"sink must be 'datasource' or 'foreach_batch', got {sink!r}")
    writer = writer.option("checkpointLocation", checkpoint).queryName(query_name or table)
    return (writer.trigger(availableNow=True) if once else writer).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m superfile_ingest.example", description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", required=True, help="directory of input files")
    parser.add_argument("--format", default="parquet", choices=["parquet", "json"], help="json means JSON lines")
    parser.add_argument("--table", required=True)
    parser.add_argument("--storage", required=True, help="table root URI, e.g. s3://bucket/tables?endpoint_url=...")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--topic-prefix", default="superfile")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (one per query)")
    parser.add_argument("--max-files-per-trigger", type=int, default=None)
    parser.add_argument("--once", action="store_true", help="process the files present now, then exit")
    parser.add_argument(
        "--sink", default="foreach_batch", choices=["foreach_batch", "datasource"], help="see docs/ingest.md"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--metrics-port", type=int, default=9102, help="serve /metrics here (0: do not)")
    args = parser.parse_args(argv)
    spark = local_session(args.master)
    server = None
    if args.metrics_port:
        instrument(spark)
        server = serve(args.metrics_port)
    query = stream_files(
        spark,
        source_dir=args.source_dir,
        file_format=args.format,
        table=args.table,
        storage=args.storage,
        bootstrap=args.bootstrap,
        checkpoint=args.checkpoint,
        topic_prefix=args.topic_prefix,
        max_files_per_trigger=args.max_files_per_trigger,
        once=args.once,
        sink=args.sink,
    )
    print(f"query {query.id} streaming {args.source_dir} into {args.table}", flush=True)
    if server is not None:
        print(f"metrics at http://127.0.0.1:{args.metrics_port}/metrics", flush=True)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    main()
