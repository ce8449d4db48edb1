"""Processor stage: turns records into events, dropping what must not be applied.

A record is skipped (its offset still counts as consumed, so the table never
stalls on it) when it is:

- ``undecodable``: no ``superfile`` header, bad JSON, a broken Arrow stream,
  or an event that violates the contract (e.g. an append without rows). It is
  logged and counted as an error; the record stays in the topic for
  inspection at the offset the log names. Retrying cannot fix it, and holding
  the table back behind it would block every later write.
- ``wrong_table``: the event names another table than the topic's.
- ``before_create``: timestamped before the table was created: a leftover of
  an earlier table of the same name (dropped, then re-created) whose topic
  was not deleted. Only checked while the creation time is known (the first
  history entry is the ``create``).
- ``duplicate``: its ``(source, seq)`` is at or below the highest seq already
  applied for that source -- a retried send or a replayed Spark micro-batch.
  High-waters start from the manifest's ``log_sources`` and advance with
  every event of the batch, so a duplicate inside one batch is dropped too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from superfile.errors import InvalidInputError
from superfile.events import Event, decode

__all__ = ["BEFORE_CREATE", "DUPLICATE", "UNDECODABLE", "WRONG_TABLE", "Processed", "Processor"]

log = logging.getLogger(__name__)

UNDECODABLE = "undecodable"
WRONG_TABLE = "wrong_table"
BEFORE_CREATE = "before_create"
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Processed:
    """One record's outcome: an event to apply, or the reason it is skipped."""

    offset: int
    nbytes: int
    event: Event | None = None
    skipped: str | None = None


class Processor:
    """Decodes and de-duplicates one table's records."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._high: dict[str, tuple[int, ...]] = {}
        self._created_ms: int | None = None

    def reset(self, sources: Mapping[str, Sequence[int]], created_ms: int | None) -> None:
        """Start over from a manifest's ``log_sources`` (after a restart, a lost lease or a failed commit)."""
        self._high = {source: tuple(int(s) for s in seq) for source, seq in sources.items()}
        self._created_ms = created_ms

    @property
    def high_water(self) -> dict[str, list[int]]:
        """The ``log_sources`` property a commit of everything processed so far records."""
        return {source: list(seq) for source, seq in sorted(self._high.items())}

    def process(self, record: Any) -> Processed:
        value: bytes | None = record.value
        nbytes = len(value or b"")
        offset = int(record.offset)
        if self._created_ms is not None and 0 <= record.timestamp < self._created_ms:
            return Processed(offset, nbytes, skipped=BEFORE_CREATE)
        try:
            event = decode(value, record.headers)
        except InvalidInputError as exc:
            log.error("table %s: skipping undecodable record at offset %d: %s", self.table, offset, exc)
            return Processed(offset, nbytes, skipped=UNDECODABLE)
        if event.table != self.table:
            log.error("table %s: skipping event for table %r at offset %d", self.table, event.table, offset)
            return Processed(offset, nbytes, skipped=WRONG_TABLE)
        high = self._high.get(event.source)
        if high is not None and event.seq <= high:
            return Processed(offset, nbytes, skipped=DUPLICATE)
        self._high[event.source] = event.seq
        return Processed(offset, nbytes, event=event)
