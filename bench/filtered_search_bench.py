"""Filtered vector search on a table ``search_bench.py`` built: p50, CPU per query and recall@10, one process.

    PYTHONPATH=<checkout>/libs/superfile .venv/bin/python bench/filtered_search_bench.py \
        [--cache /tmp/sfbench-search] [--levels 0.001,0.01,0.1,0.5]

Whatever library ``PYTHONPATH`` names searches the cached table as it is, so two checkouts can be run in
turn over the same superfiles (``search_bench.py`` rebuilds a table written by other index code). One
warm-up pass, then one timed pass of the 318 queries per level, 1 client thread; recall against the cache's
exact filtered top 10 (``search_bench.py --kinds filtered`` builds it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--levels", default=",".join(str(x) for x in search_bench.FILTER_LEVELS))
    args = p.parse_args()
    cache = Path(args.cache)
    bench = search_bench.Superfile(cache, search_bench.queries())  # the table, its _id -> doc_id, the queries
    table, doc_of, vectors = bench.t, bench.id2doc, bench.vectors
    truth = np.load(cache / "ground_truth_filtered.npz")
    print(f"library: {bench.stats['library']}")
    for level in (float(x) for x in args.levels.split(",")):
        where = search_bench.where_clause(level)
        for v in vectors:
            table.vector_search("embedding", v, k=10, where=where, projection=["_id"])
        times, hits, cpu = [], 0, time.process_time()
        for i, v in enumerate(vectors):
            start = time.perf_counter()
            got = table.vector_search("embedding", v, k=10, where=where, projection=["_id"])
            times.append(time.perf_counter() - start)
            hits += len(set(doc_of[got["_id"].to_numpy()].tolist()) & set(truth[f"ids_{level}"][i].tolist()))
        cpu = (time.process_time() - cpu) / len(vectors)
        print(
            f"where {level:.1%}: p50 {np.median(times) * 1e3:.2f} ms, CPU {cpu * 1e3:.2f} ms a query, "
            f"recall@10 {hits / (10 * len(vectors)):.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
