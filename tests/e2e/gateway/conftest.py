"""A real gateway (uvicorn on a background thread, embedded mode) over a tmp file:// root, with scoped keys."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import superfile
from gateway_helpers import KEYS, MAX_BODY, SCHEMA, rows
from superfile_gateway import BackgroundServer, Settings, parse_api_keys


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('gateway')}"


@pytest.fixture(scope="module")
def server(storage: str) -> Iterator[BackgroundServer]:
    settings = Settings(storage=storage, api_keys=parse_api_keys(KEYS), max_body_bytes=MAX_BODY)
    with BackgroundServer(settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def engine(storage: str) -> superfile.Connection:
    """The same storage opened in-process: what the gateway did, seen without the gateway."""
    return superfile.Connection(storage)


@pytest.fixture(scope="module")
def tables(engine: superfile.Connection, server: BackgroundServer) -> list[str]:
    """``docs`` and ``other``, 20 rows each, created directly in storage."""
    for name in ("docs", "other"):
        engine.create_table(name, SCHEMA, fts_columns=["title"], vector_columns={"emb": 4}).append(rows(range(20)))
    return ["docs", "other"]


@pytest.fixture
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
