"""Searches of a table larger than the open-superfile bytes budget (docs/storage.md, "Open superfiles").

    flock /tmp/supertable-bench.lock .venv/bin/python bench/open_budget_bench.py --budgets 0,1000000000

Opens the search benchmark's table (``bench/search_bench.py``'s cache, default /tmp/sfbench-search: 1M rows
in 16 superfiles on file://, ~2.1 GB) in a fresh process per budget (``SUPERFILE_OPEN_BYTES``; 0 means the
default, a quarter of memory) and runs the 318 real queries' BM25 and vector searches (top 10, default
knobs) from one thread: 30 to warm up, then ``--queries`` timed. Reported per budget and kind: p50 and p99
in ms and the superfiles opened per timed query (0 once every reader stays open). Results:
``bench/results/open_budget.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, percentile, run_isolated, save


def child(cache: str, queries_n: int) -> dict[str, Any]:
    import superfile
    from search_bench import queries, query_vectors
    from superfile.format.reader import SuperfileReader

    opened = [0]
    original = SuperfileReader.open.__func__  # type: ignore[attr-defined]

    def counted(cls: type[SuperfileReader], *args: Any, **kwargs: Any) -> SuperfileReader:
        opened[0] += 1
        reader: SuperfileReader = original(cls, *args, **kwargs)
        return reader

    SuperfileReader.open = classmethod(counted)  # type: ignore[method-assign,assignment]
    table = superfile.connect(f"file://{cache}/superfile").open_table("bench")
    q = queries()
    texts, vectors = q["text"].to_pylist(), query_vectors(q)
    kinds = {
        "bm25": lambda i: table.bm25_search("text", texts[i], 10, projection=["_id"]),
        "vector": lambda i: table.vector_search("embedding", vectors[i], 10, projection=["_id"]),
    }
    out: dict[str, Any] = {"superfiles": len(table._snapshot.entries())}
    for kind, search in kinds.items():
        for i in range(30):
            search(i)
        before, times = opened[0], []
        for i in range(queries_n):
            t0 = time.perf_counter()
            search(i % len(texts))
            times.append((time.perf_counter() - t0) * 1000)
        out[kind] = {
            "p50_ms": median(times),
            "p99_ms": percentile(times, 99),
            "opens_per_query": (opened[0] - before) / queries_n,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--budgets", default="0,1000000000", help="SUPERFILE_OPEN_BYTES values; 0: the default")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.cache, args.queries)))
        return
    if not (Path(args.cache) / "superfile").is_dir():
        p.error(f"no table in {args.cache}: run bench/search_bench.py --rows 1000000 first")
    results: dict[str, Any] = {}
    for budget in [int(b) for b in args.budgets.split(",")]:
        env = {"SUPERFILE_OPEN_BYTES": str(budget)} if budget else {"SUPERFILE_OPEN_BYTES": ""}
        res = run_isolated(Path(__file__), "--child", "--cache", args.cache, "--queries", str(args.queries), env=env)
        results[str(budget or "default")] = res
        print(budget or "default", json.dumps(res), flush=True)
    save("open_budget", {"cache": args.cache, "queries": args.queries, "load_average": os.getloadavg(), **results})


if __name__ == "__main__":
    main()
