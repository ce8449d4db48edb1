"""Mutation events: the log the service suite is sourced from.

Every write to a table in the suite (an append, a delete, an update, a
restore) is one event on the table's Kafka topic; the builder applies them in
log order. A topic has one partition, so the log order is the table's write
order.

A record's value is an Arrow IPC stream (appends and updates) or empty
(deletes, restores); its headers carry the operation, the predicate or the
version to restore, and the event's
idempotence identity ``(source, seq)``: the builder records, per source, the
highest ``seq`` it has committed (in the manifest, together with the log
offsets), so a producer that replays an event (a retried send, a replayed
Spark micro-batch) cannot apply it twice. ``seq`` increases within a source.

Importing :class:`EventLog` needs kafka-python (the ``service`` extra); the
codec does not.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from superfile.errors import InvalidInputError, StorageError

__all__ = [
    "LOG_PROPERTY",
    "SOURCES_PROPERTY",
    "Event",
    "EventLog",
    "Position",
    "UnacknowledgedWriteError",
    "decode",
    "encode",
    "topic_for",
]

Op = Literal["append", "delete", "update", "restore"]
# Manifest properties the builder maintains: {topic: next offset to apply} and {source: [seq...] high-water}.
LOG_PROPERTY = "log_offsets"
SOURCES_PROPERTY = "log_sources"
# A record stays below this many bytes; bigger appends are split into several events.
MAX_RECORD_BYTES = 4 << 20


def topic_for(table: str, prefix: str = "superfile") -> str:
    """The topic holding a table's events."""
    return f"{prefix}.{table}"


@dataclass(frozen=True)
class Event:
    """One mutation of one table."""

    op: Op
    table: str
    source: str
    seq: tuple[int, ...]
    data: pa.Table | None = None
    where: str | None = None
    idempotency_key: str | None = None  # a caller's key for append(..., idempotency_key=...)
    version: int | None = None  # the version a restore publishes again

    def __post_init__(self) -> None:
        if self.op not in ("append", "delete", "update", "restore"):
            raise InvalidInputError(f"unknown event operation {self.op!r}")
        if self.op == "restore":
            if self.data is not None or self.where is not None:
                raise InvalidInputError("a restore event takes no rows and no predicate")
            if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
                raise InvalidInputError(f"a restore event needs a version >= 1, got {self.version!r}")
            return
        if self.version is not None:
            raise InvalidInputError(f"a {self.op} event takes no version")
        if (self.data is None) != (self.op == "delete"):
            raise InvalidInputError(f"a {self.op} event {'takes no' if self.op == 'delete' else 'needs'} rows")
        if (self.where is None) == (self.op != "append"):
            raise InvalidInputError(f"a {self.op} event {'needs a' if self.op != 'append' else 'takes no'} predicate")


class UnacknowledgedWriteError(StorageError):
    """The broker did not acknowledge an event with its place in the log: it may be lost, so the write
    failed (503) and may be retried (with its idempotency key it then applies once)."""


@dataclass(frozen=True, order=True)
class Position:
    """Where an event sits in its table's log; reads can wait until it is visible."""

    topic: str
    offset: int

    def __post_init__(self) -> None:
        # A negative offset is no place in the log (a broker's -1 means "not written"); it would also count
        # as visible in every manifest.
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise InvalidInputError(f"a log position needs an offset >= 0, got {self.offset!r}")

    @property
    def token(self) -> str:
        return f"{self.topic}@{self.offset}"

    @classmethod
    def parse(cls, token: str) -> Position:
        topic, sep, offset = token.rpartition("@")
        if not sep or not topic or not offset.isdigit():
            raise InvalidInputError(f"not a position token: {token!r}")
        return cls(topic, int(offset))

    def visible_in(self, properties: Mapping[str, Any]) -> bool:
        """True when a manifest with these properties includes this event."""
        applied = properties.get(LOG_PROPERTY, {}).get(self.topic, 0)
        return int(applied) > self.offset


