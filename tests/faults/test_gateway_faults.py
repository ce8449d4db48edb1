"""Lost answers between client and gateway: a proxy in front of a real gateway process loses the answers of
writes the gateway carried out; clients that retry on every error (with their write's key) end with every
row exactly once, in embedded mode (file://) and in suite mode (gateway -> broker -> builder -> S3).
Without a key of the caller's, the SDK's own request key makes its retries safe too."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow as pa
import pytest
import superfile
from superfile.errors import SuperfileError
from superfile_suite import Server, start_moto, start_redis, start_tansu
from superfile_suite.faults import Faults, FaultyHttpProxy, first_try_of_each_write, writes

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from e2e_support import BuilderProcess, GatewayProcess

CLIENTS = 4
APPENDS = 25
ROWS = 2
REPEATS = 5
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string())])

pytestmark = pytest.mark.timeout(900)


def _rows(client: int, n: int) -> pa.Table:
    ids = [client * 10_000 + n * ROWS + r for r in range(ROWS)]
    return pa.table({"id": ids, "text": [f"client {client} row {i}" for i in ids]}, schema=SCHEMA)


def _clients_retrying_on_every_error(url: str, table: str) -> int:
    """CLIENTS threads append APPENDS times each, every append retried with its own key until it answers
    (the SDK itself does not retry here, so every lost answer reaches this loop); returns the retries."""
    retries = [0] * CLIENTS
    unfinished: list[str] = []

    def client(c: int) -> None:
        t = superfile.connect(url, max_retries=0, timeout=30).open_table(table)
        for n in range(APPENDS):
            key = f"client-{c}-append-{n}"
            for _ in range(30):
                try:
                    t.append(_rows(c, n), idempotency_key=key)
                    break
                except SuperfileError:
                    retries[c] += 1
            else:
                unfinished.append(key)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not unfinished, f"{len(unfinished)} appends never answered"
    return sum(retries)


def _assert_exactly_once(table: superfile.Connection | object, expected: set[int]) -> None:
    ids = table.to_arrow(["id"]).column("id").to_pylist()  # type: ignore[attr-defined]
    duplicated, lost = len(ids) - len(set(ids)), len(expected - set(ids))
    assert (duplicated, lost) == (0, 0), f"{duplicated} duplicated, {lost} lost"
    assert set(ids) == expected


EXPECTED = {c * 10_000 + i for c in range(CLIENTS) for i in range(APPENDS * ROWS)}


@pytest.fixture
def embedded_gateway(tmp_path: Path) -> Iterator[tuple[GatewayProcess, str]]:
    storage = f"file://{tmp_path}/data"
    gateway = GatewayProcess(SUPERFILE_STORAGE=storage)
    yield gateway, storage
    gateway.stop()


@pytest.mark.slow
def test_lost_answers_through_the_gateway_in_embedded_mode(embedded_gateway: tuple[GatewayProcess, str]) -> None:
    gateway, storage = embedded_gateway
    for repeat in range(REPEATS):
        superfile.connect(gateway.url).create_table(f"t{repeat}", SCHEMA, fts_columns=["text"])
        with FaultyHttpProxy(gateway.url, Faults(lose=0.2, match=writes), seed=repeat) as proxy:
            retries = _clients_retrying_on_every_error(proxy.endpoint, f"t{repeat}")
            assert proxy.faults.counts["lose"] >= 10 and retries >= proxy.faults.counts["lose"]
        _assert_exactly_once(superfile.connect(storage).open_table(f"t{repeat}"), EXPECTED)


def test_the_sdk_request_key_makes_its_own_retries_safe(embedded_gateway: tuple[GatewayProcess, str]) -> None:
    """The first answer to every write is lost after the gateway carried it out; the SDK (default retries, no
    key from the caller) repeats each write once, with the request key it made, and each commits once."""
    gateway, storage = embedded_gateway
    db = superfile.connect(gateway.url)
    db.create_table("t", SCHEMA, fts_columns=["text"])
    with FaultyHttpProxy(gateway.url, Faults(lose=1.0, match=first_try_of_each_write())) as proxy:
        t = superfile.connect(proxy.endpoint).open_table("t")
        versions = [t.append(_rows(0, n)) for n in range(10)]
        after_update = t.update("id = 0", _rows(9, 0).slice(0, 1))
        after_delete = t.delete("id = 1")
        restored = t.restore(versions[-1])
        assert proxy.faults.counts["lose"] == 13
    engine = superfile.connect(storage).open_table("t")
    assert versions == list(range(2, 12)) and (after_update, after_delete, restored) == (12, 13, 14)
    assert [v["operation"] for v in engine.versions()][-3:] == ["update", "delete", "restore"]
    assert engine.version == 14  # each write committed once
    _assert_exactly_once(engine, {n for n in range(10 * ROWS)})


@pytest.fixture(scope="module")
def suite_servers() -> Iterator[tuple[Server, Server, Server]]:
    with start_moto() as s3, start_tansu() as kafka, start_redis() as redis:
        yield s3, kafka, redis


@pytest.mark.slow
def test_lost_answers_through_the_gateway_in_suite_mode(
    suite_servers: tuple[Server, Server, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    s3, kafka, redis = suite_servers
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "t")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"g-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3.url).create_bucket(Bucket=bucket)
    storage = f"s3://{bucket}/tables?endpoint_url={s3.url}"
    gateway = GatewayProcess(SUPERFILE_STORAGE=storage, SUPERFILE_KAFKA=kafka.url)
    tables = [f"t{repeat}" for repeat in range(REPEATS)]
    builder = BuilderProcess(storage, kafka.url, redis.url, tables).start()
    try:
        for repeat, table in enumerate(tables):
            superfile.connect(gateway.url).create_table(table, SCHEMA, fts_columns=["text"])
            with FaultyHttpProxy(gateway.url, Faults(lose=0.2, match=writes), seed=repeat) as proxy:
                retries = _clients_retrying_on_every_error(proxy.endpoint, table)
                assert proxy.faults.counts["lose"] >= 10, builder.output()
                assert retries >= proxy.faults.counts["lose"]
            _assert_exactly_once(superfile.connect(gateway.url).open_table(table), EXPECTED)
    finally:
        gateway.stop()
        builder.kill()
        os.unlink(builder.log.name)
