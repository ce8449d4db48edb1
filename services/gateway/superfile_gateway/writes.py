"""The two write paths behind one protocol, and the wait that makes a logged write visible to reads.

Embedded mode commits through the engine in this process: the response carries
the new version. Suite mode publishes the write as an event on the table's
topic and answers once the broker acknowledged it: the response carries the
event's position; a builder commits it later, recording the log offset in the
manifest, which is what :func:`wait_visible` watches.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from kafka.errors import KafkaError
from superfile.errors import StorageError
from superfile.events import MAX_RECORD_BYTES, Event, EventLog, Op, Position
from superfile.expressions import parse_predicate
from superfile.remote.errors import PayloadTooLargeError, VisibilityTimeoutError
from superfile.table import Supertable
from superfile.validate import check_key

__all__ = ["EmbeddedWrites", "LogWrites", "WritePath", "WriteResult", "wait_visible"]


@dataclass(frozen=True)
class WriteResult:
    """What a write answers: the version that includes it (when known) and its log position (suite mode)."""

    version: int | None
    position: Position | None = None


class WritePath(Protocol):
    """Where a gateway's writes go."""

    mode: str

    def created(self, table: str) -> None:
        """A table was just created in storage."""

    def append(self, table: Supertable, data: Any, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        """Add rows; a repeated ``idempotency_key`` adds nothing (checked where the write commits)."""

    def delete(self, table: Supertable, where: str, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        """Delete matching rows; a repeated ``idempotency_key`` deletes nothing (as for every write)."""

    def update(
        self, table: Supertable, where: str, data: Any, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult: ...

    def restore(
        self, table: Supertable, version: int, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult:
        """Publish a retained version's contents as the newest version (ordered with the other writes)."""

    def reachable(self, position: Position) -> bool:
        """Whether a write at ``position`` was ever acknowledged, so waiting for it can end (else 400 at once)."""

    def ready(self) -> bool: ...

    def close(self) -> None: ...


class EmbeddedWrites:
    """Writes commit in this process; every response carries the committed version (``wait`` is moot)."""

    mode = "embedded"

    def created(self, table: str) -> None:
        return None

    def append(self, table: Supertable, data: Any, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        return WriteResult(table.append(data, idempotency_key=idempotency_key))

    def delete(self, table: Supertable, where: str, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        return WriteResult(table.delete(where, idempotency_key=idempotency_key))

    def update(
        self, table: Supertable, where: str, data: Any, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult:
        return WriteResult(table.update(where, data, idempotency_key=idempotency_key))

    def restore(
        self, table: Supertable, version: int, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult:
        return WriteResult(table.restore(version, idempotency_key=idempotency_key))

    def reachable(self, position: Position) -> bool:
        return False  # no log: every write was visible when it returned, so a position not visible never will be

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        return None


def wait_visible(table: Supertable, position: Position, timeout_s: float) -> int:
    """Refresh ``table`` until its manifest includes ``position``; returns a version that does.

    Raises :class:`VisibilityTimeoutError` (504) after ``timeout_s``; the write
    itself stays acknowledged and will become visible once a builder commits it.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        if position.visible_in(table.properties):
            return table.version  # read after the properties: the same snapshot or a newer one
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise VisibilityTimeoutError(
                f"position {position.token} is not visible in table {table.name!r} after {timeout_s:g} s; "
                "the write is in the log and will be visible once a builder commits it"
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


class LogWrites:
    """Writes become events on the table's topic (suite mode).

    The process has one ``source`` (``gw-<uuid>``) and numbers its events
    ``seq=(n,)``, increasing. Assigning a seq and sending happen under the
    table's lock, so within a topic seqs appear in increasing order and the
    builder's per-source high-water mark never skips an event; a send the
    producer retries carries the same (source, seq) and cannot apply twice.
    Input is validated against the table's schema before anything is sent.
    A restore is an event too (the builder stays the only writer of the
    table's contents, and the restore keeps its place among the other writes);
    its version must be retained when it is sent.
    """

    mode = "suite"

    def __init__(self, log: EventLog, *, wait_timeout_s: float) -> None:
        self.log = log
        self.source = "gw-" + uuid.uuid4().hex
        self._timeout = wait_timeout_s
        self._seq = 0
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._offsets: Any = None  # a KafkaConsumer asked for log end offsets, made on first use

    def created(self, table: str) -> None:
        self.log.ensure_topic(table)

    def _lock(self, table: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(table, threading.Lock())

    def _publish(self, table: Supertable, op: Op, events: list[dict[str, Any]], wait: bool) -> WriteResult:
        """Send events (``Event`` fields besides op, table, source and seq) in order; one position per call."""
        with self._lock(table.name):
            position: Position | None = None
            for fields in events:
                with self._guard:
                    self._seq += 1
                    seq = self._seq
                try:
                    position = self.log.publish(Event(op, table.name, self.source, (seq,), **fields))
                except KafkaError as e:
                    raise StorageError(f"the event log did not acknowledge the {op}: {e}") from None
        assert position is not None
        version = wait_visible(table, position, self._timeout) if wait else None
        return WriteResult(version, position)

    def append(self, table: Supertable, data: Any, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        rows = table.coerce(data)  # a schema changed elsewhere is read when rows need it
        if not rows.num_rows:
            return WriteResult(table.version)  # as embedded: an empty append changes nothing
        chunks = _chunks(rows)
        keys: list[str | None] = [idempotency_key] * len(chunks)
        if idempotency_key is not None:
            # Chunking is deterministic, so a retried append splits the same way and each chunk keeps its key.
            keys = [idempotency_key] if len(chunks) == 1 else [f"{idempotency_key}#{i}" for i in range(len(chunks))]
            for key in keys:
                check_key(key)
        events = [{"data": c, "idempotency_key": k} for c, k in zip(chunks, keys, strict=True)]
        return self._publish(table, "append", events, wait)

    def delete(self, table: Supertable, where: str, *, wait: bool, idempotency_key: str | None = None) -> WriteResult:
        parse_predicate(where, table.schema)
        return self._publish(table, "delete", [{"where": where, "idempotency_key": _key(idempotency_key)}], wait)

    def update(
        self, table: Supertable, where: str, data: Any, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult:
        parse_predicate(where, table.schema)
        rows = table.coerce(data)  # a schema changed elsewhere is read when rows need it
        if rows.nbytes > MAX_RECORD_BYTES:
            raise PayloadTooLargeError(
                f"an update's rows travel as one event of at most {MAX_RECORD_BYTES} bytes; "
                f"these are {rows.nbytes}: update fewer rows per request"
            )
        # One event: an update's replacement rows must stay together (they match the predicate's rows 1:1).
        event = {"data": rows, "where": where, "idempotency_key": _key(idempotency_key)}
        return self._publish(table, "update", [event], wait)

    def restore(
        self, table: Supertable, version: int, *, wait: bool, idempotency_key: str | None = None
    ) -> WriteResult:
        table.checkout(version)  # VersionNotFoundError (404) now, rather than a skipped event later
        return self._publish(table, "restore", [{"version": version, "idempotency_key": _key(idempotency_key)}], wait)

    def reachable(self, position: Position) -> bool:
        """The broker holds a record at ``position`` (its log ends past it); unsure (broker away) is True."""
        from kafka import KafkaConsumer, TopicPartition

        partition = TopicPartition(position.topic, 0)
        try:
            with self._guard:
                if self._offsets is None:
                    self._offsets = KafkaConsumer(bootstrap_servers=self.log.bootstrap, group_id=None)
                end = self._offsets.end_offsets([partition]).get(partition)
        except KafkaError:
            return True
        return end is None or position.offset < end

    def ready(self) -> bool:
        """Some bootstrap broker accepts a connection (within a second)."""
        for address in self.log.bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            try:
                with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=1.0):
                    return True
            except (OSError, ValueError):
                continue
        return False

    def close(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
        self.log.close()


def _chunks(rows: pa.Table) -> list[pa.Table]:
    """Slices of ``rows`` whose records stay below the log's record size bound."""
    budget = MAX_RECORD_BYTES * 3 // 4  # headroom for the IPC framing
    if rows.nbytes <= budget:
        return [rows]
    per_chunk = max(1, rows.num_rows * budget // rows.nbytes)
    return [rows.slice(start, per_chunk) for start in range(0, rows.num_rows, per_chunk)]


def _key(key: str | None) -> str | None:
    """A request key checked before it is sent (the builder would skip an event with a bad one)."""
    return None if key is None else check_key(key)
