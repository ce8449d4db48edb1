"""Spark Structured Streaming to Supertable topics: a micro-batch becomes append events a builder applies once.

``df.writeStream.format("superfile")`` after ``register(spark)``, or
``foreachBatch(ForeachBatchSink(...))``; ``instrument(spark)`` for the job's metrics; see ``docs/ingest.md``.
"""

from pyspark.sql import SparkSession

from superfile_ingest.datasource import SuperfileDataSource
from superfile_ingest.foreach import ForeachBatchSink
from superfile_ingest.metrics import instrument
from superfile_ingest.publish import source_for

__all__ = ["ForeachBatchSink", "SuperfileDataSource", "instrument", "register", "source_for"]


def register(spark: SparkSession) -> None:
    """Make ``format("superfile")`` available in this Spark session."""
    spark.dataSource.register(SuperfileDataSource)
