"""The event log and the lease store fail under a running builder: the broker (its log on the S3 server) is
restarted mid-stream, Redis is restarted mid-stream (once losing its data), and the log is slow to read.
Every acknowledged row lands exactly once, the builder commits again within a lease period after Redis
returns, and its lag stays bounded."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import superfile
from superfile.events import Event, EventLog, Position
from superfile_suite import Server, free_port, start_moto, start_redis, start_tansu

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "builder"))
from builder_support import SCHEMA, rows
from e2e_support import BuilderProcess, wait_until

pytestmark = pytest.mark.timeout(900)

ROUNDS = 5
S3_ENV = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3() -> Iterator[Server]:
    with start_moto() as server:
        yield server


@pytest.fixture
def durable_broker(s3: Server) -> Iterator[tuple[dict[str, object], list[Server]]]:
    """How to start tansu with its log in a bucket of the S3 server (so a restart keeps it), and the broker
    started that way (a list: tests restart it)."""
    bucket = f"log-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3.url, **_boto(S3_ENV)).create_bucket(Bucket=bucket)
    env = {**S3_ENV, "AWS_ENDPOINT": s3.url, "AWS_ALLOW_HTTP": "true"}
    how: dict[str, object] = {"storage": f"s3://{bucket}/", "env": env, "port": free_port()}
    running = [start_tansu(**how)]  # type: ignore[arg-type]
    yield how, running
    running[-1].stop()


def _boto(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


@pytest.fixture
def storage(s3: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    bucket = f"tables-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3.url, **_boto(S3_ENV)).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/tables?endpoint_url={s3.url}"


def _event(table: str, source: str, seq: int) -> Event:
    return Event("append", table, source, (seq,), rows([f"{source}-{seq}"]))


def _publish_until_acknowledged(log: EventLog, event: Event, deadline: float) -> Position:
    """What a careful producer does: send again (the same source and seq: the builder skips a repeat)
    until the broker acknowledges."""
    while True:
        try:
            return log.publish(event, timeout=5)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _exactly_once(table: superfile.Supertable, expected: set[str]) -> None:
    keys = table.to_arrow(["key"]).column("key").to_pylist()
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} rows duplicated"
    assert set(keys) == expected, f"{len(expected - set(keys))} rows lost"


def _metric(port: int, name: str, table: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{") and f'table="{table}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_log_on_object_storage_keeps_the_builder_close(
    durable_broker: tuple[dict[str, object], list[Server]], storage: str, tmp_path: Path
) -> None:
    """Once the topic held about 1,000 records, tansu on the S3 server answered no 100 ms fetch with a
    record and the builder stalled for good; it now lengthens its fetch wait and keeps up."""
    _, broker = durable_broker
    table = superfile.connect(storage).create_table("t", SCHEMA, fts_columns=["body"])
    with start_redis(data_dir=str(tmp_path / "redis")) as redis:
        port = free_port()
        builder = BuilderProcess(storage, broker[-1].url, redis.url, ["t"], metrics_port=port).start()
        try:
            publishers, each = 4, 300
            last: list[Position] = []
            lags: list[float] = []

            def publish(p: int) -> None:
                log = EventLog(broker[-1].url)
                try:
                    deadline = time.monotonic() + 120
                    for seq in range(1, each + 1):  # a send the broker refused is sent again, as in the tests below
                        position = _publish_until_acknowledged(log, _event("t", f"p{p}", seq), deadline)
                    last.append(position)
                finally:
                    log.close()

            threads = [threading.Thread(target=publish, args=(p,)) for p in range(publishers)]
            for th in threads:
                th.start()
            while any(th.is_alive() for th in threads):
                lags.append(_metric(port, "superfile_builder_lag_records", "t") or 0)
                time.sleep(0.5)
            for th in threads:
                th.join()
            published = time.monotonic()
            wait_until(lambda: all(p.visible_in(table.properties) for p in last), 60, "the builder to catch up")
            caught_up_s = time.monotonic() - published
            wait_until(lambda: _metric(port, "superfile_builder_lag_seconds", "t") == 0, 10, "lag_seconds to be 0")
            _exactly_once(table, {f"p{p}-{seq}" for p in range(publishers) for seq in range(1, each + 1)})
            print(f"slow log: caught up {caught_up_s:.1f} s after the last publish; lag peaked at {max(lags):.0f}")
            assert caught_up_s < 30, builder.output()
        finally:
            builder.kill()


def test_broker_restarts_mid_stream_lose_and_duplicate_nothing(
    durable_broker: tuple[dict[str, object], list[Server]], storage: str, tmp_path: Path
) -> None:
    how, broker = durable_broker
    table = superfile.connect(storage).create_table("t", SCHEMA, fts_columns=["body"])
    expected: set[str] = set()
    refused = 0
    with start_redis(data_dir=str(tmp_path / "redis")) as redis:
        builder = BuilderProcess(storage, broker[-1].url, redis.url, ["t"]).start()
        log = EventLog(broker[-1].url)
        try:
            seq, last = 0, None
            for _ in range(ROUNDS):
                for _ in range(10):
                    seq += 1
                    last = _publish_until_acknowledged(log, _event("t", "p", seq), time.monotonic() + 60)
                    expected.add(f"p-{seq}")
                broker[-1].stop()
                seq += 1
                with pytest.raises(Exception) as outage:  # never a silent success while the broker is down
                    log.publish(_event("t", "p", seq), timeout=2)
                refused += 1
                assert not isinstance(outage.value, AssertionError)
                broker.append(start_tansu(**how))  # type: ignore[arg-type]
                last = _publish_until_acknowledged(log, _event("t", "p", seq), time.monotonic() + 60)
                expected.add(f"p-{seq}")
            assert last is not None
            final = last
            wait_until(lambda: final.visible_in(table.properties), 120, f"the builder to apply:\n{builder.output()}")
            _exactly_once(table, expected)
            assert refused == ROUNDS
        finally:
            log.close()
            builder.kill()


def test_redis_restarts_mid_stream_and_the_builder_commits_within_a_lease(
    durable_broker: tuple[dict[str, object], list[Server]], storage: str, tmp_path: Path
) -> None:
    _, broker = durable_broker
    table = superfile.connect(storage).create_table("t", SCHEMA, fts_columns=["body"])
    lease_ms = 3000
    port = free_port()
    data = tmp_path / "redis"
    redis = start_redis(port=port, data_dir=str(data))
    builder = BuilderProcess(storage, broker[-1].url, redis.url, ["t"], lease_ms=lease_ms).start()
    log = EventLog(broker[-1].url)
    expected: set[str] = set()
    back_to_commit: list[float] = []
    try:
        # A second builder takes over first, so the committed fence is above 1: an emptied Redis, whose
        # counter starts again at 1, would fence the builder out if the fence did not come from the manifest.
        first = log.publish(_event("t", "p", 1))
        wait_until(lambda: first.visible_in(table.properties), 60, f"the first commit:\n{builder.output()}")
        builder.kill()
        builder = BuilderProcess(storage, broker[-1].url, redis.url, ["t"], lease_ms=lease_ms).start()
        position = log.publish(_event("t", "p", 2))
        expected |= {"p-1", "p-2"}
        wait_until(lambda: position.visible_in(table.properties), 60, f"the takeover:\n{builder.output()}")
        assert int(table.properties["log_fences"][position.topic]) >= 2
        seq = 2
        for round_ in range(ROUNDS):
            for _ in range(5):
                seq += 1
                log.publish(_event("t", "p", seq))
                expected.add(f"p-{seq}")
            redis.stop()
            seq += 1
            log.publish(_event("t", "p", seq))  # acknowledged by the broker while Redis is away
            expected.add(f"p-{seq}")
            if round_ == ROUNDS - 1:  # the last time Redis comes back empty: the fence must come from the manifest
                data = tmp_path / "redis-empty"
            acquired = builder.output().count("acquired (fence")
            redis = start_redis(port=port, data_dir=str(data))
            back = time.monotonic()
            if round_ == ROUNDS - 1:  # the lease is gone with the data: the builder takes a new one
                wait_until(lambda n=acquired: builder.output().count("acquired (fence") > n, 30, "a new lease")
            seq += 1
            position = log.publish(_event("t", "p", seq))
            expected.add(f"p-{seq}")
            wait_until(lambda p=position: p.visible_in(table.properties), 60, f"a commit:\n{builder.output()}")
            back_to_commit.append(time.monotonic() - back)
        _exactly_once(table, expected)
        assert int(table.properties["log_fences"][position.topic]) > 2  # the new lease's fence, above the old
        print("Redis back -> next commit (s):", [round(s, 2) for s in back_to_commit])
        # one lease period, plus the batch's freshness bound and one commit to S3
        assert max(back_to_commit) < lease_ms / 1000 + 2.0, back_to_commit
    finally:
        log.close()
        builder.kill()
        redis.stop()
