"""The ingest job's Prometheus metrics (docs/ingest.md, "Metrics"), from Spark's own progress reports.

A ``StreamingQueryListener`` on the driver turns each micro-batch's
``StreamingQueryProgress`` into Prometheus instruments (served by
``superfile.telemetry``), whatever the sink: the data source's publishing
runs in a Python worker process Spark starts, where counters of our own would
be lost, but every sink's progress reaches the driver. The instruments are
made when this module is imported, so the job lists every one before its first
micro-batch; each series has a ``query`` label (the streaming query's name;
``stream_files`` names it after the table), and a query's start adds its
series at zero:

- ``superfile_ingest_rows_total`` and ``superfile_ingest_batches_total``: rows
  and micro-batches published;
- ``superfile_ingest_batch_seconds``: a micro-batch's duration, reading and
  publishing;
- ``superfile_ingest_input_rows_per_second`` /
  ``superfile_ingest_processed_rows_per_second``: the arrival and processing
  rates of the last micro-batch (the job falls behind while the first exceeds
  the second);
- ``superfile_ingest_failed_queries_total``: queries that ended with an error.

How far the builder is behind the log is the builder's
``superfile_builder_lag_records``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from superfile.telemetry import Observed, seconds_histogram

__all__ = ["IngestMetrics", "instrument"]

ROWS = Counter("superfile_ingest_rows", "rows of completed micro-batches", ["query"])
BATCHES = Counter("superfile_ingest_batches", "completed micro-batches", ["query"])
BATCH_SECONDS = seconds_histogram("superfile_ingest_batch_seconds", "one micro-batch, end to end", ["query"])
FAILED = Counter("superfile_ingest_failed_queries", "queries ended by an error", ["query"])
_LISTENERS: weakref.WeakSet[IngestMetrics] = weakref.WeakSet()


def _rate(index: int) -> Callable[[], Mapping[tuple[str, ...], float]]:
    def read() -> Mapping[tuple[str, ...], float]:
        return {(query,): pair[index] for listener in list(_LISTENERS) for query, pair in listener.rates().items()}

    return read


Observed(
    "superfile_ingest_input_rows_per_second", "arrival rate over the last micro-batch", _rate(0), labelnames=["query"]
)
Observed(
    "superfile_ingest_processed_rows_per_second",
    "processing rate over the last micro-batch",
    _rate(1),
    labelnames=["query"],
)


class IngestMetrics(StreamingQueryListener):
    """Records every streaming query's progress of one Spark session."""

    def __init__(self) -> None:
        self.rows, self.batches, self.batch_seconds, self.failed = ROWS, BATCHES, BATCH_SECONDS, FAILED
        self._lock = threading.Lock()
        self._rates: dict[str, tuple[float, float]] = {}  # query -> (input, processed) rows/s, last batch
        self._names: dict[str, str] = {}  # query id -> name, for the termination event (which has no name)
        _LISTENERS.add(self)

    def rates(self) -> dict[str, tuple[float, float]]:
        """Per query, the arrival and processing rates of its last micro-batch (rows/s)."""
        with self._lock:
            return dict(self._rates)

    def onQueryStarted(self, event: Any) -> None:
        name = event.name or str(event.id)
        with self._lock:
            self._names[str(event.id)] = name
        for metric in (ROWS, BATCHES, BATCH_SECONDS, FAILED):  # the query's series, at zero from its start
            metric.labels(query=name)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        query = progress.name or str(progress.id)
        rows = int(progress.numInputRows)
        if rows:  # a trigger that found no new input is not a micro-batch worth counting
            self.rows.labels(query=query).inc(rows)
            self.batches.labels(query=query).inc()
            self.batch_seconds.labels(query=query).observe(progress.batchDuration / 1000)
        with self._lock:
            self._rates[query] = (
                float(progress.inputRowsPerSecond or 0.0),
                float(progress.processedRowsPerSecond or 0.0),
            )

    def onQueryIdle(self, event: Any) -> None:
        return

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            name = self._names.pop(str(event.id), str(event.id))
        if event.exception:
            self.failed.labels(query=name).inc()


_lock = threading.Lock()
_listener: IngestMetrics | None = None  # one per process: its instruments are process-wide
_sessions: set[int] = set()


def instrument(spark: SparkSession) -> IngestMetrics:
    """Add the process's metrics listener to ``spark`` (once per session); returns it."""
    global _listener
    with _lock:
        if _listener is None:
            _listener = IngestMetrics()
        if id(spark) not in _sessions:
            spark.streams.addListener(_listener)
            _sessions.add(id(spark))
        return _listener
