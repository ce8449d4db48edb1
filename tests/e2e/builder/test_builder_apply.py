"""The builder applies a table's log in order, exactly once, and skips what it must not apply."""

from __future__ import annotations

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
