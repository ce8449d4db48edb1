"""The distributed read path as real processes for the service tests: a bucket on moto, cache nodes and a query
service (``superfile-cache`` / ``superfile-query``), and an in-process gateway that writes embedded and
forwards every read to the query service."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from superfile_gateway import BackgroundServer, Settings, parse_api_keys
from superfile_suite import Server, start_cache_node, start_query

API_KEY = "fleet-test-key"


def aws_env(s3: Server) -> dict[str, str]:
    """What an S3 client (this process or a child) needs to reach moto."""
    return {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.url,
    }


@contextmanager
def s3_bucket(s3: Server) -> Iterator[str]:
    """A fresh bucket as an ``s3://`` table root, with the client settings in this process's environment for as
    long as the context lasts (for module-scoped fixtures; ``s3_uri`` is per test)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in aws_env(s3).items():
            mp.setenv(key, value)
        bucket = f"f-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/tables?endpoint_url={s3.url}"


def request(
    url: str, *, token: str | None = None, body: bytes | None = None, method: str | None = None
) -> tuple[int, Any]:
    """One HTTP call: its status and its JSON body (``None`` if not JSON)."""
    headers = {"content-type": "application/json", "accept": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method=method or ("POST" if body else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


@dataclass
class FleetProcesses:
    """Cache nodes, one query service over them, one gateway forwarding reads to it."""

    uri: str
    env: dict[str, str]
    token: str
    cache: list[Server] = field(default_factory=list)
    cache_dirs: list[str] = field(default_factory=list)
    query: Server | None = None
    gateway: BackgroundServer | None = None
    logs: list[str] = field(default_factory=list)
    scratch: list[str] = field(default_factory=list)  # every cache directory made here, removed at the end

    def _log(self, name: str) -> str:
        fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        os.close(fd)
        self.logs.append(path)
        return path

    def start_node(self, cache_dir: str | None = None, port: int | None = None) -> Server:
        """A cache node (a fresh cache directory unless one is given); appended to ``cache`` unless it restarts
        one of them (same port)."""
        directory = cache_dir
        if directory is None:
            directory = tempfile.mkdtemp(prefix="superfile-cache-")
            self.scratch.append(directory)
        node = start_cache_node(self.uri, directory, self.token, env=self.env, port=port, log_path=self._log("cache"))
        for i, old in enumerate(self.cache):
            if old.port == node.port:
                self.cache[i] = node
                return node
        self.cache.append(node)
        self.cache_dirs.append(directory)
        return node

    def start_query(self, nodes: list[Server] | None = None) -> Server:
        urls = [n.url for n in (self.cache if nodes is None else nodes)]
        return start_query(self.uri, urls, self.token, env=self.env, log_path=self._log("query"))

    def cluster(self, query: Server | None = None) -> list[dict[str, Any]]:
        status, body = request(f"{(query or self.query).url}/v1/cluster", token=self.token)  # type: ignore[union-attr]
        assert status == 200, body
        members: list[dict[str, Any]] = body["members"]
        return members

    def stats(self, node: Server) -> dict[str, Any]:
        status, body = request(f"{node.url}/v1/stats", token=self.token)
        assert status == 200, body
        return dict(body)

    def stop_nodes(self) -> None:
        for node in self.cache:
            node.stop()

    def remove_files(self) -> None:
        for path in self.logs:
            if os.path.exists(path):
                os.unlink(path)
        for directory in self.scratch:
            shutil.rmtree(directory, ignore_errors=True)

    def output(self) -> str:
        """The tail of every process's log, for failure messages."""
        parts = []
        for path in self.logs:
            with open(path, "rb") as f:
                parts.append(f"--- {path}\n{f.read()[-3000:].decode(errors='replace')}")
        return "\n".join(parts)


@contextmanager
def running_fleet(uri: str, env: dict[str, str], nodes: int = 3, **gateway: Any) -> Iterator[FleetProcesses]:
    """``nodes`` cache nodes and a query service over ``uri`` (its S3 client settings in ``env``), and a
    gateway with ``API_KEY`` (read-write, every table) forwarding reads there; all stopped on exit."""
    fleet = FleetProcesses(uri, env, secrets.token_hex(16))
    with ExitStack() as stack:
        stack.callback(fleet.remove_files)
        stack.callback(fleet.stop_nodes)
        for _ in range(nodes):
            fleet.start_node()
        fleet.query = fleet.start_query()
        stack.callback(lambda: fleet.query.stop())  # type: ignore[union-attr]
        settings = Settings(
            storage=uri,
            api_keys=parse_api_keys(f"{API_KEY}:*:rw"),
            query_url=fleet.query.url,
            internal_token=fleet.token,
            cleanup_min_age_s=0,
            **gateway,
        )
        fleet.gateway = stack.enter_context(BackgroundServer(settings))
        yield fleet
