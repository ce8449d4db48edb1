"""Hybrid search (BM25 + vector kNN, fused by reciprocal rank) in-process and through the SDK and a gateway.

    .venv/bin/python bench/hybrid_gateway_bench.py --rounds 5

bench/gateway_bench.py's method with ``hybrid_search`` in place of ``bm25_search``: the bundled Cranfield
sample (1,400 documents) in a file:// table, ``superfile serve`` on it in its own process, the 225 Cranfield
queries (their texts and their embeddings) as ``hybrid_search("text", q, "embedding", v, k=10,
projection=["id", "title"])`` in-process and through ``superfile.connect("http://...")``, interleaved query
by query; the gateway's engine time from its ``Server-Timing`` header. Both paths must return the same ids.

Written for issue 21, where the gateway's hybrid route stopped building a ``hybrid_search(...)`` SQL query
and runs the searcher instead: it runs whichever superfile and superfile_gateway come first on the path, so
one checkout's code can be measured against another's (the SDK's request hook is looked up both ways for
that reason). Prints one JSON line; ``--out`` also writes it, with the first round's ids.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import SAMPLE, median, percentile
from gateway_bench import serve

QUERY = {"text_column": "text", "vector_column": "embedding", "k": 10, "projection": ["id", "title"]}


def run(rounds: int) -> dict[str, Any]:
    docs = pq.read_table(SAMPLE / "cranfield" / "docs.parquet")
    q = pq.read_table(SAMPLE / "cranfield" / "queries.parquet")
    texts = q.column("text").to_pylist()
    vectors = np.asarray(q.column("embedding").combine_chunks().values.to_numpy(), np.float32).reshape(-1, 384)
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
            # the SDK's request: conn.client.request since issue 21, conn._request before it
            owner: Any = conn.client if hasattr(conn, "client") else conn
            attr = "request" if hasattr(conn, "client") else "_request"
            request = getattr(owner, attr)

            def took(*args: Any, **kwargs: Any) -> Any:  # the SDK's request, noting the engine's time
                response = request(*args, **kwargs)
                timing = response.headers.get("server-timing", "")
                if timing.startswith("engine;dur="):
                    engine.append(float(timing.split("=", 1)[1]))
                return response

            setattr(owner, attr, took)
            # which gateway answered: since issue 21 an unprojected hybrid returns the vector column too
            unprojected = remote.hybrid_search("text", texts[0], "embedding", vectors[0], 10).column_names
            for i in range(20):  # warm both paths (open superfiles, HTTP connection)
                local.hybrid_search(query=texts[i], vector=vectors[i], **QUERY)
                remote.hybrid_search(query=texts[i], vector=vectors[i], **QUERY)
            inproc: list[float] = []
            sdk: list[float] = []
            ids: list[list[int]] = []
            engine.clear()
            for r in range(rounds):
                for i, text in enumerate(texts):
                    t0 = time.perf_counter()
                    want = local.hybrid_search(query=text, vector=vectors[i], **QUERY)
                    t1 = time.perf_counter()
                    got = remote.hybrid_search(query=text, vector=vectors[i], **QUERY)
                    t2 = time.perf_counter()
                    assert got.column("_id").to_pylist() == want.column("_id").to_pylist(), text
                    inproc.append((t1 - t0) * 1000)
                    sdk.append((t2 - t1) * 1000)
                    if r == 0:
                        ids.append(got.column("_id").to_pylist())
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return {
        "superfile": superfile.__file__,
        "queries": len(texts) * rounds,
        "unprojected_columns": unprojected,
        "in_process_ms": {"p50": median(inproc), "p95": percentile(inproc, 95)},
        "sdk_ms": {"p50": median(sdk), "p95": percentile(sdk, 95)},
        "gateway_engine_ms": {"p50": median(engine), "p95": percentile(engine, 95)},
        "added_to_engine_ms": {"p50": median([s - e for s, e in zip(sdk, engine, strict=True)])},
        "ids_round0": ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the 225 queries")
    parser.add_argument("--out", help="also write the result (with the first round's ids) to this JSON file")
    args = parser.parse_args()
    result = run(args.rounds)
    if args.out:
        Path(args.out).write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "ids_round0"}))


if __name__ == "__main__":
    main()
