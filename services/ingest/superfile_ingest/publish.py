"""One micro-batch becomes a run of append events with the identity ``(spark:<query id>, (batch id, chunk))``.

Both sinks (the data source and the ``foreachBatch`` helper) end here, on the
driver, so a micro-batch is published by one producer, in order. The builder
drops an event whose ``seq`` is at or below the highest one it applied for the
same source, so a replayed batch (Spark re-runs a batch whose commit-log
entry is missing, with the same batch id and, for a replayable source and a
deterministic query, the same rows) is dropped chunk by chunk.

The events of a batch depend only on its rows as a set: the rows are put in
a canonical order (sorted by every column) before they are cut into chunks.
A replay that partitions the batch differently (another number of cores,
another split size) still produces the same chunks, so even a batch whose
first run published only some of its chunks is completed exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import superfile
from superfile.errors import InvalidOptionError
from superfile.events import MAX_RECORD_BYTES, Event, EventLog, Position
from superfile.table import Supertable

__all__ = ["Target", "canonical", "chunks", "publish_batch", "source_for"]

# Headroom below the log's record bound for the Arrow IPC framing and headers.
_CHUNK_BYTES = MAX_RECORD_BYTES * 3 // 4


def source_for(query_id: str) -> str:
    """The event source of a streaming query: stable across restarts from the same checkpoint."""
    return f"spark:{query_id}"


@functools.lru_cache(maxsize=16)
def _connection(storage: str) -> superfile.Connection:
    """One connection per storage URI and process: Spark opens the table at every micro-batch."""
    return superfile.Connection(storage)


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
        """The table's latest version, read from storage; raises ``TableNotFoundError`` if it does not exist."""
        return _connection(self.storage).open_table(self.table)

    def event_log(self) -> EventLog:
        return EventLog(self.bootstrap, topic_prefix=self.topic_prefix)


def _digest(vectors: pa.Array) -> pa.Array:
    """A 64-bit digest per fixed-size vector (its bits as 64-bit words, weighted by position): a sort key."""
    dim = vectors.type.list_size
    bits = np.asarray(pc.list_flatten(vectors).to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
    if dim % 2:
        bits = np.pad(bits, ((0, 0), (0, 1)))
    words = np.ascontiguousarray(bits).view(np.uint64)  # integer arithmetic: the same on every machine
    weights = np.arange(1, 2 * words.shape[1], 2, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return pa.array((words * weights).sum(axis=1, dtype=np.uint64))


def canonical(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by every column (vectors by a digest), so any order of the same rows gives the same table."""
    rows = rows.combine_chunks()
    keys: dict[str, pa.Array | pa.ChunkedArray] = {}
    for field, column in zip(rows.schema, rows.columns, strict=True):
        if pa.types.is_fixed_size_list(field.type):
            keys[field.name] = _digest(column.combine_chunks())
        elif pa.types.is_dictionary(field.type):
            keys[field.name] = column.cast(field.type.value_type)
        else:
            keys[field.name] = column
    order = pc.sort_indices(pa.table(keys), sort_keys=[(name, "ascending") for name in keys])
    return rows.take(order)


def chunks(rows: pa.Table) -> list[pa.Table]:
    """Consecutive slices of ``rows``, each small enough for one record: halves until they fit."""
    if rows.nbytes <= _CHUNK_BYTES or rows.num_rows <= 1:
        return [rows]
    half = rows.num_rows // 2
    return chunks(rows.slice(0, half)) + chunks(rows.slice(half))


def publish_batch(log: EventLog, table: str, query_id: str, batch_id: int, rows: pa.Table) -> Position | None:
    """Publish one micro-batch's rows (already in the table's schema); returns the last event's position.

    Each event is acknowledged before the next is sent, so a batch's seqs reach the log in increasing order.
    """
    if not rows.num_rows:
        return None
    source = source_for(query_id)
    position = None
    for chunk, part in enumerate(chunks(canonical(rows))):
        position = log.publish(Event("append", table, source, (batch_id, chunk), part))
    return position
