"""The builder's Prometheus metrics (docs/builder.md, "Metrics"), made when this module is imported: a builder
that has applied nothing lists every one.

Counters: ``superfile_builder_rows_applied_total``, ``superfile_builder_events_applied_total``,
``superfile_builder_records_skipped_total`` (label ``reason``), ``superfile_builder_errors_total`` (label
``kind``), ``superfile_builder_commits_total``, ``superfile_builder_compactions_total``,
``superfile_builder_superfiles_compacted_total`` (superfiles a compaction replaced),
``superfile_builder_cleanups_total`` and ``superfile_builder_files_removed_total`` (by cleanups). Histograms:
``superfile_builder_commit_seconds``, ``superfile_builder_compaction_seconds`` and
``superfile_builder_compaction_wait_seconds`` (how long a commit waited for a compaction at the policy's stop
count). Gauges per table, read when scraped: ``superfile_builder_lag_records`` (log end offset minus applied
offset), ``superfile_builder_lag_seconds`` (how long records have been waiting: the time since the pipeline last
had nothing left to apply), ``superfile_builder_applied_offset``, ``superfile_builder_consumed_offset`` (next
offset to read: staged but uncommitted records lie between the two), ``superfile_builder_superfiles``,
``superfile_builder_table_bytes`` and ``superfile_builder_lease_held`` (1 while this process holds the table's
lease). Every series carries a ``table`` label; a table's counters and histograms start at zero when its
pipeline starts.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter
from superfile.telemetry import Observed, preset, seconds_histogram

from superfile_builder.indexer import REJECTED
from superfile_builder.processor import BEFORE_CREATE, DUPLICATE, UNDECODABLE, WRONG_TABLE

__all__ = ["BuilderMetrics", "TableGauges"]

SKIP_REASONS = (DUPLICATE, UNDECODABLE, WRONG_TABLE, REJECTED, BEFORE_CREATE)

ROWS_APPLIED = Counter("superfile_builder_rows_applied", "rows committed", ["table"])
EVENTS_APPLIED = Counter("superfile_builder_events_applied", "events committed", ["table"])
RECORDS_SKIPPED = Counter(
    "superfile_builder_records_skipped", "records consumed but not applied, by reason", ["table", "reason"]
)
ERRORS = Counter("superfile_builder_errors", "failures, by kind", ["table", "kind"])
COMMITS = Counter("superfile_builder_commits", "manifest commits published", ["table"])
COMMIT_SECONDS = seconds_histogram(
    "superfile_builder_commit_seconds", "time to build and publish one batch's commit", ["table"]
)
COMPACTIONS = Counter("superfile_builder_compactions", "compactions published", ["table"])
CLEANUPS = Counter("superfile_builder_cleanups", "cleanups run by retention", ["table"])
FILES_REMOVED = Counter("superfile_builder_files_removed", "files cleanups deleted", ["table"])
COMPACTION_SECONDS = seconds_histogram(
    "superfile_builder_compaction_seconds", "time to rewrite and publish one compaction", ["table"]
)
COMPACTION_WAIT_SECONDS = seconds_histogram(
    "superfile_builder_compaction_wait_seconds", "time a commit waited for a compaction to catch up", ["table"]
)
SUPERFILES_COMPACTED = Counter(
    "superfile_builder_superfiles_compacted", "superfiles replaced by compactions", ["table"]
)
_PER_TABLE = (
    ROWS_APPLIED,
    EVENTS_APPLIED,
    COMMITS,
    COMMIT_SECONDS,
    COMPACTIONS,
    CLEANUPS,
    FILES_REMOVED,
    COMPACTION_SECONDS,
    COMPACTION_WAIT_SECONDS,
    SUPERFILES_COMPACTED,
)
_BUILDERS: weakref.WeakSet[BuilderMetrics] = weakref.WeakSet()  # every live one of the process


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


def _lag(g: TableGauges, now: float) -> float | None:
    return max(0, g.end_offset - g.applied_offset) if g.lease_held else None


def _age(g: TableGauges, now: float) -> float | None:
    if not g.lease_held:
        return None
    return now - g.caught_up_at if g.end_offset > g.applied_offset else 0.0


def _field(attr: str) -> Callable[[TableGauges, float], float | None]:
    return lambda g, now: getattr(g, attr)


def _gauge(read: Callable[[TableGauges, float], float | None]) -> Callable[[], Mapping[tuple[str, ...], float]]:
    def observe() -> Mapping[tuple[str, ...], float]:
        now = time.monotonic()
        values: dict[tuple[str, ...], float] = {}
        for builder in list(_BUILDERS):
            for name, g in builder.tables():
                value = read(g, now)
                if value is not None:
                    values[(name,)] = value
        return values

    return observe


for _name, (_doc, _read) in {
    "superfile_builder_lag_records": ("log end offset minus applied offset", _lag),
    "superfile_builder_lag_seconds": ("seconds since nothing was left to apply (0: caught up)", _age),
    "superfile_builder_applied_offset": ("next log offset to apply", _field("applied_offset")),
    "superfile_builder_consumed_offset": ("next log offset to read", _field("consumed_offset")),
    "superfile_builder_superfiles": ("superfiles in the current manifest", _field("superfiles")),
    "superfile_builder_table_bytes": ("bytes of the current manifest's superfiles", _field("table_bytes")),
    "superfile_builder_lease_held": ("1 while this builder holds the lease", _field("lease_held")),
}.items():
    Observed(_name, _doc, _gauge(_read), labelnames=["table"])


class BuilderMetrics:
    """The per-table gauges of one builder process, and its handles on the process's counters and histograms."""

    def __init__(self) -> None:
        self.rows_applied, self.events_applied, self.records_skipped = ROWS_APPLIED, EVENTS_APPLIED, RECORDS_SKIPPED
        self.errors, self.commits, self.commit_seconds = ERRORS, COMMITS, COMMIT_SECONDS
        self.compactions, self.cleanups, self.files_removed = COMPACTIONS, CLEANUPS, FILES_REMOVED
        self.compaction_seconds, self.compaction_wait_seconds = COMPACTION_SECONDS, COMPACTION_WAIT_SECONDS
        self.superfiles_compacted = SUPERFILES_COMPACTED
        self._tables: dict[str, TableGauges] = {}
        self._lock = threading.Lock()
        _BUILDERS.add(self)

    def table(self, name: str) -> TableGauges:
        """The gauges of one table (created on first use, with the table's counters and histograms at zero)."""
        with self._lock:
            gauges = self._tables.get(name)
            if gauges is None:
                gauges = self._tables[name] = TableGauges()
                for metric in _PER_TABLE:
                    metric.labels(table=name)
                preset(RECORDS_SKIPPED, table=(name,), reason=SKIP_REASONS)
            return gauges

    def forget(self, name: str) -> None:
        with self._lock:
            self._tables.pop(name, None)

    def tables(self) -> list[tuple[str, TableGauges]]:
        with self._lock:
            return list(self._tables.items())
