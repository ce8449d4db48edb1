"""Fixtures of the builder tests: builders started as subprocesses, fresh table names."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from builder_support import BuilderProcess
from superfile_suite import Server


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


@pytest.fixture
def table_name() -> str:
    """A table name no other test (nor an earlier run against the same broker) has used."""
    return f"t{uuid.uuid4().hex[:10]}"
