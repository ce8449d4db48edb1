"""Fencing: the Redis lease, and a zombie builder's publisher failing its precondition."""

from __future__ import annotations

import pyarrow as pa
import pytest
import redis
import superfile
from builder_support import create_table, rows, wait_until
from superfile.commit.requirements import AssertTableUUID, AssertVersion, RequirementFailedError
from superfile.events import LOG_PROPERTY, SOURCES_PROPERTY, Event, topic_for
from superfile_builder.indexer import Batch
from superfile_builder.lease import Lease
from superfile_builder.processor import Processed
from superfile_builder.publisher import FencedError, Publisher
from superfile_suite import Server


def _batch(table: superfile.Supertable, publisher: Publisher, start: int, keys: list[str]) -> Batch:
    """A batch holding one append event at offset ``start``, as the pipeline stages it."""
    batch = Batch(table, start, publisher.precondition(start))
    event = Event("append", table.name, "p", (start + 1,), rows(keys))
    assert batch.add(Processed(start, 100, event=event)) is None
    return batch


def _keys(table: superfile.Supertable) -> list[str]:
    return sorted(table.to_arrow(["key"]).column("key").to_pylist())


def test_lease_exclusive_fenced_and_released_only_by_its_holder(redis_server: Server, table_name: str) -> None:
    client = redis.Redis.from_url(redis_server.url)
    a = Lease(client, table_name, "a", ttl_ms=400)
    b = Lease(client, table_name, "b", ttl_ms=400)
    assert a.try_acquire() and a.valid()
    assert not b.try_acquire() and not b.valid()
    b.release()  # b holds nothing: a's lease must survive
    assert client.get(a.key) == f"{a.fence}:a".encode()
    assert a.renew() and 300 < client.pttl(a.key) <= 400

    wait_until(lambda: not client.exists(a.key), 5, "the unrenewed lease to expire")
    assert not a.renew() and not a.valid()  # compare-and-pexpire found no token of a's
    assert b.try_acquire() and b.fence > a.fence
    a.release()  # a stale holder cannot delete the new holder's lease
    assert client.get(b.key) == f"{b.fence}:b".encode()
    b.release()
    assert not client.exists(b.key)
    with pytest.raises(ValueError):
        Lease(client, table_name, "c", ttl_ms=10)


def test_zombie_builder_cannot_commit_after_a_takeover(s3_uri: str, redis_server: Server, table_name: str) -> None:
    table = create_table(s3_uri, table_name)
    topic = topic_for(table_name)
    client = redis.Redis.from_url(redis_server.url)
    old = Lease(client, table_name, "old", ttl_ms=60_000)
    assert old.try_acquire()
    zombie = Publisher(topic, old)
    zombie.reset(table.properties)
    stale = _batch(table, zombie, 0, ["z1"])

    # The old builder stalls; its lease is gone (as if expired) and a new builder takes over and commits.
    client.delete(old.key)
    new = Lease(client, table_name, "new", ttl_ms=60_000)
    assert new.try_acquire() and new.fence > old.fence
    active = Publisher(topic, new)
    active.reset(table.properties)
    active.commit(_batch(table, active, 0, ["n1"]), {"p": [1]})
    version = table.version

    # The zombie still believes in its lease (its deadline is far), but the manifest moved on under its batch.
    assert old.valid()
    with pytest.raises(FencedError, match="applied up to offset 1"):
        zombie.commit(stale, {"p": [1]})
    assert table.version == version and _keys(table) == ["n1"]

    # Even a zombie that re-read the log position is refused: a newer fence has committed.
    with pytest.raises(FencedError, match="fence"):
        zombie.commit(_batch(table, zombie, 1, ["z2"]), {"p": [2]})
    assert table.version == version and _keys(table) == ["n1"]

    # And once its renewal found the lease gone it does not even try.
    assert not old.renew() and not old.valid()
    with pytest.raises(FencedError, match="no longer held"):
        zombie.commit(_batch(table, zombie, 1, ["z3"]), {"p": [2]})
    assert table.properties[LOG_PROPERTY] == {topic: 1}
    assert table.properties[SOURCES_PROPERTY] == {"p": [1]}


def test_old_holder_commit_fences_the_new_one(s3_uri: str, redis_server: Server, table_name: str) -> None:
    """The old holder commits between the takeover and the new holder's first commit: the new one is fenced."""
    table = create_table(s3_uri, table_name)
    topic = topic_for(table_name)
    client = redis.Redis.from_url(redis_server.url)
    old = Lease(client, table_name, "old", ttl_ms=60_000)
    assert old.try_acquire()
    slow = Publisher(topic, old)
    slow.reset(table.properties)
    client.delete(old.key)
    new = Lease(client, table_name, "new", ttl_ms=60_000)
    assert new.try_acquire()
    fresh = Publisher(topic, new)
    fresh.reset(table.properties)
    same_events = ["e1", "e2"]
    slow.commit(_batch(table, slow, 0, same_events), {"p": [1]})
    with pytest.raises(FencedError):
        fresh.commit(_batch(table, fresh, 0, same_events), {"p": [1]})
    assert _keys(table) == same_events


def test_transaction_precondition_runs_on_every_publish_attempt(table_name: str) -> None:
    """The engine hook the publisher relies on: requirements checked against the manifest each attempt builds on."""
    table = superfile.connect(f"memory://{table_name}").create_table("t", pa.schema([("k", pa.int64())]))
    refuse_from_v2 = AssertVersion(1)  # met by the version the transaction starts on, not by any later one

    tx = table.transaction(requires=[refuse_from_v2])
    tx.append({"k": [1]})
    table.append({"k": [2]})  # a concurrent commit: the first attempt loses the swap and re-checks
    with pytest.raises(RequirementFailedError) as refused:
        tx.commit()
    assert refused.value.requirement == refuse_from_v2 and refused.value.actual == 2 and table.count_rows() == 1

    ok = table.transaction(requires=[AssertTableUUID(table.snapshot().manifest.table_uuid), AssertVersion(2)])
    ok.append({"k": [3]})
    assert ok.commit() == 3 and table.count_rows() == 2
