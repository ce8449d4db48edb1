"""The ingest job's Prometheus metrics, from Spark's own progress reports.

A ``StreamingQueryListener`` on the driver turns each micro-batch's
``StreamingQueryProgress`` into OpenTelemetry instruments (rendered by
``superfile.telemetry``), whatever the sink: the data source's publishing
runs in a Python worker process Spark starts, where counters of our own would
be lost, but every sink's progress reaches the driver. Exported names
(Prometheus adds ``_total`` to counters and the unit suffix), each with a
``query`` label (the streaming query's name; ``stream_files`` names it after
the table):

- ``superfile_ingest_rows`` and ``..._batches``: rows and micro-batches
  published;
- ``..._batch_seconds``: a micro-batch's duration, reading and publishing;
- ``..._input_rows_per_second`` / ``..._processed_rows_per_second``: the
  arrival and processing rates of the last micro-batch (the job falls behind
  while the first exceeds the second);
- ``..._failed_queries``: queries that ended with an error.

How far the builder is behind the log is the builder's
``superfile_builder_lag_records``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from superfile.telemetry import meter, seconds_histogram

__all__ = ["IngestMetrics", "instrument"]


class IngestMetrics(StreamingQueryListener):
    """Records every streaming query's progress of one Spark session."""

    def __init__(self) -> None:
        m = meter("superfile.ingest")
        self.rows = m.create_counter("superfile_ingest_rows", description="rows of completed micro-batches")
        self.batches = m.create_counter("superfile_ingest_batches", description="completed micro-batches")
        self.batch_seconds = seconds_histogram(m, "superfile_ingest_batch_seconds", "one micro-batch, end to end")
        self.failed = m.create_counter("superfile_ingest_failed_queries", description="queries ended by an error")
        self._lock = threading.Lock()
        self._rates: dict[str, tuple[float, float]] = {}  # query -> (input, processed) rows/s, last batch
        for name, index, description in (
            ("superfile_ingest_input_rows_per_second", 0, "arrival rate over the last micro-batch"),
            ("superfile_ingest_processed_rows_per_second", 1, "processing rate over the last micro-batch"),
        ):
            m.create_observable_gauge(name, callbacks=[self._rate(index)], description=description)
        self._names: dict[str, str] = {}  # query id -> name, for the termination event (which has no name)

    def onQueryStarted(self, event: Any) -> None:
        with self._lock:
            self._names[str(event.id)] = event.name or str(event.id)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        labels = {"query": progress.name or str(progress.id)}
        rows = int(progress.numInputRows)
        if rows:  # a trigger that found no new input is not a micro-batch worth counting
            self.rows.add(rows, labels)
            self.batches.add(1, labels)
            self.batch_seconds.record(progress.batchDuration / 1000, labels)
        with self._lock:
            self._rates[labels["query"]] = (
                float(progress.inputRowsPerSecond or 0.0),
                float(progress.processedRowsPerSecond or 0.0),
            )

    def onQueryIdle(self, event: Any) -> None:
        return

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            name = self._names.pop(str(event.id), str(event.id))
        if event.exception:
            self.failed.add(1, {"query": name})

    def _rate(self, index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                rates = list(self._rates.items())
            for query, pair in rates:
                yield Observation(pair[index], {"query": query})

        return observe


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
