"""Source stage: reads one table's topic from a given offset.

The consumer is manually assigned partition 0 of the table's topic (no
consumer group: the Redis lease decides who consumes, and group joins on the
broker take seconds). The position is never committed to Kafka: the offset a
builder resumes from is the one recorded in the table's manifest, so it moves
atomically with the data.

A fetch waits at most ``fetch_max_wait_ms`` at the broker. 100 ms keeps a
record's way to the builder short on a broker that does not answer a waiting
fetch when data arrives (tansu). But a broker whose log is on object storage
may need longer than that to read anything: tansu on the S3 server lists the
partition's objects on every fetch, and once the topic held about 1,000 of
them no 100 ms fetch returned a record (the builder stalled 1,143 records
behind); 500 ms read them in 6.4 s, 1,000 ms in 3.8 s. So when the log has
records past the position and none has come back for twice the wait, the
consumer is reopened at the same position with four times the wait (up to
10 s). It stays there: on a broker that answers as soon as data is there
(Kafka), a longer wait costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import TopicAlreadyExistsError
from superfile.events import MAX_RECORD_BYTES

__all__ = ["FETCH_WAIT_MS", "MAX_FETCH_WAIT_MS", "ConsumerRecord", "KafkaSource", "ensure_topic"]

log = logging.getLogger("superfile_builder.source")


def ensure_topic(bootstrap: str, topic: str) -> None:
    """Create the topic (one partition) if it does not exist, so the builder can wait on it before any event."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()


FETCH_WAIT_MS = 100
MAX_FETCH_WAIT_MS = 10_000


class KafkaSource:
    """Partition 0 of one topic, positioned explicitly with :meth:`seek`."""

    def __init__(self, bootstrap: str, topic: str, *, max_records: int = 500, **consumer_config: Any) -> None:
        self.topic = topic
        self.max_records = max_records
        ensure_topic(bootstrap, topic)
        self._config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_partition_fetch_bytes": MAX_RECORD_BYTES + (1 << 20),
            "fetch_max_bytes": 4 * (MAX_RECORD_BYTES + (1 << 20)),
            # A fetch that finds nothing new waits this long at the broker. With kafka-python's default (500)
            # a record published meanwhile reached the builder 133 ms later at the median, 245 ms at p95
            # (tansu, 10 records/s); with 100 it is 5 / 7 ms, for at most 10 idle fetches a second.
            "fetch_max_wait_ms": FETCH_WAIT_MS,
            **consumer_config,
        }
        self._tp = TopicPartition(topic, 0)
        self._consumer = self._open()
        self._starved_since: float | None = None  # records were due but none came, since then

    @property
    def fetch_wait_ms(self) -> int:
        return int(self._config["fetch_max_wait_ms"])

    def _open(self) -> KafkaConsumer:
        consumer = KafkaConsumer(**self._config)
        consumer.assign([self._tp])
        return consumer

    def seek(self, offset: int) -> None:
        """Read from ``offset`` next (drops anything fetched ahead of it)."""
        self._consumer.seek(self._tp, offset)
        self._starved_since = None

    def poll(self, timeout_s: float) -> list[ConsumerRecord]:
        """Records after the current position, in log order (empty after ``timeout_s`` without any)."""
        batches = self._consumer.poll(timeout_ms=max(1, int(timeout_s * 1000)), max_records=self.max_records)
        records = list(batches.get(self._tp, []))
        if records or not self._behind():
            self._starved_since = None
        elif self._starved_since is None:
            self._starved_since = time.monotonic()
        elif time.monotonic() - self._starved_since > 2 * self.fetch_wait_ms / 1000 and (
            self.fetch_wait_ms < MAX_FETCH_WAIT_MS
        ):
            self._slow_broker()
        return records

    def _behind(self) -> bool:
        """Whether the log holds records past the position (as of the last fetch's answer)."""
        hw = self._consumer.highwater(self._tp)
        return hw is not None and self._consumer.position(self._tp) < hw

    def _slow_broker(self) -> None:
        """Reopen at the same position with four times the fetch wait (see the module's docstring)."""
        position = self._consumer.position(self._tp)
        wait = min(MAX_FETCH_WAIT_MS, 4 * self.fetch_wait_ms)
        log.warning(
            "topic %s: no record within %d ms fetches while the log is ahead; fetching with %d ms",
            self.topic,
            self.fetch_wait_ms,
            wait,
        )
        self._consumer.close()
        self._config["fetch_max_wait_ms"] = wait
        self._consumer = self._open()
        self._consumer.seek(self._tp, position)
        self._starved_since = None

    def end_offset(self) -> int:
        """The log end offset: as of the last fetch, or asked from the broker before the first."""
        hw = self._consumer.highwater(self._tp)
        if hw is None:
            hw = self._consumer.end_offsets([self._tp])[self._tp]
        return int(hw)

    def close(self) -> None:
        self._consumer.close()
