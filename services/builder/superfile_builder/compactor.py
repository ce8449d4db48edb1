"""Automatic compaction: when to run ``Supertable.optimize()`` between a table's commits.

Streaming commits are small (a batch closes after ``freshness_ms``), and each
adds at least one superfile per partition it touches; left alone, the
superfile count grows with the number of commits and every query opens more
files. The policy: once some partition holds more than ``small_files``
superfiles with fewer than half the target rows, compact.

Half the target, because compaction's outputs are balanced shards of at most
the target: of the outputs of one partition all but at most one hold at least
half of it, so after a compaction the count of small superfiles starts again
from at most one, and the superfile count stays bounded by about
``rows / (target / 2) + small_files + 1`` per partition.

The publisher thread runs the compaction right after a commit, so it never
races the builder's own commits (the next commit waits for it); it is safe
against other writers anyway (the engine carries their concurrent deletes).
A compaction changes no row and keeps the commit properties (log offsets),
so it needs no fencing: a zombie builder's compaction is as harmless as
anyone's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from superfile.manifest.model import SuperfileEntry

__all__ = ["CompactionPolicy"]


@dataclass(frozen=True)
class CompactionPolicy:
    """``small_files`` = 0 turns automatic compaction off; ``target_rows`` None means the table's
    ``max_rows_per_superfile`` (what ``optimize()`` aims for by default)."""

    small_files: int = 16
    target_rows: int | None = None

    @property
    def enabled(self) -> bool:
        return self.small_files > 0

    def target(self, max_rows_per_superfile: int) -> int:
        return self.target_rows or max_rows_per_superfile

    def due(self, entries: Iterable[SuperfileEntry], max_rows_per_superfile: int) -> bool:
        """Whether some partition holds more than ``small_files`` superfiles below half the target."""
        if not self.enabled:
            return False
        half = self.target(max_rows_per_superfile) / 2
        small = Counter(e.partition for e in entries if e.live_rows < half)
        return any(n > self.small_files for n in small.values())
