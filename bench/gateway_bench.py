"""Gateway overhead: the same top-10 BM25 query in-process and through the SDK and a gateway process.

    .venv/bin/python bench/gateway_bench.py --rounds 5

Loads the bundled Cranfield sample (1,400 documents) into a file:// table,
starts ``superfile serve`` on it in its own process (embedded mode, API key
auth on), and runs the 225 Cranfield queries as ``bm25_search("text", q,
k=10, projection=["id", "title"])`` through an in-process table and through
``superfile.connect("http://...")``, interleaved query by query so both see
the same machine load. Overhead is the SDK latency minus the in-process one,
per query; the p50 of those differences is the figure the target is about.
The results of both paths are checked to be the same rows.

A second measure needs no other process: the gateway reports each query's
engine time in a ``Server-Timing`` header, and the SDK latency minus it is
what HTTP, the gateway and the SDK add to that very query (same process, same
caches). Both are reported.

Saves bench/results/gateway.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import SAMPLE, median, percentile, save
from superfile_suite import free_port

QUERY = {"column": "text", "k": 10, "projection": ["id", "title"]}


def serve(uri: str, key: str) -> tuple[subprocess.Popen[bytes], str]:
    """``superfile serve`` on ``uri`` in its own process, read-only key ``key``; its URL once it answers."""
    port = free_port()
    env = {**os.environ, "SUPERFILE_API_KEYS": f"{key}:*:r"}
    cmd = [str(Path(sys.executable).with_name("superfile")), "serve", uri, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the gateway did not start within 30 s")


def run(rounds: int) -> dict[str, Any]:
    docs = pq.read_table(SAMPLE / "cranfield" / "docs.parquet")
    queries = pq.read_table(SAMPLE / "cranfield" / "queries.parquet").column("text").to_pylist()
    with tempfile.TemporaryDirectory() as root:
        uri = f"file://{root}"
        local = superfile.connect(uri).create_table(
            "cranfield", docs.schema, fts_columns=["title", "text"], vector_columns={"embedding": 384}
        )
        local.append(docs)
        key = secrets.token_urlsafe(18)
        proc, url = serve(uri, key)
        try:
            conn = superfile.connect(url, api_key=key)
            remote = conn.open_table("cranfield")
            engine: list[float] = []

            request = conn.client.request

            def took(*args: Any, **kwargs: Any) -> Any:  # the SDK's request, noting the engine's time
                response = request(*args, **kwargs)
                timing = response.headers.get("server-timing", "")
                if timing.startswith("engine;dur="):
                    engine.append(float(timing.split("=", 1)[1]))
                return response

            conn.client.request = took  # type: ignore[method-assign]
            for q in queries[:20]:  # warm both paths (open superfiles, HTTP connection)
                local.bm25_search(query=q, **QUERY)
                remote.bm25_search(query=q, **QUERY)
            inproc: list[float] = []
            sdk: list[float] = []
            engine.clear()
            for _ in range(rounds):
                for q in queries:
                    t0 = time.perf_counter()
                    want = local.bm25_search(query=q, **QUERY)
                    t1 = time.perf_counter()
                    got = remote.bm25_search(query=q, **QUERY)
                    t2 = time.perf_counter()
                    assert got.column("_id").to_pylist() == want.column("_id").to_pylist(), q
                    inproc.append((t1 - t0) * 1000)
                    sdk.append((t2 - t1) * 1000)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    overhead = [s - i for s, i in zip(sdk, inproc, strict=True)]
    added = [s - e for s, e in zip(sdk, engine, strict=True)]
    return {
        "command": f".venv/bin/python bench/gateway_bench.py --rounds {rounds}",
        "queries": len(queries) * rounds,
        "load_average_at_start": os.getloadavg(),
        "platform": platform.platform(),
        "in_process_ms": {"p50": median(inproc), "p95": percentile(inproc, 95)},
        "sdk_ms": {"p50": median(sdk), "p95": percentile(sdk, 95)},
        "overhead_ms": {"p50": median(overhead), "p95": percentile(overhead, 95)},
        "gateway_engine_ms": {"p50": median(engine), "p95": percentile(engine, 95)},
        "added_to_engine_ms": {"p50": median(added), "p95": percentile(added, 95)},
        "target_overhead_p50_ms": 2.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the 225 queries")
    args = parser.parse_args()
    result = run(args.rounds)
    print(save("gateway", result))
    for name in ("in_process_ms", "sdk_ms", "overhead_ms", "gateway_engine_ms", "added_to_engine_ms"):
        print(f"{name:18} p50 {result[name]['p50']:.2f}  p95 {result[name]['p95']:.2f}")


if __name__ == "__main__":
    main()
