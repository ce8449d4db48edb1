"""One table's indexing pipeline: source -> processor -> indexer -> publisher, under the table's lease.

The pipeline is a thread. While it does not hold the lease it only retries
acquiring it (a standby). On acquiring it -- and after any failed or fenced
commit -- it *resumes*: it re-opens the table, reads ``log_offsets`` and
``log_sources`` from the current manifest, seeks the source there and resets
the processor, dropping whatever it had staged. A batch is committed when it
reaches ``commit_rows`` rows or ``commit_bytes`` record bytes, or when its
first record is ``freshness_ms`` old, whichever comes first.

If the table is dropped, the pipeline stops (releasing the lease); events
left in the topic are not applied anywhere. The supervisor starts a new
pipeline if a table of that name appears again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from superfile.connection import Connection
from superfile.errors import TableNotFoundError
from superfile.events import LOG_PROPERTY, SOURCES_PROPERTY, topic_for
from superfile.table import Supertable

from superfile_builder.indexer import REJECTED, Batch
from superfile_builder.lease import Lease
from superfile_builder.metrics import BuilderMetrics
from superfile_builder.processor import UNDECODABLE, WRONG_TABLE, Processor
from superfile_builder.publisher import FencedError, Publisher
from superfile_builder.source import KafkaSource

__all__ = ["PipelineConfig", "TablePipeline"]

log = logging.getLogger(__name__)

_ERROR_REASONS = (UNDECODABLE, WRONG_TABLE, REJECTED)  # skips that are the producer's fault
_POLL_S = 0.1  # longest wait in one poll: bounds how late a stop, a lost lease or a due commit is noticed


@dataclass(frozen=True)
class PipelineConfig:
    """Settings every table pipeline of one builder shares."""

    kafka: str
    commit_rows: int = 100_000
    commit_bytes: int = 64 << 20
    freshness_ms: int = 1000
    topic_prefix: str = "superfile"
    retry_s: float = 1.0  # pause after a failed commit before resuming


class TablePipeline(threading.Thread):
    """Applies one table's log while holding its lease."""

    def __init__(
        self, conn: Connection, table: str, config: PipelineConfig, lease: Lease, metrics: BuilderMetrics
    ) -> None:
        super().__init__(name=f"pipeline-{table}", daemon=True)
        self.conn = conn
        self.table_name = table
        self.topic = topic_for(table, config.topic_prefix)
        self.config = config
        self.lease = lease
        self.metrics = metrics
        self.gauges = metrics.table(table)
        self.labels = {"table": table}
        self.processor = Processor(table)
        self.publisher = Publisher(self.topic, lease)
        self._stop = threading.Event()
        self._table: Supertable | None = None
        self._batch: Batch | None = None
        self._next = 0  # next offset to consume

    def stop(self) -> None:
        """Ask the thread to finish: it commits what it staged (if it still holds the lease) and releases."""
        self._stop.set()

    def run(self) -> None:
        source: KafkaSource | None = None
        try:
            source = KafkaSource(self.config.kafka, self.topic)
            self._loop(source)
            if self._batch is not None and not self._batch.empty and self.lease.valid():
                self._commit()
        except TableNotFoundError:
            log.warning("table %s no longer exists; its pipeline stops", self.table_name)
        except Exception:
            log.exception("pipeline for table %s failed", self.table_name)
            self.metrics.errors.add(1, {**self.labels, "kind": "pipeline"})
        finally:
            self.lease.release()
            self.gauges.lease_held = 0
            if source is not None:
                source.close()

    # -- the loop ----------------------------------------------------------------------
    def _loop(self, source: KafkaSource) -> None:
        retry = max(0.05, self.lease.ttl_ms / 1000 / 4)
        while not self._stop.is_set():
            if not self.lease.valid():
                self._batch = None
                self.gauges.lease_held = 0
                if not self.lease.try_acquire():
                    self._stop.wait(retry)
                    continue
                self.gauges.lease_held = 1
                self._resume(source)
            try:
                self._step(source)
            except TableNotFoundError:
                raise
            except FencedError as exc:
                log.warning("table %s: commit fenced, resuming from the manifest: %s", self.table_name, exc)
                self.metrics.errors.add(1, {**self.labels, "kind": "fenced"})
                if self.lease.valid():
                    self._resume(source)
            except Exception as exc:
                log.exception("table %s: batch failed, resuming from the manifest", self.table_name)
                self.metrics.errors.add(1, {**self.labels, "kind": type(exc).__name__})
                self._batch = None
                if not self._stop.wait(self.config.retry_s) and self.lease.valid():
                    self._resume(source)

    def _resume(self, source: KafkaSource) -> None:
        """Drop anything staged and continue from what the table's current manifest records."""
        self._batch = None
        table = self.conn.open_table(self.table_name)
        history = table.versions()
        created_ms = history[0]["timestamp_ms"] if history and history[0]["operation"] == "create" else None
        properties = table.properties
        self._table = table
        self._next = int(properties.get(LOG_PROPERTY, {}).get(self.topic, 0))
        self.processor.reset(properties.get(SOURCES_PROPERTY, {}), created_ms)
        self.publisher.reset(properties)
        source.seek(self._next)
        self.gauges.applied_offset = self._next
        self._update_footprint()
        log.info("table %s: resuming at offset %d (fence %d)", self.table_name, self._next, self.lease.fence)

    def _step(self, source: KafkaSource) -> None:
        batch = self._batch
        wait = _POLL_S
        if batch is not None and batch.first_at is not None:
            wait = min(wait, max(0.0, batch.first_at + self.config.freshness_ms / 1000 - time.monotonic()))
        for record in source.poll(wait):
            if not self.lease.valid() or self._stop.is_set():
                break  # anything not yet taken is re-read by whoever resumes from the manifest
            if self._batch is None:
                assert self._table is not None
                self._batch = Batch(self._table, self._next, self.publisher.precondition(self._next))
            reason = self._batch.add(self.processor.process(record))
            self._next = self._batch.end
            if reason is not None:
                self.metrics.records_skipped.add(1, {**self.labels, "reason": reason})
                if reason in _ERROR_REASONS:
                    self.metrics.errors.add(1, {**self.labels, "kind": reason})
            if self._batch.rows >= self.config.commit_rows or self._batch.nbytes >= self.config.commit_bytes:
                self._commit()
        batch = self._batch
        if (
            batch is not None
            and batch.first_at is not None
            and time.monotonic() - batch.first_at >= self.config.freshness_ms / 1000
        ):
            self._commit()
        self.gauges.end_offset = source.end_offset()

    def _commit(self) -> None:
        batch = self._batch
        assert batch is not None
        started = time.perf_counter()
        self.publisher.commit(batch, self.processor.high_water)
        self.metrics.commit_seconds.record(time.perf_counter() - started, self.labels)
        self._batch = None
        self.metrics.commits.add(1, self.labels)
        self.metrics.rows_applied.add(batch.rows, self.labels)
        self.metrics.events_applied.add(batch.events, self.labels)
        self.gauges.applied_offset = batch.end
        self._update_footprint()
        log.debug("table %s: committed offsets %d..%d (%d rows)", self.table_name, batch.start, batch.end, batch.rows)

    def _update_footprint(self) -> None:
        """Superfile count and bytes of the snapshot this handle last saw (manifest parts only, mostly cached)."""
        if self._table is None:
            return
        entries = self._table._snapshot.entries()  # the handle's snapshot: our own last commit, no extra reads
        self.gauges.superfiles = len(entries)
        self.gauges.table_bytes = sum(e.size for e in entries)
