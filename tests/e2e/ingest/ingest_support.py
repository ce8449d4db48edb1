"""Helpers of the Spark ingest tests: bounded waits for a query, the topic's events and the builder."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import superfile
from e2e_support import BuilderProcess, wait_until
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient
from pyspark.sql.streaming import StreamingQuery
from superfile.events import LOG_PROPERTY, Event, decode, topic_for

QUERY_TIMEOUT_S = 180
APPLY_TIMEOUT_S = 120


def finish(query: StreamingQuery) -> StreamingQuery:
    """Wait for an ``availableNow`` query to end (it raises if the query failed)."""
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        pytest.fail(f"query {query.id} did not finish within {QUERY_TIMEOUT_S} s")
    return query


def failure(start: Callable[[], StreamingQuery]) -> str:
    """The error a query fails with, at start or while running."""
    try:
        finish(start())
    except Exception as exc:
        return str(exc)
    pytest.fail("the query did not fail")


def events(bootstrap: str, topic: str) -> list[Event]:
    """Every event of a topic, in log order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        end = int(consumer.end_offsets([partition])[partition])
        out: list[Event] = []
        deadline = time.monotonic() + 30
        while len(out) < end:
            if time.monotonic() > deadline:
                pytest.fail(f"read {len(out)} of {end} records of {topic}")
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend(decode(r.value, [(k, v) for k, v in r.headers]) for r in batch)
        return out
    finally:
        consumer.close()


def applied(table: superfile.Supertable, bootstrap: str, builder: BuilderProcess) -> list[Event]:
    """Wait until the manifest records the topic's end offset; returns the topic's events."""
    topic = topic_for(table.name)
    published = events(bootstrap, topic)
    assert published, "nothing was published"
    wait_until(
        lambda: int(table.properties.get(LOG_PROPERTY, {}).get(topic, 0)) >= len(published),
        APPLY_TIMEOUT_S,
        f"the builder to apply {len(published)} events:\n{builder.output()}",
    )
    return published


def topic_exists(bootstrap: str, table: str) -> bool:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return topic_for(table) in admin.list_topics()
    finally:
        admin.close()
