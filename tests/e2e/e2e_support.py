"""Helpers of the service tests: the builder and the gateway as real subprocesses (so they can be SIGKILLed),
bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

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


class GatewayProcess:
    """``python -m superfile_gateway`` on a free port, configured by ``SUPERFILE_*`` variables (no keys unless
    ``SUPERFILE_API_KEYS`` is given); started and healthy on return."""

    def __init__(self, **env: str) -> None:
        from superfile_suite import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="gateway-", suffix=".log", delete=False)  # noqa: SIM115
        settings = {"SUPERFILE_NO_AUTH": "0" if "SUPERFILE_API_KEYS" in env else "1", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "superfile_gateway", "--port", str(self.port)],
            env={**os.environ, **settings},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._healthy, 60, "the gateway to answer /healthz")

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, self.output()
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def output(self) -> str:
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)
