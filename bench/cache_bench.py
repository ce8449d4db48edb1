"""Reads of a table on S3 with and without the disk cache, beside LanceDB on the same S3 server.

    .venv/bin/python bench/cache_bench.py --rows 200000 --repeat 3

One table on the local S3 server (moto): real corpus rows (text and 384-d vectors) repeated to ``--rows``,
in superfiles of 25,000 rows. Every measurement runs in a fresh process, so nothing is open and memory is
its own: connect, one BM25 query (it opens every superfile), one vector query, the BM25 query again (each
returning ``doc_id`` and the score of the top 10); the
times of the three and the process's resident memory after them, anonymous (heap) and file-backed
(mappings: the cached superfiles, and the libraries), from /proc/self/status. Modes:

- ``memory``: ``cache_budget_bytes=0``, every superfile read whole into process memory (before the cache);
- ``cold``: an empty cache directory (every superfile downloaded into it);
- ``warm``: the directory the cold run filled (another process's copies, nothing downloaded);
- ``warm-budget``: as warm, with ``cache_memory_bytes`` a quarter of the table;
- ``cold-unverified``: an empty cache directory and ``verify_checksums=False``: a query reads the ranges
  it needs while the copies download in the background;
- ``lancedb``: LanceDB 0.40 over the same rows on the same server (its FTS and IVF_PQ indexes), which
  reads object ranges and keeps no local copies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import corpus, median, repeated, run_isolated, save, timed

QUERY = "supersonic flow over a swept wing"
MODES = ("memory", "cold", "warm", "warm-budget", "cold-unverified", "lancedb")
_S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def resident_mb() -> dict[str, float]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) / 1024
    return {"rss_anon_mb": fields["RssAnon"], "rss_file_mb": fields["RssFile"]}


def lance_options(endpoint: str) -> dict[str, str]:
    return {"aws_endpoint": endpoint, "allow_http": "true", "aws_region": "us-east-1"} | {
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
    }


def worker(mode: str, uri: str, cache_dir: str, budget: int, lance_uri: str, endpoint: str) -> dict[str, Any]:
    # the query vector comes from the parent: loading the corpus here would leave ~170 MB of freed heap that
    # the allocator returns or not depending on how long the process runs, and blur the memory figures
    q = json.loads(Path(cache_dir, "query.json").read_text())
    cache = None
    if mode == "lancedb":
        import lancedb

        t = lancedb.connect(lance_uri, storage_options=lance_options(endpoint)).open_table("t")

        def bm25() -> Any:
            return t.search(QUERY, query_type="fts").select(["doc_id"]).limit(10).to_arrow()

        def vec() -> Any:
            return t.search(q).select(["doc_id"]).limit(10).to_arrow()
    else:
        options: dict[str, Any] = {"cache_dir": cache_dir}
        if mode == "memory":
            options["cache_budget_bytes"] = 0
        if mode == "warm-budget":
            options["cache_memory_bytes"] = budget
        if mode == "cold-unverified":
            options |= {"cache_dir": f"{cache_dir}/unverified", "verify_checksums": False}
        db = superfile.connect(uri, **options)
        table, cache = db.open_table("t"), db.disk_cache

        def bm25() -> Any:
            return table.bm25_search("text", QUERY, k=10, projection=["doc_id"])

        def vec() -> Any:
            return table.vector_search("embedding", q, k=10, projection=["doc_id"])

    first, hits = timed(bm25)
    ranged = cache.ranged_bytes / 2**20 if cache is not None else 0.0  # what the first query read by ranges
    second, _ = timed(vec)
    again, _ = timed(bm25)
    assert hits.num_rows == 10
    return {"first_bm25_s": first, "vector_s": second, "bm25_again_s": again, "ranged_mb": ranged, **resident_mb()}


def build(uri: str, lance_uri: str, endpoint: str, rows: int) -> int:
    """Write the table (and LanceDB's); the bytes of its superfiles."""
    writer = superfile.connect(uri, cache_budget_bytes=0)
    batches = list(repeated(rows, 25_000))
    table = writer.create_table(
        "t",
        schema=batches[0].schema,
        fts_columns=["text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
        max_rows_per_superfile=25_000,
    )
    for batch in batches:
        table.append(batch)
    import lancedb

    lance = lancedb.connect(lance_uri, storage_options=lance_options(endpoint)).create_table("t", data=batches[0])
    for batch in batches[1:]:
        lance.add(batch)
    lance.create_fts_index("text")
    lance.create_index(metric="cosine", vector_column_name="embedding", num_partitions=64, num_sub_vectors=48)
    return sum(e.size for e in table.last_snapshot.entries())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--worker", nargs=6, metavar=("MODE", "URI", "CACHE", "BUDGET", "LANCE", "ENDPOINT"))
    args = p.parse_args()
    if args.worker:
        mode, uri, cache_dir, budget, lance_uri, endpoint = args.worker
        print(json.dumps(worker(mode, uri, cache_dir, int(budget), lance_uri, endpoint)))
        return
    import boto3
    from superfile_suite.servers import start_moto

    os.environ.update(_S3_ENV)
    with start_moto() as moto:
        boto3.client("s3", endpoint_url=moto.url).create_bucket(Bucket="bench")
        uri = f"s3://bench/sf?endpoint_url={quote(moto.url, safe='')}"
        lance_uri = "s3://bench/lance"
        size = build(uri, lance_uri, moto.url, args.rows)
        print(f"table: {args.rows} rows, {size / 2**20:.0f} MiB of superfiles", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for _ in range(args.repeat):
            cache_dir = tempfile.mkdtemp(prefix="sfcache-")
            query = [float(x) for x in corpus()["embedding"][7].values.to_numpy()]
            Path(cache_dir, "query.json").write_text(json.dumps(query))
            for mode in MODES:
                worker_args = (mode, uri, cache_dir, str(size // 4), lance_uri, moto.url)
                runs[mode].append(run_isolated(Path(__file__), "--worker", *worker_args, env=_S3_ENV))
                print(mode, json.dumps({k: round(v, 4) for k, v in runs[mode][-1].items()}), flush=True)
            shutil.rmtree(cache_dir, ignore_errors=True)
    result = {
        "rows": args.rows,
        "superfile_bytes": size,
        "repeat": args.repeat,
        "medians": {m: {k: median([r[k] for r in rs]) for k in rs[0]} for m, rs in runs.items()},
        "runs": runs,
    }
    print(json.dumps(result["medians"], indent=1))
    save("cache", result)


if __name__ == "__main__":
    main()
