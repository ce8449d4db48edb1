"""The builder applies a table's log in order, exactly once, and skips what it must not apply."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import superfile
from builder_support import BuilderProcess, create_table, rows, wait_until
from kafka import KafkaProducer
from superfile.events import LOG_PROPERTY, SOURCES_PROPERTY, Event, EventLog, Position, encode
from superfile_suite import Server, free_port


def _applied(table: superfile.Supertable, position: Position) -> bool:
    return position.visible_in(table.properties)


def test_log_applied_in_order_with_replays_and_garbage_skipped(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)
    table.append(rows(["direct"]), idempotency_key="k-direct")  # an embedded write with a key
    log = EventLog(kafka.url)
    try:
        log.publish(Event("append", table_name, "p1", (1,), rows(["a", "b", "c"])))
        log.publish(Event("append", table_name, "p1", (2,), rows(["d", "e"])))
        log.publish(Event("delete", table_name, "p1", (3,), where="key = 'b'"))
        log.publish(Event("update", table_name, "p1", (4,), rows(["d"], n=7), where="key = 'd'"))
        # a replayed send (same source and seq, published again) and a replayed batch of another source
        log.publish(Event("append", table_name, "p1", (2,), rows(["d", "e"])))
        log.publish(Event("append", table_name, "spark:q", (5, 0), rows(["s1"])))
        log.publish(Event("append", table_name, "spark:q", (5, 0), rows(["s1"])))
        # garbage on the topic, an event for another table, an append the engine rejects (unknown column)
        producer = KafkaProducer(bootstrap_servers=kafka.url)
        producer.send(log.topic(table_name), value=b"not an event", partition=0).get(timeout=10)
        value, headers = encode(Event("append", "other", "p2", (1,), rows(["x"])))
        producer.send(log.topic(table_name), value=value, headers=headers, partition=0).get(timeout=10)
        producer.close()
        log.publish(Event("append", table_name, "p2", (1,), rows(["x"]).append_column("bad", [[1]])))
        # a caller's retried append with an idempotency key: new seq, same key; and a key the table already has
        log.publish(Event("append", table_name, "gw", (1,), rows(["i1"]), idempotency_key="k-1"))
        log.publish(Event("append", table_name, "gw", (2,), rows(["i1"]), idempotency_key="k-1"))
        log.publish(Event("append", table_name, "gw", (3,), rows(["direct"]), idempotency_key="k-direct"))
        last = log.publish(Event("append", table_name, "spark:q", (6, 0), rows(["s2"])))
    finally:
        log.close()

    port = free_port()
    builder = builders([table_name], metrics_port=port)
    wait_until(lambda: _applied(table, last), 30, f"the builder to apply up to {last.token}:\n{builder.output()}")

    got = table.to_arrow(["key", "n"]).sort_by("key").to_pydict()
    assert got == {"key": ["a", "c", "d", "direct", "e", "i1", "s1", "s2"], "n": [0, 0, 7, 0, 0, 0, 0, 0]}
    assert table.idempotency_version("k-1") is not None
    assert table.properties[LOG_PROPERTY] == {last.topic: last.offset + 1}
    assert table.properties[SOURCES_PROPERTY] == {"gw": [3], "p1": [4], "p2": [1], "spark:q": [6, 0]}
    assert table.bm25_search("body", "s2", k=1, projection=["key"]).column("key").to_pylist() == ["s2"]

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line[:1] != "#"}
    labels = f'table="{table_name}"'

    def value(name: str, extra: str = "") -> float:
        return sum(v for k, v in series.items() if k.startswith(name + "{") and labels in k and extra in k)

    assert value("superfile_builder_rows_applied_total") == 9  # 3 + 2 + 1 (update) + 1 + 1 + 1
    assert value("superfile_builder_records_skipped_total", 'reason="duplicate"') == 4
    assert value("superfile_builder_records_skipped_total", 'reason="undecodable"') == 1
    assert value("superfile_builder_records_skipped_total", 'reason="wrong_table"') == 1
    assert value("superfile_builder_records_skipped_total", 'reason="rejected"') == 1
    assert value("superfile_builder_lease_held") == 1
    assert value("superfile_builder_lag_records") == 0
    assert value("superfile_builder_superfiles") >= 1
    assert value("superfile_builder_commit_seconds_count") >= 1


def test_a_batch_commits_on_size_well_before_the_freshness_bound(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    """``--commit-rows``: a batch closes at the record that takes it to the size, not at the (10 min) bound."""
    table = create_table(s3_uri, table_name)
    builder = builders([table_name], commit_rows=50, freshness_ms=600_000, compact_small_files=0)
    log = EventLog(kafka.url)
    try:
        positions = [
            log.publish(Event("append", table_name, "p", (i,), rows([f"k{i}-{j}" for j in range(20)])))
            for i in range(7)
        ]
    finally:
        log.close()
    # 20-row events: batches close at 60 rows (events 0-2 and 3-5); event 6 stays staged.
    wait_until(lambda: _applied(table, positions[5]), 60, f"two size-triggered commits:\n{builder.output()}")
    assert table.count_rows() == 120 and not _applied(table, positions[6])
    appends = [h for h in table.versions() if h["operation"] == "append"]
    assert [h["rows_added"] for h in appends] == [60, 60]


def test_a_small_batch_commits_once_the_freshness_bound_passes(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    """``--freshness-ms``: a batch far below the size commits when its first record is that old."""
    table = create_table(s3_uri, table_name)
    builder = builders([table_name], commit_rows=100_000, freshness_ms=800, compact_small_files=0)
    log = EventLog(kafka.url)
    try:
        warmup = log.publish(Event("append", table_name, "p", (0,), rows(["w"])))
        wait_until(lambda: _applied(table, warmup), 60, f"the builder to start:\n{builder.output()}")
        published = time.monotonic()
        position = log.publish(Event("append", table_name, "p", (1,), rows(["a", "b", "c"])))
    finally:
        log.close()
    wait_until(lambda: _applied(table, position), 30, f"a time-triggered commit:\n{builder.output()}")
    elapsed = time.monotonic() - published
    assert 0.8 <= elapsed < 0.8 + 5, elapsed  # not before the bound; then one small commit
    assert table.versions()[-1]["rows_added"] == 3 and table.count_rows() == 4
