"""Compaction: query latency after many small writes, before and after optimize; superfile beside LanceDB.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/maintenance_bench.py

Both systems get the same rows in the same order: one bulk load of
``--seed-rows`` rows (LanceDB needs rows to train its IVF_PQ index, so both
build their full-text and vector indexes there), then ``--appends`` appends of
``--append-rows`` rows each and ``--deletes`` deletes of ``--delete-rows``
random ``doc_id``s each. Then the same queries run before and after
``Supertable.optimize()`` / LanceDB's ``Table.optimize()`` (file compaction
plus index update):

- bm25: the 318 real Vaswani and Cranfield query texts, top 10;
- vector: their 384-d embeddings, top 10, each system's default knobs;
- sql_filter: ``doc_id BETWEEN a AND a + 99`` (superfile SQL; LanceDB's filtered scan);
- sql_scan: ``count(*) WHERE text LIKE '%word%'`` (a full scan of the text column).

Per kind: a warm-up pass, then ``--passes`` passes, one query at a time; p50
and p90 over every query of every pass. ``overlap_before_after`` is how much
of each query's top 10 (by ``doc_id``) survived the compaction. Each system
runs in its own process, one after the other. Results: bench/results/maintenance.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, SAMPLE, SHARED, lancedb_english_fts, peak_rss_mb, percentile, repeated, run_isolated, save

DIM = 384
K = 10
WORDS = ["flow", "layer", "heat", "shock", "wing", "pressure", "boundary", "cell", "retrieval", "theory"]
KINDS = ("bm25", "vector", "sql_filter", "sql_scan")


def queries() -> pa.Table:
    """The real query texts and embeddings: Vaswani (when ../shared is present) then Cranfield."""
    parts = []
    for path in (SHARED / "vaswani" / "queries.parquet", SAMPLE / "cranfield" / "queries.parquet"):
        if path.exists():
            t = pq.read_table(path, columns=["text", "embedding"])
            parts.append(t.set_column(1, "embedding", t["embedding"].cast(pa.list_(pa.float32(), DIM))))
    return pa.concat_tables(parts).combine_chunks()


def workload(args: argparse.Namespace) -> tuple[pa.Table, list[pa.Table], list[list[int]]]:
    """The seed load, the small appends, and the doc_ids each delete removes (some already gone)."""
    total = args.seed_rows + args.appends * args.append_rows
    rows = pa.concat_tables(list(repeated(total, total)))
    seed = rows.slice(0, args.seed_rows)
    small = [rows.slice(args.seed_rows + i * args.append_rows, args.append_rows) for i in range(args.appends)]
    rng = np.random.default_rng(11)
    deletes = [sorted(rng.integers(0, total, args.delete_rows).tolist()) for _ in range(args.deletes)]
    return seed, small, deletes


def measure(run: dict[str, Callable[[int], list[int]]], counts: dict[str, int], passes: int) -> dict[str, Any]:
    """Per kind: p50/p90 latency (ms) over ``passes`` passes after a warm-up, and the last pass's doc_ids."""
    out: dict[str, Any] = {}
    for kind, fn in run.items():
        n = counts[kind]
        for i in range(n):  # warm-up: caches, lazy opens
            fn(i)
        lat: list[float] = []
        hits: list[list[int]] = []
        for _ in range(passes):
            hits = []
            for i in range(n):
                t0 = time.perf_counter()
                hits.append(fn(i))
                lat.append((time.perf_counter() - t0) * 1000)
        out[kind] = {"queries": n, "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "hits": hits}
    return out


def overlap(before: list[list[int]], after: list[list[int]]) -> float:
    """Mean share of a query's results (as a set) found again after compaction."""
    shares = [len(set(a) & set(b)) / len(b) if b else float(not a) for a, b in zip(after, before, strict=True)]
    return float(np.mean(shares))


def child_superfile(target: str, args: argparse.Namespace) -> dict[str, Any]:
    import superfile

    seed, small, deletes = workload(args)
    q = queries()
    texts, vectors = q["text"].to_pylist(), q["embedding"].combine_chunks().values.to_numpy().reshape(-1, DIM)
    db = superfile.connect(target)
    t = db.create_table("bench", seed.schema, fts_columns=["text"], vector_columns={"embedding": {"dim": DIM}})
    t.append(seed)
    t0 = time.perf_counter()
    for b in small:
        t.append(b)
    t1 = time.perf_counter()
    for ids in deletes:
        t.delete(f"doc_id IN ({', '.join(map(str, ids))})")
    t2 = time.perf_counter()
    before_stats = t.stats()
    total = seed.num_rows + sum(b.num_rows for b in small)

    def doc_ids(r: pa.Table) -> list[int]:
        return [int(x) for x in r["doc_id"].to_pylist()]

    run: dict[str, Callable[[int], list[int]]] = {
        "bm25": lambda i: doc_ids(t.bm25_search("text", texts[i], k=K, projection=["doc_id", "score"])),
        "vector": lambda i: doc_ids(t.vector_search("embedding", vectors[i], k=K, projection=["doc_id", "score"])),
        "sql_filter": lambda i: doc_ids(
            db.sql(f"SELECT doc_id FROM bench WHERE doc_id BETWEEN {i * 97 % total} AND {i * 97 % total + 99}")
        ),
        "sql_scan": lambda i: [
            int(db.sql(f"SELECT count(*) AS n FROM bench WHERE text LIKE '%{WORDS[i]}%'")["n"][0].as_py())
        ],
    }
    counts = {"bm25": len(texts), "vector": len(texts), "sql_filter": 50, "sql_scan": len(WORDS)}
    before = measure(run, counts, args.passes)
    t3 = time.perf_counter()
    result = t.optimize()
    optimize_s = time.perf_counter() - t3
    after_stats = t.stats()
    after = measure(run, counts, args.passes)
    bm25_same = all(
        a.equals(b)
        for a, b in (
            (
                t.checkout(before_stats["version"]).bm25_search("text", s, k=K, projection=["_id", "score"]),
                t.bm25_search("text", s, k=K, projection=["_id", "score"]),
            )
            for s in texts[:50]
        )
    )
    return {
        "append_seconds": t1 - t0,
        "append_ms_each": (t1 - t0) / len(small) * 1000,
        "delete_seconds": t2 - t1,
        "delete_ms_each": (t2 - t1) / len(deletes) * 1000,
        "rows": before_stats["row_count"],
        "deleted_rows_before": before_stats["deleted_rows"],
        "files_before": before_stats["superfile_count"],
        "files_after": after_stats["superfile_count"],
        "target_rows": result["target_rows"],
        "optimize_seconds": optimize_s,
        "optimize": result,
        "bm25_identical_before_after": bm25_same,
        "before": before,
        "after": after,
        "peak_rss_mb": peak_rss_mb(),
    }


def child_lancedb(target: str, args: argparse.Namespace) -> dict[str, Any]:
    import lancedb

    seed, small, deletes = workload(args)
    q = queries()
    texts, vectors = q["text"].to_pylist(), q["embedding"].combine_chunks().values.to_numpy().reshape(-1, DIM)
    total = seed.num_rows + sum(b.num_rows for b in small)
    db = lancedb.connect(target)
    t = db.create_table("bench", seed)
    lancedb_english_fts(t)
    t.create_index(metric="cosine", vector_column_name="embedding", index_type="IVF_PQ")
    t0 = time.perf_counter()
    for b in small:
        t.add(b)
    t1 = time.perf_counter()
    for ids in deletes:
        t.delete(f"doc_id IN ({', '.join(map(str, ids))})")
    t2 = time.perf_counter()
    files_before = t.stats()["fragment_stats"]["num_fragments"]

    def doc_ids(r: pa.Table) -> list[int]:
        return [int(x) for x in r["doc_id"].to_pylist()]

    run: dict[str, Callable[[int], list[int]]] = {
        "bm25": lambda i: doc_ids(
            t.search(texts[i], query_type="fts", fts_columns="text").limit(K).select(["doc_id"]).to_arrow()
        ),
        "vector": lambda i: doc_ids(
            t.search(vectors[i], vector_column_name="embedding")
            .distance_type("cosine")
            .limit(K)
            .select(["doc_id"])
            .to_arrow()
        ),
        "sql_filter": lambda i: doc_ids(
            t.search()
            .where(f"doc_id BETWEEN {i * 97 % total} AND {i * 97 % total + 99}")
            .select(["doc_id"])
            .limit(1000)
            .to_arrow()
        ),
        "sql_scan": lambda i: [t.count_rows(f"text LIKE '%{WORDS[i]}%'")],
    }
    counts = {"bm25": len(texts), "vector": len(texts), "sql_filter": 50, "sql_scan": len(WORDS)}
    before = measure(run, counts, args.passes)
    t3 = time.perf_counter()
    t.optimize()
    optimize_s = time.perf_counter() - t3
    after = measure(run, counts, args.passes)
    return {
        "append_seconds": t1 - t0,
        "append_ms_each": (t1 - t0) / len(small) * 1000,
        "delete_seconds": t2 - t1,
        "delete_ms_each": (t2 - t1) / len(deletes) * 1000,
        "rows": t.count_rows(),
        "files_before": files_before,
        "files_after": t.stats()["fragment_stats"]["num_fragments"],
        "optimize_seconds": optimize_s,
        "before": before,
        "after": after,
        "peak_rss_mb": peak_rss_mb(),
    }


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    """One system's result without the per-query hits, plus before/after overlap and speedups."""
    out = {k: v for k, v in r.items() if k not in ("before", "after")}
    for phase in ("before", "after"):
        out[phase] = {k: {m: v for m, v in d.items() if m != "hits"} for k, d in r[phase].items()}
    out["overlap_before_after"] = {k: overlap(r["before"][k]["hits"], r["after"][k]["hits"]) for k in KINDS}
    out["speedup_after_vs_before"] = {k: r["before"][k]["p50_ms"] / r["after"][k]["p50_ms"] for k in KINDS}
    return out


def markdown(result: dict[str, Any]) -> str:
    sf, ld = result["superfile"], result["lancedb"]
    cfg = result["config"]
    lines = [
        "# Maintenance: query latency after small writes, before and after compaction",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Workload: a seed load of {cfg['seed_rows']:,} rows, then {cfg['appends']} appends of "
        f"{cfg['append_rows']} rows and {cfg['deletes']} deletes of {cfg['delete_rows']} random doc_ids "
        f"(real Cranfield/Vaswani text, 384-d embeddings); {cfg['passes']} timed passes after a warm-up, "
        f"one query at a time, file:// and a local LanceDB directory on the same disk. "
        f"{result['cpu_count']} CPUs, load average {result['load_average']} at start (shared machine).",
        "",
        "| | superfile | LanceDB |",
        "|---|---|---|",
        f"| files before / after (superfiles; Lance fragments) | {sf['files_before']} / {sf['files_after']} "
        f"| {ld['files_before']} / {ld['files_after']} |",
        f"| optimize seconds | {sf['optimize_seconds']:.2f} | {ld['optimize_seconds']:.2f} |",
        f"| append ms each (mean) | {sf['append_ms_each']:.1f} | {ld['append_ms_each']:.1f} |",
        f"| delete ms each (mean) | {sf['delete_ms_each']:.1f} | {ld['delete_ms_each']:.1f} |",
        f"| live rows | {sf['rows']:,} | {ld['rows']:,} |",
        "",
        "p50 latency in ms (p90 in parentheses); speedup = before / after; ratio = superfile / LanceDB "
        "(below 1: superfile is faster).",
        "",
        "| query | superfile before | superfile after | speedup | LanceDB before | LanceDB after | speedup "
        "| ratio before | ratio after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in KINDS:
        a, b = sf["before"][k], sf["after"][k]
        c, d = ld["before"][k], ld["after"][k]
        lines.append(
            f"| {k} ({a['queries']} queries) | {a['p50_ms']:.2f} ({a['p90_ms']:.2f}) | {b['p50_ms']:.2f} "
            f"({b['p90_ms']:.2f}) | {sf['speedup_after_vs_before'][k]:.1f}x | {c['p50_ms']:.2f} ({c['p90_ms']:.2f}) "
            f"| {d['p50_ms']:.2f} ({d['p90_ms']:.2f}) | {ld['speedup_after_vs_before'][k]:.1f}x "
            f"| {result['ratio_before'][k]:.2f} | {result['ratio_after'][k]:.2f} |"
        )
    lines += [
        "",
        "Top-10 overlap of each query before and after compaction (1.0: same results):",
        "",
        "| query | superfile | LanceDB |",
        "|---|---|---|",
        *[
            f"| {k} | {sf['overlap_before_after'][k]:.3f} | {ld['overlap_before_after'][k]:.3f} |"
            for k in ("bm25", "vector")
        ],
        "",
        f"superfile BM25 results (ids and scores) identical before and after: "
        f"{sf['bm25_identical_before_after']}. Vector results at default knobs are approximate on both sides "
        "(the index partitions change with the files); exact search gives identical results "
        "(libs/superfile/tests/test_maintenance.py).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed-rows", type=int, default=5000)
    p.add_argument("--appends", type=int, default=500)
    p.add_argument("--append-rows", type=int, default=20)
    p.add_argument("--deletes", type=int, default=100)
    p.add_argument("--delete-rows", type=int, default=5)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--child", nargs=2, metavar=("SYSTEM", "TARGET"))
    args = p.parse_args()
    if args.child:
        system, target = args.child
        fn = child_lancedb if system == "lancedb" else child_superfile
        print(json.dumps(fn(target, args)))
        return
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "child" and v is not None]
    result: dict[str, Any] = {
        "command": " ".join(
            [
                "flock /tmp/supertable-bench.lock .venv/bin/python bench/maintenance_bench.py",
                *map(shlex.quote, sys.argv[1:]),
            ]
        ),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "config": {k: v for k, v in vars(args).items() if k != "child"},
    }
    raw: dict[str, dict[str, Any]] = {}
    for system in ("superfile", "lancedb"):
        work = tempfile.mkdtemp(prefix="sfbench-maint-")
        try:
            target = f"file://{work}" if system == "superfile" else work
            raw[system] = run_isolated(Path(__file__), *argv, "--child", system, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(system, json.dumps(_summary(raw[system])["after"]), flush=True)
    for system, r in raw.items():
        result[system] = _summary(r)
    for phase in ("before", "after"):
        result[f"ratio_{phase}"] = {
            k: raw["superfile"][phase][k]["p50_ms"] / raw["lancedb"][phase][k]["p50_ms"] for k in KINDS
        }
    save("maintenance", result)
    (RESULTS / "maintenance.md").write_text(markdown(result))
    print((RESULTS / "maintenance.md").read_text())


if __name__ == "__main__":
    main()
