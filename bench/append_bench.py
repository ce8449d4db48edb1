"""Append throughput with both indexes: superfile (file://, s3://) beside LanceDB, same rows, same run.

    .venv/bin/python bench/append_bench.py --rows 1000000 --batch-rows 100000 --repeat 3

Each system runs in its own process (peak RSS is its own). LanceDB's time
includes building its full-text and vector indexes, as superfile builds both
inside every commit. Prints and saves medians to bench/results/append.json.

Small writes (``--small``): a table with a full-text and a vector column gets a
seed load (``--seed-rows``, both systems build both indexes there), then
``--appends`` appends of ``--append-rows`` rows and ``--deletes`` deletes of one
row (``doc_id = x``), each timed alone; and 15 more appends before the deletes
and 15 after, each followed by a top-10 BM25 query timed twice: the first after
the commit (what a streaming table's reader meets) and once warm. Medians (ms)
per system, each system in its own process, the systems alternating
``--repeat`` times in one run.
Saves bench/results/small_writes.json.

    .venv/bin/python bench/append_bench.py --small --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
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


def _small_workload(
    seed_rows: int, appends: int, append_rows: int, deletes: int, extra: int = 0
) -> tuple[Any, list[Any], list[int]]:
    """The seed, ``appends + extra`` small batches, and the rows to delete (among the seed and the first
    ``appends`` batches)."""
    import pyarrow as pa

    total = seed_rows + appends * append_rows
    everything = total + extra * append_rows
    rows = pa.concat_tables(list(repeated(everything, everything)))
    small = [rows.slice(seed_rows + i * append_rows, append_rows) for i in range(appends + extra)]
    step = max(1, total // max(deletes, 1))
    return rows.slice(0, seed_rows), small, [(i * step * 7919) % total for i in range(deletes)]


FRESH_APPENDS = 30  # appends each followed by a query: half before the deletes, half after
FRESH_QUERIES = ["boundary layer flow", "heat transfer", "supersonic wing", "shock wave", "pressure distribution"]


def _ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": median(s), "p90_ms": s[int(0.9 * (len(s) - 1))], "mean_ms": sum(s) / len(s)}


def child_small(
    system: str, target: str, seed_rows: int, appends: int, append_rows: int, deletes: int, level0: int
) -> dict[str, Any]:
    seed, small, doomed = _small_workload(seed_rows, appends, append_rows, deletes, FRESH_APPENDS)
    small, fresh = small[:appends], small[appends:]
    if system == "lancedb-small":
        import lancedb

        db = lancedb.connect(target)
        t = db.create_table("bench", seed)
        t.create_fts_index("text")
        t.create_index(metric="cosine", vector_column_name="embedding", index_type="IVF_PQ")
        add, remove = t.add, t.delete

        def bm25(text: str) -> int:
            return int(t.search(text, query_type="fts").limit(10).to_arrow().num_rows)
    else:
        import superfile

        db = superfile.connect(target)
        t = db.create_table(
            "bench",
            seed.schema,
            fts_columns=["text"],
            vector_columns={"embedding": {"dim": 384}},
            level0_max_rows=level0,
        )
        t.append(seed)
        add, remove = t.append, t.delete

        def bm25(text: str) -> int:
            return t.bm25_search("text", text, k=10, projection=["_id", "score"]).num_rows

    for b in small[:3]:  # warm-up: imports, caches, the first commit's lazy paths
        add(b)
    append_ms = []
    for b in small[3:]:
        t0 = time.perf_counter()
        add(b)
        append_ms.append((time.perf_counter() - t0) * 1000)

    def freshness(batches: list[Any]) -> tuple[list[float], list[float]]:
        """The first BM25 query after each append (what a streaming table's readers meet), then the same
        query again."""
        first_ms, warm_ms = [], []
        for i, b in enumerate(batches):
            add(b)
            text = FRESH_QUERIES[i % len(FRESH_QUERIES)]
            for into in (first_ms, warm_ms):
                t0 = time.perf_counter()
                hits = bm25(text)
                into.append((time.perf_counter() - t0) * 1000)
            assert hits == 10
        return first_ms, warm_ms

    half = len(fresh) // 2
    fresh_first, fresh_warm = freshness(fresh[:half])  # no row deleted yet
    delete_ms = []
    for x in doomed:
        t0 = time.perf_counter()
        remove(f"doc_id = {x}")
        delete_ms.append((time.perf_counter() - t0) * 1000)
    deleted_first, deleted_warm = freshness(fresh[half:])  # with deleted rows
    out: dict[str, Any] = {
        "append": _ms(append_ms),
        "delete": _ms(delete_ms),
        "query_after_append": _ms(fresh_first),
        "query_warm": _ms(fresh_warm),
        "query_after_append_with_deletes": _ms(deleted_first),
        "query_warm_with_deletes": _ms(deleted_warm),
        "rows": t.count_rows(),
    }
    if system != "lancedb-small":
        out["unindexed_superfiles"] = t.stats()["unindexed_superfiles"]
    return out


OPS = (
    "append",
    "delete",
    "query_after_append",
    "query_warm",
    "query_after_append_with_deletes",
    "query_warm_with_deletes",
)


def main_small(args: argparse.Namespace) -> None:
    systems = ["superfile-small", "lancedb-small"]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    load_before = os.getloadavg()  # the machine is shared: the load the run met is part of its result
    shape = [str(args.seed_rows), str(args.appends), str(args.append_rows), str(args.deletes), str(args.level0)]
    for _ in range(args.repeat):
        for system in systems:
            work = tempfile.mkdtemp(prefix="sfbench-")
            target = (
                (f"file://{work}" + ("?fsync=false" if args.fsync == "off" else ""))
                if system.startswith("superfile")
                else work
            )
            runs[system].append(run_isolated(Path(__file__), "--small-child", system, target, *shape))
            shutil.rmtree(work, ignore_errors=True)
            print(system, runs[system][-1], flush=True)
    summary: dict[str, Any] = {}
    for s, rs in runs.items():
        summary[s] = {op: median([r[op]["p50_ms"] for r in rs]) for op in OPS}
        summary[s]["runs"] = rs
    for op in OPS:
        summary[f"{op}_ratio_vs_lancedb"] = summary["superfile-small"][op] / summary["lancedb-small"][op]
    summary["config"] = {
        "seed_rows": args.seed_rows,
        "appends": args.appends,
        "append_rows": args.append_rows,
        "deletes": args.deletes,
        "repeat": args.repeat,
        "level0_max_rows": args.level0,
        "fsync": args.fsync,
    }
    summary["load_avg"] = {"before": load_before, "after": os.getloadavg()}
    save("small_writes" if args.fsync == "on" else "small_writes_nofsync", summary)
    print(
        json.dumps(
            {
                k: v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "runs"}
                for k, v in summary.items()
            },
            indent=2,
        )
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch-rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--systems", default="superfile-file,superfile-s3,lancedb")
    p.add_argument("--child", nargs=2, metavar=("SYSTEM", "TARGET"))
    p.add_argument("--small", action="store_true", help="small writes: 20-row appends and 1-row deletes")
    p.add_argument("--seed-rows", type=int, default=5000)
    p.add_argument("--appends", type=int, default=100)
    p.add_argument("--append-rows", type=int, default=20)
    p.add_argument("--deletes", type=int, default=50)
    p.add_argument("--level0", type=int, default=5000, help="superfile's level0_max_rows (0: index every write)")
    p.add_argument("--fsync", choices=("on", "off"), default="on", help="superfile's file:// fsyncs")
    p.add_argument("--small-child", nargs=7)
    args = p.parse_args()
    if args.small_child:
        system, target, *shape = args.small_child
        print(json.dumps(child_small(system, target, *map(int, shape))))
        return
    if args.small:
        main_small(args)
        return
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
