"""Suite mode with the real broker: writes become events acknowledged with a position; reads wait for positions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import superfile
from gateway_helpers import SCHEMA, error_of, rows
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient
from superfile.events import LOG_PROPERTY, Event, Position, decode, topic_for
from superfile.remote import VisibilityTimeoutError
from superfile_gateway import BackgroundServer, Settings
from superfile_suite import Server

PREFIX = "gwtest"


@pytest.fixture(scope="module")
def suite(kafka: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    root = tmp_path_factory.mktemp("suite")
    settings = Settings(storage=f"file://{root}", auth=False, kafka=kafka.url, topic_prefix=PREFIX, wait_timeout_s=1.0)
    with BackgroundServer(settings) as srv:
        yield srv


def _records(bootstrap: str, topic: str, start: int, count: int, timeout: float = 15.0) -> list[tuple[int, Event]]:
    """``count`` records of ``topic`` from offset ``start`` as (offset, event), read with a manual assign."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, start)
        out: list[tuple[int, Event]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend((r.offset, decode(r.value, [(k, v) for k, v in r.headers])) for r in batch)
        return out
    finally:
        consumer.close()


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        partition = TopicPartition(topic, 0)
        return int(consumer.end_offsets([partition])[partition])
    finally:
        consumer.close()


def _create(http: httpx.Client, name: str) -> None:
    body = {
        "name": name,
        "schema": [{"name": f.name, "type": str(f.type)} for f in SCHEMA],
        "fts_columns": ["title"],
        "vector_columns": {"emb": 4},
    }
    assert http.post("/tables", json=body).status_code == 201


def test_writes_are_published_as_events(suite: BackgroundServer, kafka: Server) -> None:
    name = "events"
    topic = topic_for(name, PREFIX)
    with httpx.Client(base_url=suite.url, timeout=30) as http:
        _create(http, name)
        admin = KafkaAdminClient(bootstrap_servers=kafka.url)
        try:
            assert topic in admin.list_topics()  # created with the table
        finally:
            admin.close()
        assert http.get("/readyz").json() == {"status": "ready", "mode": "suite"}
        appended = http.post(
            f"/tables/{name}/append", params={"wait": "false", "idempotency_key": "first-batch"}, json=rows(range(3))
        )
        assert appended.status_code == 200
        assert appended.json() == {"version": None, "position": f"{topic}@0"}
        deleted = http.post(f"/tables/{name}/delete", params={"wait": "false"}, json={"where": "key = 1"})
        assert deleted.json()["position"] == f"{topic}@1"
        update = {"where": "key = 2", "rows": [{**rows(range(1))[0], "key": 2, "title": "new"}]}
        updated = http.post(f"/tables/{name}/update", params={"wait": "false"}, json=update)
        assert updated.json()["position"] == f"{topic}@2"
        # Bad input is refused before anything is published.
        bad = http.post(f"/tables/{name}/append", params={"wait": "false"}, json=[{"key": "x", "emb": [0, 0, 0, 1]}])
        assert error_of(bad) == (400, "SchemaMismatchError")
        assert error_of(http.post(f"/tables/{name}/delete", json={"where": "nope = 1"})) == (400, "UnknownColumnError")
        assert _end_offset(kafka.url, topic) == 3
        # Nothing is committed by the gateway itself in suite mode: the table stays empty until a builder runs.
        assert http.post(f"/tables/{name}/count", json={}).json() == {"count": 0}

    records = _records(kafka.url, topic, 0, 3)
    assert [off for off, _ in records] == [0, 1, 2]
    events = [e for _, e in records]
    assert [e.op for e in events] == ["append", "delete", "update"]
    assert {e.table for e in events} == {name}
    assert len({e.source for e in events}) == 1 and events[0].source.startswith("gw-")
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3 and all(len(s) == 1 for s in seqs)
    assert events[0].data is not None and events[0].data.to_pylist() == [
        {**r, "emb": [float(x) for x in r["emb"]]} for r in rows(range(3))
    ]
    assert events[0].idempotency_key == "first-batch"  # the builder skips a batch whose key the table recorded
    assert events[1].where == "key = 1" and events[1].data is None and events[1].idempotency_key is None
    assert events[2].where == "key = 2" and events[2].data is not None
    assert events[2].data.column("title").to_pylist() == ["new"]


def test_concurrent_writes_keep_seq_order_in_the_log(suite: BackgroundServer, kafka: Server) -> None:
    name = "concurrent"
    topic = topic_for(name, PREFIX)
    with httpx.Client(base_url=suite.url, timeout=30) as http:
        _create(http, name)

        def one(i: int) -> str:
            r = http.post(f"/tables/{name}/append", params={"wait": "false"}, json=rows(range(i, i + 1)))
            assert r.status_code == 200
            return str(r.json()["position"])

        with ThreadPoolExecutor(4) as pool:
            positions = list(pool.map(one, range(24)))
    assert sorted(Position.parse(p).offset for p in positions) == list(range(24))
    events = [e for _, e in _records(kafka.url, topic, 0, 24)]
    seqs = [e.seq for e in events]
    assert len(events) == 24 and seqs == sorted(seqs)  # the builder's high-water mark never skips one
    assert sorted(e.data.column("key")[0].as_py() for e in events if e.data is not None) == list(range(24))


def _apply(storage: str, name: str, bootstrap: str, topic: str, start: int, count: int) -> None:
    """A stand-in for the builder: apply ``count`` append events from ``start`` and record the log offset."""
    records = _records(bootstrap, topic, start, count)
    table = superfile.Connection(storage).open_table(name)
    with table.transaction() as tx:
        for _, event in records:
            tx.append(event.data)
        tx.set_properties(**{LOG_PROPERTY: {topic: records[-1][0] + 1}})


def test_wait_for_positions(suite: BackgroundServer, kafka: Server) -> None:
    name = "ryw"
    topic = topic_for(name, PREFIX)
    storage = suite.settings.storage
    with httpx.Client(base_url=suite.url, timeout=30) as http:
        _create(http, name)
        # wait=true with no builder running: the write is acknowledged, the wait times out (504).
        timed_out = http.post(f"/tables/{name}/append", json=rows(range(2)))
        assert error_of(timed_out) == (504, "VisibilityTimeoutError")
        assert "will be visible" in timed_out.json()["error"]["message"]
        assert _end_offset(kafka.url, topic) == 1
        # A read waiting for a position another table's log holds is a client error.
        other = http.post(f"/tables/{name}/count", params={"wait_for": f"{PREFIX}.events@0"}, json={})
        assert error_of(other) == (400, "InvalidInputError")
        assert error_of(http.post(f"/tables/{name}/count", params={"wait_for": "garbage"}, json={}))[0] == 400

    # The SDK: append(wait=False) returns None and the handle's next read waits for that position.
    with superfile.connect(suite.url) as db:
        table = db.open_table(name)
        assert table.append(rows(range(2, 5)), wait=False) is None
        applier = threading.Timer(0.3, _apply, (storage, name, kafka.url, topic, 0, 2))
        applier.start()
        try:
            assert table.count_rows() == 5  # waited until the stand-in builder committed offset 1
        finally:
            applier.join()
        assert sorted(table.to_arrow(columns=["key"]).column("key").to_pylist()) == [0, 1, 2, 3, 4]
        # wait=True returns the version that includes the write, once it is applied.
        applier = threading.Timer(0.3, _apply, (storage, name, kafka.url, topic, 2, 1))
        applier.start()
        try:
            version = table.append(rows(range(5, 6)))
        finally:
            applier.join()
        assert version is not None and db.open_table(name, version).count_rows() == 6
        # Without an applier the bounded wait surfaces as a typed error.
        with pytest.raises(VisibilityTimeoutError):
            table.append(rows(range(6, 7)))


def test_restore_is_an_event_and_maintenance_runs_in_the_gateway(suite: BackgroundServer, kafka: Server) -> None:
    name = "maintenance"
    topic = topic_for(name, PREFIX)
    storage = suite.settings.storage
    with httpx.Client(base_url=suite.url, timeout=30) as http:
        _create(http, name)
        for start in (0, 3):
            http.post(f"/tables/{name}/append", params={"wait": "false"}, json=rows(range(start, start + 3)))
            _apply(storage, name, kafka.url, topic, start // 3, 1)  # versions 2 and 3, one superfile each
        table = superfile.Connection(storage).open_table(name)
        offsets = table.properties[LOG_PROPERTY]
        assert offsets == {topic: 2} and table.stats()["superfile_count"] == 2
        # A restore is validated here (a version that is not retained is a 404, and nothing is published) ...
        missing = http.post(f"/tables/{name}/restore", params={"wait": "false"}, json={"version": 9})
        assert error_of(missing) == (404, "VersionNotFoundError")
        assert _end_offset(kafka.url, topic) == 2
        # ... then published as an event for the builder, in log order with the other writes.
        restored = http.post(f"/tables/{name}/restore", params={"wait": "false"}, json={"version": 2})
        assert restored.json() == {"version": None, "position": f"{topic}@2"}
        assert table.count_rows() == 6 and table.version == 3  # not applied by the gateway
        # Compaction and cleanup run here, against storage, and leave the builder's log offsets as they are.
        optimized = http.post(f"/tables/{name}/optimize", json={})
        assert optimized.status_code == 200 and optimized.json()["superfiles_removed"] == 2
        assert table.stats()["superfile_count"] == 1 and table.count_rows() == 6
        assert table.properties[LOG_PROPERTY] == offsets
        assert error_of(http.post(f"/tables/{name}/cleanup", json={"older_than": 0})) == (400, "InvalidOptionError")
        assert http.post(f"/tables/{name}/cleanup", json={"older_than": 7200}).json()["files_removed"] == 0
    with superfile.connect(suite.url) as db:
        assert db.open_table(name).restore(3, wait=False) is None
    events = [e for _, e in _records(kafka.url, topic, 2, 2)]
    assert [(e.op, e.version, e.data, e.where) for e in events] == [
        ("restore", 2, None, None),
        ("restore", 3, None, None),
    ]
    assert events[0].seq < events[1].seq
