"""Builder test helpers: test rows and metrics (the builder process and bounded waits are in ``e2e_support``)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pyarrow as pa
import superfile
from e2e_support import LEASE_MS as LEASE_MS
from e2e_support import BuilderProcess as BuilderProcess
from e2e_support import wait_until as wait_until

SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64()), ("body", pa.string())])


def create_table(s3_uri: str, name: str) -> superfile.Supertable:
    return superfile.connect(s3_uri).create_table(name, SCHEMA, fts_columns=["body"])


def rows(keys: list[str], n: int = 0) -> pa.Table:
    return pa.table(
        {"key": keys, "n": [n] * len(keys), "body": [f"row {k} text" for k in keys]},
        schema=SCHEMA,
    )


def gauge(port: int, name: str, table: str) -> float | None:
    """One gauge of the builder's /metrics (None while the builder is still starting)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except urllib.error.URLError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{") and f'table="{table}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None
