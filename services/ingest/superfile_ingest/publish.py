"""One micro-batch becomes a run of append events with the identity ``(spark:<query id>, (batch id, chunk))``.

Both sinks (the data source and the ``foreachBatch`` helper) end here, on the
driver, so a micro-batch is published by one producer, in order. The builder
drops an event whose ``seq`` is at or below the highest one it applied for the
same source, so a replayed batch (Spark re-runs a batch whose commit-log
entry is missing, with the same batch id and, for a replayable source and a
deterministic query, the same rows) is dropped chunk by chunk. Chunking is a
function of the rows alone, so a replay splits the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import superfile
from superfile.errors import InvalidOptionError
from superfile.events import MAX_RECORD_BYTES, Event, EventLog, Position
from superfile.table import Supertable

__all__ = ["Target", "chunks", "publish_batch", "source_for"]

# Headroom below the log's record bound for the Arrow IPC framing and headers.
_CHUNK_BYTES = MAX_RECORD_BYTES * 3 // 4


def source_for(query_id: str) -> str:
    """The event source of a streaming query: stable across restarts from the same checkpoint."""
    return f"spark:{query_id}"


@dataclass(frozen=True)
class Target:
    """Where a stream goes: a table in storage and the broker its events are published to."""

    table: str
    storage: str
    bootstrap: str
    topic_prefix: str = "superfile"

    @classmethod
    def from_options(cls, options: Any) -> Target:
        """From Spark writer options (case-insensitive keys); a missing required option is an error."""
        missing = [key for key in ("table", "storage", "bootstrap") if not options.get(key)]
        if missing:
            raise InvalidOptionError(
                f"the superfile sink needs the options {missing} "
                "(table: a table name; storage: the table root URI; bootstrap: Kafka bootstrap servers)"
            )
        return cls(options["table"], options["storage"], options["bootstrap"], options.get("topic_prefix", "superfile"))

    def open(self) -> Supertable:
        """The table, opened from storage; raises ``TableNotFoundError`` if it does not exist."""
        table: Supertable = superfile.connect(self.storage).open_table(self.table)
        return table

    def event_log(self) -> EventLog:
        return EventLog(self.bootstrap, topic_prefix=self.topic_prefix)


def chunks(rows: pa.Table) -> list[pa.Table]:
    """Consecutive slices of ``rows``, each small enough for one record: halves until they fit.

    Depends only on the rows and their order, so a replayed batch splits the same way.
    """
    if rows.nbytes <= _CHUNK_BYTES or rows.num_rows <= 1:
        return [rows]
    half = rows.num_rows // 2
    return chunks(rows.slice(0, half)) + chunks(rows.slice(half))


def publish_batch(log: EventLog, table: str, query_id: str, batch_id: int, rows: pa.Table) -> Position | None:
    """Publish one micro-batch's rows (already in the table's schema); returns the last event's position.

    Each acknowledged before the next is sent, so a batch's seqs reach the log in increasing order.
    """
    source = source_for(query_id)
    position = None
    for chunk, part in enumerate(chunks(rows) if rows.num_rows else []):
        position = log.publish(Event("append", table, source, (batch_id, chunk), part))
    return position
