"""Point reads: a top-10 BM25 search that returns its rows' text, on superfiles read by page (this checkout)
and by whole row group (superfiles of another checkout, ``--before-path``), beside LanceDB, in the same run.

    .venv/bin/python bench/point_read_bench.py --before-path /tmp/wt-before/libs/superfile

The rows are search_bench's (``--rows`` real Cranfield + Vaswani texts repeated, ~400 bytes each, with
384-d vectors), in superfiles of ``rows / 16`` rows, on file://. Three tables over the same rows, built once
into ``--cache`` (keyed by rows, this checkout's superfile writer and the other checkout's commit):

- **after**: written by this checkout (no dictionary for columns of mostly distinct values, 64 KiB pages,
  the page index), so a read of a few rows decodes only the pages holding them (``format/pages.py``);
- **before**: written by the ``--before-path`` checkout (built in a process with it first on
  ``PYTHONPATH``): dictionary-encoded text in ~1 MiB pages, no page index, so reading a row decodes its
  row group's text. It is read by this checkout, which reads such files by whole row groups as the old code
  did (what an upgraded reader does with superfiles written before the change);
- **lancedb**: LanceDB with its native full-text index over the same rows (the analysis of superfile's
  "english"), the peer a retrieval user would compare.

Queries: the 318 real Vaswani + Cranfield query texts, top 10, returning ``doc_id`` and ``text``
(superfile also with ``_id, score`` only, the search alone). Each pass runs every query on every system,
the systems interleaved query by query; p50/p99 over passes, CPU ms per query from ``time.process_time``.
The superfile tables answer with the same ids and texts (checked). Saves bench/results/point_read.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, lancedb_english_fts, percentile, save
from search_bench import K, all_rows, queries, superfile_format

BUILD = """
import sys, time, json
sys.path.insert(0, {path!r})
import superfile, pyarrow.parquet as pq
data = pq.read_table({rows_file!r})
db = superfile.connect({uri!r})
t = db.create_table("bench", data.schema, fts_columns=["text"],
                    vector_columns={{"embedding": {{"dim": 384, "metric": "cosine"}}}},
                    max_rows_per_superfile={per_superfile})
t0 = time.perf_counter()
t.append(data)
print(json.dumps({{"seconds": time.perf_counter() - t0, "superfiles": t.stats()["superfile_count"],
                  "library": superfile.__file__}}))
"""
PROJECTION = ["_id", "score", "doc_id", "text"]


def git_commit(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def build(cache: Path, rows: int, before: Path) -> dict[str, Any]:
    """The three tables, once per (rows, checkouts); their build records."""
    key = {"rows": rows, "after": superfile_format(), "before": git_commit(before)}
    record = cache / "builds.json"
    if record.exists() and json.loads(record.read_text()).get("key") == key:
        return dict(json.loads(record.read_text()))
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    cache.mkdir(parents=True)
    rows_file = cache / "rows.parquet"
    import pyarrow.parquet as pq

    pq.write_table(all_rows(rows), rows_file)
    info: dict[str, Any] = {"key": key}
    for name, path in (("after", ROOT / "libs" / "superfile"), ("before", before)):
        script = BUILD.format(
            path=str(path), rows_file=str(rows_file), uri=f"file://{cache / name}", per_superfile=rows // 16
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        info[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  built {name}: {info[name]}", flush=True)
    import lancedb

    t0 = time.perf_counter()
    table = lancedb.connect(str(cache / "lancedb")).create_table("bench", pq.read_table(rows_file))
    lancedb_english_fts(table)
    info["lancedb"] = {"seconds": time.perf_counter() - t0}
    rows_file.unlink()
    record.write_text(json.dumps(info, indent=2))
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cache", default=None, help="where the tables are built (default /tmp/sfbench-points-<rows>)")
    p.add_argument("--before-path", required=True, help="another checkout's libs/superfile (writes 'before')")
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args()
    cache = Path(args.cache or f"/tmp/sfbench-points-{args.rows}")
    info = build(cache, args.rows, Path(args.before_path))

    import lancedb
    import superfile

    q = queries()["text"].to_pylist()
    after = superfile.connect(f"file://{cache / 'after'}").open_table("bench")
    before = superfile.connect(f"file://{cache / 'before'}").open_table("bench")
    peer = lancedb.connect(str(cache / "lancedb")).open_table("bench")
    systems: dict[str, Any] = {
        "superfile, ids only": lambda text: after.bm25_search("text", text, k=K, projection=["_id", "score"]),
        "superfile, text, by page (after)": lambda text: after.bm25_search("text", text, k=K, projection=PROJECTION),
        "superfile, text, by row group (before)": lambda text: before.bm25_search(
            "text", text, k=K, projection=PROJECTION
        ),
        "lancedb, text": lambda text: (
            peer.search(text, query_type="fts", fts_columns="text").limit(K).select(["doc_id", "text"]).to_arrow()
        ),
    }
    for fn in systems.values():  # warm: open readers, extract indexes, page in
        for text in q:
            fn(text)
    lat: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, float] = dict.fromkeys(systems, 0.0)
    differing = 0
    for _ in range(args.passes):
        for text in q:
            answers = {}
            for name, fn in systems.items():
                c0, t0 = time.process_time(), time.perf_counter()
                answers[name] = fn(text)
                lat[name].append((time.perf_counter() - t0) * 1e3)
                cpu[name] += time.process_time() - c0
            a, b = answers["superfile, text, by page (after)"], answers["superfile, text, by row group (before)"]
            if a.column("doc_id").to_pylist() != b.column("doc_id").to_pylist() or not a.column("text").equals(
                b.column("text")
            ):
                differing += 1
    n = args.passes * len(q)
    out: dict[str, Any] = {
        "rows": args.rows,
        "queries": len(q),
        "passes": args.passes,
        "builds": info,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "answers_differing_before_after": differing,
        "systems": {
            name: {
                "p50_ms": percentile(xs, 50),
                "p99_ms": percentile(xs, 99),
                "cpu_ms_per_query": cpu[name] / n * 1e3,
            }
            for name, xs in lat.items()
        },
    }
    s = out["systems"]
    page, whole, lance = (
        s["superfile, text, by page (after)"],
        s["superfile, text, by row group (before)"],
        s["lancedb, text"],
    )
    out["ratios"] = {
        "after_over_before_p50": page["p50_ms"] / whole["p50_ms"],
        "after_over_lancedb_p50": page["p50_ms"] / lance["p50_ms"],
    }
    save("point_read", out)
    print(json.dumps({k: v for k, v in out.items() if k != "builds"}, indent=2))


if __name__ == "__main__":
    main()
