"""Source stage: reads one table's topic from a given offset.

The consumer is manually assigned partition 0 of the table's topic (no
consumer group: the Redis lease decides who consumes, and group joins on the
broker take seconds). The position is never committed to Kafka: the offset a
builder resumes from is the one recorded in the table's manifest, so it moves
atomically with the data.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import TopicAlreadyExistsError
from superfile.events import MAX_RECORD_BYTES

__all__ = ["ConsumerRecord", "KafkaSource", "ensure_topic"]


def ensure_topic(bootstrap: str, topic: str) -> None:
    """Create the topic (one partition) if it does not exist, so the builder can wait on it before any event."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()


class KafkaSource:
    """Partition 0 of one topic, positioned explicitly with :meth:`seek`."""

    def __init__(self, bootstrap: str, topic: str, *, max_records: int = 500, **consumer_config: Any) -> None:
        self.topic = topic
        self.max_records = max_records
        ensure_topic(bootstrap, topic)
        config: dict[str, Any] = {
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_partition_fetch_bytes": MAX_RECORD_BYTES + (1 << 20),
            "fetch_max_bytes": 4 * (MAX_RECORD_BYTES + (1 << 20)),
            # A fetch that finds nothing new waits this long at the broker. With kafka-python's default (500)
            # a record published meanwhile reached the builder 133 ms later at the median, 245 ms at p95
            # (tansu, 10 records/s); with 100 it is 5 / 7 ms, for at most 10 idle fetches a second.
            "fetch_max_wait_ms": 100,
        }
        config.update(consumer_config)
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, **config)
        self._tp = TopicPartition(topic, 0)
        self._consumer.assign([self._tp])

    def seek(self, offset: int) -> None:
        """Read from ``offset`` next (drops anything fetched ahead of it)."""
        self._consumer.seek(self._tp, offset)

    def poll(self, timeout_s: float) -> list[ConsumerRecord]:
        """Records after the current position, in log order (empty after ``timeout_s`` without any)."""
        batches = self._consumer.poll(timeout_ms=max(1, int(timeout_s * 1000)), max_records=self.max_records)
        return list(batches.get(self._tp, []))

    def end_offset(self) -> int:
        """The log end offset: as of the last fetch, or asked from the broker before the first."""
        hw = self._consumer.highwater(self._tp)
        if hw is None:
            hw = self._consumer.end_offsets([self._tp])[self._tp]
        return int(hw)

    def close(self) -> None:
        self._consumer.close()
