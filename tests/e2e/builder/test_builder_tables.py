"""Which tables a builder builds: discovered in storage, dropped and re-created, stopped gracefully."""

from __future__ import annotations

from collections.abc import Callable

import redis
import superfile
from builder_support import BuilderProcess, create_table, gauge, rows, wait_until
from superfile.events import Event, EventLog
from superfile_suite import Server, free_port


def _keys(table: superfile.Supertable) -> list[str]:
    return sorted(table.to_arrow(["key"]).column("key").to_pylist())


def test_tables_discovered_and_events_of_a_dropped_table_never_applied(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    db = superfile.connect(s3_uri)
    builder = builders([])  # no --tables: every table in storage, rescanned
    log = EventLog(kafka.url)
    try:
        early = log.publish(Event("append", table_name, "p", (1,), rows(["before-create"])))
        table = create_table(s3_uri, table_name)
        first = log.publish(Event("append", table_name, "p", (2,), rows(["first"])))
        wait_until(lambda: first.visible_in(table.properties), 30, f"the new table built:\n{builder.output()}")
        assert _keys(table) == ["first"]  # the event published before the table existed was not applied

        db.drop_table(table_name)
        log.publish(Event("append", table_name, "p", (3,), rows(["while-dropped"])))
        table = create_table(s3_uri, table_name)  # same name, a new table: the old log is not its history
        second = log.publish(Event("append", table_name, "q", (1,), rows(["second"])))
        wait_until(lambda: second.visible_in(table.properties), 30, f"the re-created table built:\n{builder.output()}")
        assert _keys(table) == ["second"]
        assert early.offset < first.offset < second.offset
    finally:
        log.close()


def test_sigterm_commits_what_was_staged_and_releases_the_lease(
    s3_uri: str, kafka: Server, redis_server: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)
    port = free_port()
    # Thresholds no test reaches: only the stop can commit.
    builder = builders([table_name], freshness_ms=600_000, commit_rows=10**9, lease_ms=60_000, metrics_port=port)
    wait_until(lambda: gauge(port, "superfile_builder_lease_held", table_name) == 1, 30, "the lease")
    log = EventLog(kafka.url)
    try:
        for i in range(3):
            last = log.publish(Event("append", table_name, "p", (i,), rows([f"k{i}"])))
    finally:
        log.close()
    wait_until(lambda: gauge(port, "superfile_builder_consumed_offset", table_name) == 3, 30, "the events staged")
    assert gauge(port, "superfile_builder_applied_offset", table_name) == 0
    assert table.version == 1

    builder.stop()
    assert builder.proc is not None and builder.proc.returncode == 0, builder.output()
    assert last.visible_in(table.properties) and _keys(table) == ["k0", "k1", "k2"]
    assert not redis.Redis.from_url(redis_server.url).exists(f"superfile:builder:lease:{table_name}")
