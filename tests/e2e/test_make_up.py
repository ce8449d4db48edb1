"""``make up`` starts the whole suite as local processes and ``make down`` stops it, as the README says.

The suite gets ports of its own (``SUITE_ARGS``) so it runs beside the test harness's servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_make_up_serves_reads_and_writes_and_make_down_stops_everything(tmp_path: Path) -> None:
    state_dir = tmp_path / "suite"
    ports = {name: free_port() for name in ("gateway", "kafka", "s3", "redis", "builder-metrics")}
    suite_args = f"--dir {state_dir} " + " ".join(f"--{name}-port {port}" for name, port in ports.items())
    up = _make("up", suite_args)
    state_file = state_dir / "suite.json"
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-4000:]
        assert "suite up. Try:" in up.stdout
        state = json.loads(state_file.read_text())
        assert set(state["pids"]) == {"s3", "kafka", "redis", "builder", "gateway"}
        assert state["gateway"] == f"http://127.0.0.1:{ports['gateway']}"

        # A write goes gateway -> broker -> builder -> S3 and is read back through the gateway.
        with superfile.connect(state["gateway"], api_key="dev-key") as db:
            table = db.create_table(
                "docs", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
            )
            version = table.append([{"id": 1, "text": "hello suite"}, {"id": 2, "text": "another row"}])
            assert version is not None and version > 1  # acknowledged once the builder made it visible
            hits = table.bm25_search("text", "suite", k=5, projection=["id"])
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
