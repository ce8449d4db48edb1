"""Append throughput with both indexes: superfile (file://, s3://) beside LanceDB, same rows, same run.

    .venv/bin/python bench/append_bench.py --rows 1000000 --batch-rows 100000 --repeat 3

Each system runs in its own process (peak RSS is its own). LanceDB's time
includes building its full-text and vector indexes, as superfile builds both
inside every commit. Prints and saves medians to bench/results/append.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, peak_rss_mb, repeated, run_isolated, save


def child_superfile(uri: str, rows: int, batch_rows: int) -> dict[str, float]:
    import superfile

    batches = list(repeated(rows, batch_rows))
    db = superfile.connect(uri)
    t = db.create_table("bench", batches[0].schema, fts_columns=["text"], vector_columns={"embedding": {"dim": 384}})
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    for b in batches:
        t.append(b)
    elapsed = time.perf_counter() - t0
    assert t.count_rows() == rows
    return {
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_mb": rss_before,
        "superfiles": t.stats()["superfile_count"],
    }


def child_lancedb(path: str, rows: int, batch_rows: int) -> dict[str, float]:
    import lancedb

    batches = list(repeated(rows, batch_rows))
    db = lancedb.connect(path)
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    t = db.create_table("bench", batches[0])
    for b in batches[1:]:
        t.add(b)
    t_add = time.perf_counter() - t0
    t.create_fts_index("text")
    t.create_index(metric="cosine", vector_column_name="embedding")
    elapsed = time.perf_counter() - t0
    assert t.count_rows() == rows
    return {
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "add_seconds": t_add,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_mb": rss_before,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch-rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--systems", default="superfile-file,superfile-s3,lancedb")
    p.add_argument("--child", nargs=2, metavar=("SYSTEM", "TARGET"))
    args = p.parse_args()
    if args.child:
        system, target = args.child
        fn = child_lancedb if system == "lancedb" else child_superfile
        print(json.dumps(fn(target, args.rows, args.batch_rows)))
        return

    import boto3
    from superfile_suite.servers import start_moto

    systems = args.systems.split(",")
    moto = None
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    if "superfile-s3" in systems:
        import os

        os.environ.update(env)
        moto = start_moto()
        endpoint = moto.url
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    try:
        for _ in range(args.repeat):
            for system in systems:
                work = tempfile.mkdtemp(prefix="sfbench-")
                if system == "superfile-file":
                    target = f"file://{work}"
                elif system == "superfile-s3":
                    bucket = f"bench-{uuid.uuid4().hex[:12]}"
                    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
                    target = f"s3://{bucket}/t?endpoint_url={quote(endpoint, safe='')}"
                else:
                    target = work
                argv = [
                    "--rows",
                    str(args.rows),
                    "--batch-rows",
                    str(args.batch_rows),
                    "--child",
                    system,
                    target,
                ]
                runs[system].append(run_isolated(Path(__file__), *argv, env=env))
                shutil.rmtree(work, ignore_errors=True)
                print(system, runs[system][-1], flush=True)
    finally:
        if moto is not None:
            moto.stop()
    summary = {
        s: {
            "rows_per_s": median([r["rows_per_s"] for r in rs]),
            "peak_rss_mb": median([r["peak_rss_mb"] for r in rs]),
            "runs": rs,
        }
        for s, rs in runs.items()
    }
    if "lancedb" in summary:
        for s in summary:
            if s != "lancedb":
                summary[s]["ratio_vs_lancedb"] = summary[s]["rows_per_s"] / summary["lancedb"]["rows_per_s"]
    summary["config"] = {"rows": args.rows, "batch_rows": args.batch_rows, "repeat": args.repeat}
    save("append", summary)
    print(json.dumps({s: {k: v for k, v in d.items() if k != "runs"} for s, d in summary.items()}, indent=2))


if __name__ == "__main__":
    main()
