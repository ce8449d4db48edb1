"""The real servers the service tests talk to, started once per test session on 127.0.0.1."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import boto3
import pytest
from e2e_support import BuilderProcess
from superfile_suite import Server, start_moto, start_redis, start_tansu


@pytest.fixture(scope="session")
def kafka() -> Iterator[Server]:
    """A tansu broker (Kafka protocol); ``kafka.url`` is the bootstrap address."""
    with start_tansu() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    with start_redis() as server:
        yield server


@pytest.fixture(scope="session")
def s3() -> Iterator[Server]:
    """moto's S3 server; ``s3.url`` is the endpoint."""
    with start_moto() as server:
        yield server


@pytest.fixture
def s3_uri(s3: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket as an ``s3://`` table root, with the client settings in the environment."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.url,
    }.items():
        monkeypatch.setenv(key, value)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/tables?endpoint_url={s3.url}"


@pytest.fixture
def builders(s3_uri: str, kafka: Server, redis_server: Server) -> Iterator[Callable[..., BuilderProcess]]:
    """Start builders for tables on this test's bucket; every one is stopped at teardown."""
    started: list[BuilderProcess] = []

    def start(tables: list[str], **flags: object) -> BuilderProcess:
        proc = BuilderProcess(s3_uri, kafka.url, redis_server.url, tables, **flags).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        os.unlink(proc.log.name)