def encode(event: Event) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value and headers for an event."""
    meta: dict[str, Any] = {"op": event.op, "table": event.table, "source": event.source, "seq": list(event.seq)}
    if event.where is not None:
        meta["where"] = event.where
    if event.idempotency_key is not None:
        meta["idempotency_key"] = event.idempotency_key
    if event.version is not None:
        meta["version"] = event.version
    value = b""
    if event.data is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, event.data.schema) as writer:
            writer.write_table(event.data)
        value = sink.getvalue().to_pybytes()
    return value, [("superfile", json.dumps(meta, separators=(",", ":")).encode())]


def decode(value: bytes | None, headers: list[tuple[str, bytes]] | None) -> Event:
    """The event a record carries; raises InvalidInputError for a record that is not one."""
    raw = dict(headers or []).get("superfile")
    if raw is None:
        raise InvalidInputError("record has no superfile header")
    try:
        meta = json.loads(raw)
        data = pa.ipc.open_stream(value).read_all() if value else None
        return Event(
            op=meta["op"],
            table=meta["table"],
            source=meta["source"],
            seq=tuple(int(s) for s in meta["seq"]),
            data=data,
            where=meta.get("where"),
            idempotency_key=meta.get("idempotency_key"),
            version=meta.get("version"),
        )
    except (ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
        raise InvalidInputError(f"malformed event record: {exc}") from exc


class EventLog:
    """Publishes events to table topics and acknowledges once the broker has them.

    Producer settings for durable acknowledgements (``producer_config`` may override them): ``acks="all"``
    (the broker answers once every in-sync replica has the record), ``max_in_flight_requests_per_connection=1``
    (a retried send cannot overtake the next one, so a source's seqs stay in log order), ``retries`` for
    transient broker errors, ``linger_ms=0``. An answer is only an acknowledgement if it carries the record's
    offset; anything else raises :class:`UnacknowledgedWriteError`.
    """

    def __init__(self, bootstrap: str, *, topic_prefix: str = "superfile", **producer_config: Any) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient

        self.bootstrap = bootstrap
        self.topic_prefix = topic_prefix
        config: dict[str, Any] = {
            "acks": "all",
            "max_in_flight_requests_per_connection": 1,  # keeps a source's seqs in log order under retries
            "retries": 5,
            "max_request_size": MAX_RECORD_BYTES + (1 << 20),
            "linger_ms": 0,
        }
        config.update(producer_config)
        self._config = config
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
        self._lock = threading.Lock()
        self._admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self._topics: set[str] = set()

    def topic(self, table: str) -> str:
        return topic_for(table, self.topic_prefix)

    def ensure_topic(self, table: str) -> str:
        """Create the table's topic (one partition) if it does not exist yet."""
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        topic = self.topic(table)
        if topic not in self._topics:
            with contextlib.suppress(TopicAlreadyExistsError):
                self._admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
            self._topics.add(topic)
        return topic

    def publish(self, event: Event, timeout: float = 30.0) -> Position:
        """Send one event and wait for the broker's acknowledgement; returns its position.

        Raises :class:`UnacknowledgedWriteError` when the broker answered without the record's offset
        (tansu answers offset -1 for a send that reached it while it was stopping: that record is not in
        the log), and kafka-python's ``KafkaError`` when it did not answer.
        """
        from kafka.errors import KafkaError

        topic = self.ensure_topic(event.table)
        value, headers = encode(event)
        producer = self._producer
        try:
            meta = producer.send(topic, value=value, headers=headers, partition=0).get(timeout=timeout)
        except KafkaError:
            self._renew(producer)
            raise
        offset = getattr(meta, "offset", None)
        if not isinstance(offset, int) or offset < 0:
            raise UnacknowledgedWriteError(
                f"the {event.op} to table {event.table!r} was not acknowledged by the event log "
                f"(offset {offset!r}): it may not have been written; it may be retried"
            )
        return Position(topic, offset)

    def _renew(self, failed: Any) -> None:
        """Replace a producer whose send failed: after some broker errors (tansu's UnknownError under load)
        kafka-python's sender aborts every later batch too, so a retry on the same producer could never be
        acknowledged. A thread still sending on the old one fails and retries on the new one."""
        from kafka import KafkaProducer

        with self._lock:
            if self._producer is not failed:  # another thread renewed it already
                return
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, **self._config)
        failed.close(timeout=0)

    def close(self) -> None:
        self._producer.close()
        self._admin.close()
