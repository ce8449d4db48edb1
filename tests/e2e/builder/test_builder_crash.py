"""Crash safety: SIGKILLed builders, a standby taking over, and a replayed stream lose and duplicate nothing."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import redis
import superfile
from builder_support import LEASE_MS, BuilderProcess, create_table, gauge, rows, wait_until
from superfile.events import Event, EventLog, Position
from superfile_suite import Server, free_port


class Producer(threading.Thread):
    """Publishes appends (10 unique keys each), deletes and updates until stopped; tracks the expected table."""

    def __init__(self, bootstrap: str, table: str, source: str = "producer", pace_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.log = EventLog(bootstrap)
        self.table = table
        self.source = source
        self.pace_s = pace_s
        self.expected: dict[str, int] = {}  # key -> n, as of every acknowledged event
        self.last: Position | None = None
        self.events: list[Event] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        seq = 0
        try:
            while not self.stopped.is_set():
                seq += 1
                keys = list(self.expected)
                if seq % 10 == 0 and keys:
                    victim = rng.choice(keys)
                    event = Event("delete", self.table, self.source, (seq,), where=f"key = '{victim}'")
                    self.last = self.log.publish(event)
                    del self.expected[victim]
                elif seq % 10 == 5 and keys:
                    target = rng.choice(keys)
                    event = Event(
                        "update", self.table, self.source, (seq,), rows([target], n=seq), where=f"key = '{target}'"
                    )
                    self.last = self.log.publish(event)
                    self.expected[target] = seq
                else:
                    new = [f"k{seq}-{i}" for i in range(10)]
                    event = Event("append", self.table, self.source, (seq,), rows(new))
                    self.last = self.log.publish(event)
                    self.expected.update(dict.fromkeys(new, 0))
                self.events.append(event)
                time.sleep(self.pace_s)  # pacing the stream, not synchronisation
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.log.close()

    def finish(self) -> Position:
        self.stopped.set()
        self.join(timeout=30)
        assert self.error is None, self.error
        assert self.last is not None
        return self.last


def _content(table: superfile.Supertable) -> dict[str, int]:
    got = table.to_arrow(["key", "n"]).to_pydict()
    assert len(got["key"]) == len(set(got["key"])), "a row was applied twice"
    return dict(zip(got["key"], got["n"], strict=True))


def test_sigkilled_builder_applies_every_event_exactly_once(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)
    producer = Producer(kafka.url, table_name)
    producer.start()
    rng = random.Random(11)
    kills = mid_batch = 0
    port = free_port()
    builder = builders([table_name], metrics_port=port)
    for _ in range(6):
        version = table.version
        wait_until(lambda v=version: table.version > v, 20, f"the builder to commit:\n{builder.output()}")
        time.sleep(rng.uniform(0.0, 0.6))  # a random moment inside the builder's work
        consumed = gauge(port, "superfile_builder_consumed_offset", table_name) or 0
        applied = gauge(port, "superfile_builder_applied_offset", table_name) or 0
        builder.kill()
        kills += 1
        mid_batch += consumed > applied  # killed while holding staged, uncommitted events
        port = free_port()
        builder = builders([table_name], metrics_port=port)
    last = producer.finish()
    wait_until(lambda: last.visible_in(table.properties), 30, f"the last event applied:\n{builder.output()}")

    assert kills >= 5 and mid_batch >= 3
    assert _content(table) == producer.expected
    assert len(producer.expected) > 500


def test_standby_takes_over_within_the_lease_ttl(
    s3_uri: str, kafka: Server, redis_server: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)
    producer = Producer(kafka.url, table_name)
    producer.start()
    first = builders([table_name])
    wait_until(lambda: table.version > 1, 20, f"a builder to commit:\n{first.output()}")
    second = builders([table_name])
    # The standby consumes nothing while the first holds the lease: every commit is the first one's.
    time.sleep(2 * LEASE_MS / 1000)  # an observation window: a wrongly acquired lease would show by now
    assert second.alive and "acquired" not in second.output()

    lease = redis.Redis.from_url(redis_server.url)
    key = f"superfile:builder:lease:{table_name}"
    held_by_first = lease.get(key)
    assert held_by_first is not None
    first.kill()
    killed_at = time.monotonic()
    # Handover: the standby holds the lease within the ttl of the dead holder's last renewal (polled at 10 ms).
    wait_until(lambda: lease.get(key) not in (None, held_by_first), LEASE_MS / 1000 + 2, "the standby's lease", 0.01)
    handover = time.monotonic() - killed_at
    version = table.version
    wait_until(lambda: table.version > version, 10, f"the standby to commit:\n{second.output()}")
    assert "acquired" in second.output()

    last = producer.finish()
    wait_until(lambda: last.visible_in(table.properties), 30, f"the last event applied:\n{second.output()}")
    assert _content(table) == producer.expected
    assert handover <= LEASE_MS / 1000 + 0.25, handover  # + the polls, scheduling and the 10 ms expiry slack


def test_replayed_stream_is_not_applied_twice(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    """A producer that replays everything it sent (e.g. a Spark query restarted from an old checkpoint)."""
    table = create_table(s3_uri, table_name)
    producer = Producer(kafka.url, table_name, pace_s=0.0)
    producer.start()
    wait_until(lambda: len(producer.events) >= 100, 20, "the producer")
    producer.finish()
    builder = builders([table_name])
    log = EventLog(kafka.url)
    try:
        for event in producer.events:  # the whole stream again, same (source, seq)
            last = log.publish(event)
    finally:
        log.close()
    wait_until(lambda: last.visible_in(table.properties), 30, f"the replay consumed:\n{builder.output()}")
    assert _content(table) == producer.expected
