"""One table's indexing pipeline: source -> processor -> indexer -> publisher, under the table's lease.

The pipeline is a thread. While it does not hold the lease it only retries
acquiring it (a standby). On acquiring it -- and after any failed or fenced
commit -- it *resumes*: it re-opens the table, reads ``log_offsets`` and
``log_sources`` from the current manifest, seeks the source there and resets
the processor, dropping whatever it had staged. A batch is committed when it
reaches ``commit_rows`` rows or ``commit_bytes`` record bytes, or when its
first record is ``freshness_ms`` old, whichever comes first.

Commits run on a second thread so the next batch accumulates meanwhile (an
event then waits at most the freshness bound plus one commit, not two).
Commits stay strictly sequential: a batch is submitted only after the one
before it is published, and a batch that needs the table state (a delete, an
update or a restore) waits for the commit in flight first. A restore starts
a new batch (``indexer.py``). When a commit fails, the batch accumulating
behind it is dropped too and the pipeline resumes.

After a commit, the publisher thread starts compacting on a third thread
when the compaction policy says so (``compactor.py``): that thread hands
runs to the builder's compaction process while the policy asks. Commits go
on beside it, and wait for it only once the policy's stop count of small
superfiles is reached. A failed compaction is logged and counted, and
changes nothing: the policy asks again after the next commit.

If the table is dropped, the pipeline stops (releasing the lease); events
left in the topic are not applied anywhere. The supervisor starts a new
pipeline if a table of that name appears again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import redis
from superfile.allocator import release_unused
from superfile.connection import Connection
from superfile.errors import StorageError, SuperfileError, TableNotFoundError
from superfile.events import LOG_PROPERTY, SOURCES_PROPERTY, topic_for
from superfile.maintenance import CompactionPolicy, Compactor
from superfile.manifest.model import SuperfileEntry
from superfile.table import Supertable

from superfile_builder.indexer import REJECTED, Batch
from superfile_builder.lease import Lease
from superfile_builder.metrics import BuilderMetrics
from superfile_builder.processor import UNDECODABLE, WRONG_TABLE, Processor
from superfile_builder.publisher import FENCE_PROPERTY, FencedError, Publisher
from superfile_builder.source import KafkaSource

__all__ = ["PipelineConfig", "TablePipeline"]

log = logging.getLogger(__name__)

_ERROR_REASONS = (UNDECODABLE, WRONG_TABLE, REJECTED)  # skips that are the producer's fault
_EXPIRY_SLACK_S = 0.01  # after the holder's lease runs out in Redis, before trying again
# How often the publisher hands freed memory back after a commit (docs/builder.md, "Memory"): glibc's arenas
# (16 on 2 cores) kept what commits freed, 350 MB held for 48 MB in use 20 minutes into a soak
_RELEASE_EVERY_S = 10.0
_POLL_S = 0.1  # longest wait in one poll: bounds how late a stop, a lost lease or a due commit is noticed


@dataclass(frozen=True)
class PipelineConfig:
    """Settings every table pipeline of one builder shares."""

    kafka: str
    commit_rows: int = 100_000
    commit_bytes: int = 256 << 20
    freshness_ms: int = 1000
    topic_prefix: str = "superfile"
    retry_s: float = 1.0  # pause after a failed commit before resuming
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)
    cleanup_interval_s: float = 3600.0  # clean up each table at most this often (0: never)
    retention_s: float = 7 * 86400.0  # what cleanup keeps: versions, and unreferenced files younger than it


class TablePipeline(threading.Thread):
    """Applies one table's log while holding its lease."""

    def __init__(
        self,
        conn: Connection,
        table: str,
        config: PipelineConfig,
        lease: Lease,
        metrics: BuilderMetrics,
        compactor: Compactor | None = None,
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
        self.compactor = compactor  # None: no automatic compaction
        self.publisher = Publisher(self.topic, lease)
        self._stopping = threading.Event()
        self._table: Supertable | None = None
        self._batch: Batch | None = None
        self._next = 0  # next offset to consume
        self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"publisher-{table}")
        self._inflight: Future[None] | None = None
        self._compaction_thread = ThreadPoolExecutor(1, thread_name_prefix=f"compaction-{table}")
        self._compaction: Future[None] | None = None
        self._cleaned = -math.inf  # monotonic time of the last cleanup
        self._released = time.monotonic()  # monotonic time memory was last handed back
        self._footprint_lock = threading.Lock()
        self._footprint_version = -1  # version the superfile gauges were last set from

    def stop(self) -> None:
        """Ask the thread to finish: it commits what it staged (if it still holds the lease) and releases."""
        self._stopping.set()

    def run(self) -> None:
        source: KafkaSource | None = None
        try:
            source = KafkaSource(self.config.kafka, self.topic)
            self._loop(source)
            self._await_commit()
            if self._batch is not None and not self._batch.empty and self.lease.valid():
                self._commit()
                self._await_commit()
        except TableNotFoundError:
            log.warning("table %s no longer exists; its pipeline stops", self.table_name)
        except Exception:
            log.exception("pipeline for table %s failed", self.table_name)
            self.metrics.errors.labels(**self.labels, kind="pipeline").inc()
        finally:
            self._committer.shutdown(wait=True)
            self._compaction_thread.shutdown(wait=True)  # the compaction loop ends after its current run
            self.lease.release()
            self.gauges.lease_held = 0
            if source is not None:
                source.close()

    # -- the loop ----------------------------------------------------------------------
    def _loop(self, source: KafkaSource) -> None:
        retry = max(0.05, self.lease.ttl_ms / 1000 / 4)
        synced = False  # the source position and processor state match the table's current manifest
        while not self._stopping.is_set():
            if not self.lease.valid():
                self._drop()
                synced = False
                self.gauges.lease_held = 0
                # Try again a few times per ttl, and right when the holder's lease runs out: a dead
                # holder's table is taken over within the lease ttl of its last renewal.
                try:
                    acquired = self.lease.try_acquire(self._committed_fence)
                    wait = min(retry, self.lease.expires_in + _EXPIRY_SLACK_S)
                except redis.RedisError as exc:
                    log.warning("table %s: lease not acquired: %s", self.table_name, exc)
                    self.metrics.errors.labels(**self.labels, kind="redis").inc()
                    acquired, wait = False, retry
                except StorageError as exc:
                    log.warning("table %s: lease not acquired, manifest unreadable: %s", self.table_name, exc)
                    self.metrics.errors.labels(**self.labels, kind="storage").inc()
                    acquired, wait = False, retry
                if not acquired:
                    self._stopping.wait(wait)
                    continue
                self.gauges.lease_held = 1
            try:
                if not synced:
                    self._resume(source)
                    synced = True
                self._step(source)
            except TableNotFoundError:
                raise
            except FencedError as exc:
                log.warning("table %s: commit fenced, resuming from the manifest: %s", self.table_name, exc)
                self.metrics.errors.labels(**self.labels, kind="fenced").inc()
                self._drop()
                synced = False
            except Exception as exc:
                log.exception("table %s: batch failed, resuming from the manifest", self.table_name)
                self.metrics.errors.labels(**self.labels, kind=type(exc).__name__).inc()
                self._drop()
                synced = False
                self._stopping.wait(self.config.retry_s)

    def _committed_fence(self) -> int:
        """The fence of the table's last commit (its manifest's ``log_fences``): a new lease takes a larger one."""
        properties = self.conn.open_table(self.table_name).properties
        return int(properties.get(FENCE_PROPERTY, {}).get(self.topic, 0))

    def _drop(self) -> None:
        """Forget the batch being accumulated and wait out a commit in flight (its outcome no longer matters)."""
        self._batch = None
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.exception()  # waits; a failure was or will be handled by resuming

    def _await_commit(self) -> None:
        """Wait for the commit in flight; re-raises its failure here, on the pipeline thread."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _resume(self, source: KafkaSource) -> None:
        """Drop anything staged and continue from what the table's current manifest records."""
        self._drop()
        table = self.conn.open_table(self.table_name)
        history = table.versions()
        created_ms = history[0]["timestamp_ms"] if history and history[0]["operation"] == "create" else None
        properties = table.properties
        self._table = table
        self._next = int(properties.get(LOG_PROPERTY, {}).get(self.topic, 0))
        self.processor.reset(properties.get(SOURCES_PROPERTY, {}), created_ms)
        self.publisher.reset(properties)
        source.seek(self._next)
        self.gauges.applied_offset = self.gauges.consumed_offset = self._next
        self._update_footprint()
        log.info("table %s: resuming at offset %d (fence %d)", self.table_name, self._next, self.lease.fence)

    def _step(self, source: KafkaSource) -> None:
        batch = self._batch
        wait = _POLL_S
        if batch is not None and batch.first_at is not None:
            wait = min(wait, max(0.0, batch.first_at + self.config.freshness_ms / 1000 - time.monotonic()))
        if self._inflight is not None and self._inflight.done():
            self._await_commit()  # surfaces a failed commit before more is staged on top of it
        for record in source.poll(wait):
            if not self.lease.valid() or self._stopping.is_set():
                break  # anything not yet taken is re-read by whoever resumes from the manifest
            if self._batch is None:
                assert self._table is not None
                self._batch = self._new_batch(self._table)
            processed = self.processor.process(record)
            if processed.event is not None and processed.event.op == "restore" and self._batch.staged:
                self._commit()  # a restore starts its own batch: what came before it commits first
                assert self._table is not None
                self._batch = self._new_batch(self._table)
            reason = self._batch.add(processed)
            self._next = self.gauges.consumed_offset = self._batch.end
            if reason is not None:
                self.metrics.records_skipped.labels(**self.labels, reason=reason).inc()
                if reason in _ERROR_REASONS:
                    self.metrics.errors.labels(**self.labels, kind=reason).inc()
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
        self.gauges.offsets_seen()

    def _new_batch(self, table: Supertable) -> Batch:
        return Batch(
            table,
            self._next,
            self.publisher.precondition(self._next),
            ready=self._await_commit,
            guard=self.publisher.guard(lambda: table.snapshot().manifest, self._next),
        )

    def _commit(self) -> None:
        """Hand the batch to the publisher thread (after the commit before it) and start a new one."""
        batch = self._batch
        assert batch is not None
        self._await_commit()
        self._batch = None
        self._inflight = self._committer.submit(self._publish, batch, self.processor.high_water)

    def _publish(self, batch: Batch, sources: dict[str, list[int]]) -> None:
        started = time.perf_counter()
        self.publisher.commit(batch, sources)
        self.metrics.commit_seconds.labels(**self.labels).observe(time.perf_counter() - started)
        self.metrics.commits.labels(**self.labels).inc()
        self.metrics.rows_applied.labels(**self.labels).inc(batch.rows)
        self.metrics.events_applied.labels(**self.labels).inc(batch.events)
        self.gauges.applied_offset = batch.end
        self.gauges.offsets_seen()
        table = batch.table
        entries = self._update_footprint(table)
        log.debug("table %s: committed offsets %d..%d (%d rows)", self.table_name, batch.start, batch.end, batch.rows)
        if time.monotonic() - self._released >= _RELEASE_EVERY_S:
            self._released = time.monotonic()
            release_unused()  # a few ms, once the commit is visible (the next one may wait that long)
        policy, limit = self.config.compaction, table.options.max_rows_per_superfile
        running = self._compaction is not None and not self._compaction.done()
        if running and policy.stalled(entries, limit):
            assert self._compaction is not None
            started = time.perf_counter()
            self._compaction.result()  # back-pressure: the next commit waits until small superfiles are merged
            self.metrics.compaction_wait_seconds.labels(**self.labels).observe(time.perf_counter() - started)
            running = False
        if self.compactor is not None and not running and policy.due(entries, limit) and self.lease.valid():
            self._compaction = self._compaction_thread.submit(self._compact)
        interval = self.config.cleanup_interval_s
        if interval and time.monotonic() - self._cleaned >= interval and self.lease.valid():
            self._cleaned = time.monotonic()
            self._compaction_thread.submit(self._cleanup)  # after any compaction: one maintenance thread

    def _cleanup(self) -> None:
        """Maintenance thread: delete what no version within the retention window needs (``cleanup``)."""
        try:
            result = self.conn.open_table(self.table_name).cleanup(self.config.retention_s)
            self.metrics.cleanups.labels(**self.labels).inc()
            self.metrics.files_removed.labels(**self.labels).inc(result["files_removed"])
        except TableNotFoundError:
            return
        except Exception:
            log.exception("table %s: cleanup failed", self.table_name)
            self.metrics.errors.labels(**self.labels, kind="cleanup").inc()

    def _compact(self) -> None:
        """Compaction thread: bounded runs in the compaction process while the policy asks for them (see
        ``superfile/maintenance.py``). A failure changes nothing and is only counted; the next commit asks again."""
        assert self.compactor is not None
        try:
            while not self._stopping.is_set() and self.lease.valid():
                started = time.perf_counter()
                result = self.compactor.run(self.table_name)
                if result is None:
                    return
                self.metrics.compaction_seconds.labels(**self.labels).observe(time.perf_counter() - started)
                self.metrics.compactions.labels(**self.labels).inc()
                self.metrics.superfiles_compacted.labels(**self.labels).inc(result["superfiles_removed"])
                self._update_footprint(self.conn.open_table(self.table_name))
                log.info(
                    "table %s: compacted %d superfiles into %d (version %d)",
                    self.table_name,
                    result["superfiles_removed"],
                    result["superfiles_added"],
                    result["version"],
                )
        except TableNotFoundError:
            return  # the pipeline sees it too, and stops
        except SuperfileError as exc:  # contention with another rewrite, storage: the next commit asks again
            log.warning("table %s: compaction failed: %s", self.table_name, exc)
            self.metrics.errors.labels(**self.labels, kind="compaction").inc()
        except Exception:
            log.exception("table %s: compaction failed", self.table_name)
            self.metrics.errors.labels(**self.labels, kind="compaction").inc()

    def _update_footprint(self, table: Supertable | None = None) -> list[SuperfileEntry]:
        """Superfile count and bytes of the snapshot ``table`` (default: the pipeline's handle) last saw
        (manifest parts only, mostly cached); returns its superfiles. The gauges keep the newest version
        any of the pipeline's threads saw."""
        table = table or self._table
        if table is None:
            return []
        snap = table.last_snapshot  # the handle's snapshot: its own last commit, no extra reads
        entries = snap.entries()
        with self._footprint_lock:
            if snap.version >= self._footprint_version:
                self._footprint_version = snap.version
                self.gauges.superfiles = len(entries)
                self.gauges.table_bytes = sum(e.size for e in entries)
        return entries
