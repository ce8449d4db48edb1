"""Shared by the gateway tests: the table schema and rows, and checks on gateway state and error bodies."""

from __future__ import annotations

from typing import Any

import httpx
import pyarrow as pa
import superfile

KEYS = "admin-key:*:rw,reader-key:*:r,docs-writer:docs*:rw,team-key:team*:rw"
MAX_BODY = 256 * 1024
SCHEMA = pa.schema([("key", pa.int64()), ("title", pa.string()), ("emb", pa.list_(pa.float32(), 4))])


def rows(keys: range) -> list[dict[str, Any]]:
    return [{"key": k, "title": f"document number {k} about flow", "emb": [1.0, float(k % 4), 0.0, 0.5]} for k in keys]


def state(engine: superfile.Connection, name: str) -> tuple[int, int]:
    """(version, row count) of a table, read in-process: unchanged means nothing was written."""
    table = engine.open_table(name)
    return table.version, table.count_rows()


def error_of(response: httpx.Response) -> tuple[int, str]:
    """(status, error type) of an error response, checking the error body's shape on the way."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    return response.status_code, body["error"]["type"]
