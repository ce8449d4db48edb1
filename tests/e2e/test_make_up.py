"""``make up`` starts the whole suite as local processes and ``make down`` stops it, as the README says.

The suite gets ports of its own (``SUITE_ARGS``) so it runs beside the test harness's servers. Reads go through
the gateway to a query root and its three cache nodes (docs/query.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import superfile
from superfile_suite import free_port

ROOT = Path(__file__).resolve().parents[2]


def _make(target: str, suite_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", target, f"SUITE_ARGS={suite_args}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _distinct_free_ports(n: int) -> list[int]:
    """``n`` different free ports (``free_port`` alone may report one port twice: it is free again at once)."""
    found: set[int] = set()
    while len(found) < n:
        found.add(free_port())
    return sorted(found)


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_make_up_serves_reads_and_writes_and_make_down_stops_everything(tmp_path: Path) -> None:
    state_dir = tmp_path / "suite"
    free = _distinct_free_ports(10)
    ports = {name: free.pop() for name in ("gateway", "kafka", "s3", "redis", "builder-metrics")}
    query_ports = [free.pop() for _ in range(2)]
    cache_ports = [free.pop() for _ in range(3)]
    suite_args = f"--dir {state_dir} " + " ".join(f"--{name}-port {port}" for name, port in ports.items())
    suite_args += f" --query-ports {','.join(map(str, query_ports))} --cache-ports {','.join(map(str, cache_ports))}"
    up = _make("up", suite_args)
    state_file = state_dir / "suite.json"
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-4000:]
        assert "suite up. Try:" in up.stdout
        state = json.loads(state_file.read_text())
        read_path = {"query-1", "query-2", "cache-1", "cache-2", "cache-3"}
        assert set(state["pids"]) == {"s3", "kafka", "redis", "builder", "gateway"} | read_path
        assert state["gateway"] == f"http://127.0.0.1:{ports['gateway']}"
        assert state["query"] == [f"http://127.0.0.1:{p}" for p in query_ports]
        assert state["cache_nodes"] == [f"http://127.0.0.1:{p}" for p in cache_ports]
        token = state["internal_token"]
        assert len(token) >= 32 and token not in up.stdout  # in the owner-only state file, not on the terminal
        assert state_file.stat().st_mode & 0o077 == 0
        for query in state["query"]:  # both roots see the three cache nodes, all healthy
            members = _get(f"{query}/v1/cluster", token)["members"]
            assert sorted(m["url"] for m in members) == sorted(state["cache_nodes"])
            assert all(m["healthy"] for m in members), members

        def leaf_requests() -> int:
            return sum(_get(f"{node}/v1/stats", token)["leaf_requests"] for node in state["cache_nodes"])

        before = leaf_requests()

        # A write goes gateway -> broker -> builder -> S3 and is read back through the gateway.
        with superfile.connect(state["gateway"], api_key="dev-key") as db:
            table = db.create_table(
                "docs", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
            )
            version = table.append([{"id": 1, "text": "hello suite"}, {"id": 2, "text": "another row"}])
            assert version is not None and version > 1  # acknowledged once the builder made it visible
            hits = table.bm25_search("text", "suite", k=5, projection=["id"])
            assert hits.column("id").to_pylist() == [1]
            assert table.count_rows("id > 0") == 2
        # the gateway sent those reads to the query root, whose leaves ran on the cache nodes
        assert leaf_requests() > before
        with superfile.connect(state["query"][1], api_key=token) as root:  # the second root answers as well
            hits = root.open_table("docs").bm25_search("text", "suite", k=5, projection=["id"])
            assert hits.column("id").to_pylist() == [1]
        metrics = urllib.request.urlopen(state["builder_metrics"], timeout=10).read().decode()
        assert any(
            line.startswith("superfile_builder_commits_total") and 'table="docs"' in line
            for line in metrics.splitlines()
        )
    finally:
        pids = json.loads(state_file.read_text())["pids"] if state_file.exists() else {}
        down = _make("down", f"--dir {state_dir}")
    assert down.returncode == 0 and "suite stopped" in down.stdout, down.stderr[-2000:]
    assert not state_file.exists()
    assert pids and not [name for name, pid in pids.items() if _alive(pid)]
