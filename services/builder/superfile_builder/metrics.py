"""The builder's Prometheus metrics (OpenTelemetry instruments rendered by ``superfile.telemetry``).

Exported names (Prometheus adds ``_total`` to counters and the unit suffix):
``superfile_builder_rows_applied``, ``..._events_applied``, ``..._records_skipped``
(label ``reason``), ``..._errors`` (label ``kind``), ``..._commits``,
``..._commit_seconds`` (histogram), ``..._compactions``, ``..._compaction_seconds`` (histogram),
``..._superfiles_compacted`` (superfiles a compaction replaced), ``..._cleanups``, ``..._files_removed``
(by cleanups), ``..._compaction_wait_seconds``
(histogram: how long a commit waited for a compaction at the policy's stop count), and per-table
gauges ``..._lag_records`` (log end offset minus applied offset), ``..._lag_seconds`` (how long records
have been waiting: the time since the pipeline last had nothing left to apply), ``..._applied_offset``,
``..._consumed_offset`` (next offset to read: staged but uncommitted records lie between the two),
``..._superfiles``, ``..._table_bytes`` and ``..._lease_held`` (1 while this
process holds the table's lease). Every series carries a ``table`` label.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Observation
from superfile.telemetry import meter, seconds_histogram

__all__ = ["BuilderMetrics", "TableGauges"]


@dataclass
class TableGauges:
    """The latest values one table pipeline reports (read when /metrics is scraped)."""

    lease_held: int = 0
    applied_offset: int = 0
    consumed_offset: int = 0
    end_offset: int = 0
    superfiles: int = 0
    table_bytes: int = 0
    caught_up_at: float = field(default_factory=time.monotonic)  # when nothing was left to apply, last

    def offsets_seen(self) -> None:
        """Call after the applied or end offset moved: records the moment the pipeline has caught up."""
        if self.applied_offset >= self.end_offset:
            self.caught_up_at = time.monotonic()


class BuilderMetrics:
    """Counters, the commit latency histogram and the per-table gauges of one builder process."""

    def __init__(self) -> None:
        m = meter("superfile.builder")
        self.rows_applied = m.create_counter("superfile_builder_rows_applied", description="rows committed")
        self.events_applied = m.create_counter("superfile_builder_events_applied", description="events committed")
        self.records_skipped = m.create_counter(
            "superfile_builder_records_skipped", description="records consumed but not applied, by reason"
        )
        self.errors = m.create_counter("superfile_builder_errors", description="failures, by kind")
        self.commits = m.create_counter("superfile_builder_commits", description="manifest commits published")
        self.commit_seconds = seconds_histogram(
            m, "superfile_builder_commit_seconds", "time to build and publish one batch's commit"
        )
        self.compactions = m.create_counter("superfile_builder_compactions", description="compactions published")
        self.cleanups = m.create_counter("superfile_builder_cleanups", description="cleanups run by retention")
        self.files_removed = m.create_counter("superfile_builder_files_removed", description="files cleanups deleted")
        self.compaction_seconds = seconds_histogram(
            m, "superfile_builder_compaction_seconds", "time to rewrite and publish one compaction"
        )
        self.compaction_wait_seconds = seconds_histogram(
            m, "superfile_builder_compaction_wait_seconds", "time a commit waited for a compaction to catch up"
        )
        self.superfiles_compacted = m.create_counter(
            "superfile_builder_superfiles_compacted", description="superfiles replaced by compactions"
        )
        self._tables: dict[str, TableGauges] = {}
        self._lock = threading.Lock()
        gauges = {
            "superfile_builder_lag_records": ("log end offset minus applied offset", self._lag),
            "superfile_builder_lag_seconds": ("seconds since nothing was left to apply (0: caught up)", self._age),
            "superfile_builder_applied_offset": ("next log offset to apply", self._field("applied_offset")),
            "superfile_builder_consumed_offset": ("next log offset to read", self._field("consumed_offset")),
            "superfile_builder_superfiles": ("superfiles in the current manifest", self._field("superfiles")),
            "superfile_builder_table_bytes": ("bytes of the current manifest's superfiles", self._field("table_bytes")),
            "superfile_builder_lease_held": ("1 while this builder holds the lease", self._field("lease_held")),
        }
        for name, (description, callback) in gauges.items():
            m.create_observable_gauge(name, callbacks=[callback], description=description)

    def table(self, name: str) -> TableGauges:
        """The gauges of one table (created on first use)."""
        with self._lock:
            return self._tables.setdefault(name, TableGauges())

    def forget(self, name: str) -> None:
        with self._lock:
            self._tables.pop(name, None)

    def _snapshot(self) -> list[tuple[str, TableGauges]]:
        with self._lock:
            return list(self._tables.items())

    def _lag(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, g in self._snapshot():
            if g.lease_held:
                yield Observation(max(0, g.end_offset - g.applied_offset), {"table": name})

    def _age(self, options: CallbackOptions) -> Iterable[Observation]:
        now = time.monotonic()
        for name, g in self._snapshot():
            if g.lease_held:
                yield Observation(now - g.caught_up_at if g.end_offset > g.applied_offset else 0.0, {"table": name})

    def _field(self, attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for name, g in self._snapshot():
                yield Observation(getattr(g, attr), {"table": name})

        return observe
