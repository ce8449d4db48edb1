"""Builder test helpers: the builder as a real subprocess (so it can be SIGKILLed), bounded waits, test rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
import superfile

LEASE_MS = 1500
FRESHNESS_MS = 200


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class BuilderProcess:
    """``python -m superfile_builder`` with test-sized thresholds; logs kept for failure messages."""

    def __init__(self, storage: str, kafka: str, redis: str, tables: list[str], **flags: object) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "superfile_builder",
            "--storage",
            storage,
            "--kafka",
            kafka,
            "--redis",
            redis,
            *(["--tables", ",".join(tables)] if tables else []),
            "--metrics-port",
            "0",
            "--rescan-ms",
            "500",
        ]
        settings = {"commit_rows": 200, "freshness_ms": FRESHNESS_MS, "lease_ms": LEASE_MS, **flags}
        for name, value in settings.items():
            self.argv += [f"--{name.replace('_', '-')}", str(value)]
        self.log = tempfile.NamedTemporaryFile(prefix="builder-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BuilderProcess:
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ))
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no chance to commit, release the lease or close anything."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        with open(self.log.name, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")


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
