"""Full int8 codes against principal-component codes, over the 1M-row search benchmark's 16 superfiles.

    .venv/bin/python bench/vector_codes_bench.py [--cache /tmp/sfbench-search] [--out vector_codes]

Each superfile's stored vectors are indexed twice (``VectorIndexParams(reduce=False)`` and the default), each
set searched as one ``VectorUnion`` (the table's path for superfiles without deletes) with the 318 real
queries, interleaved query by query: recall@10 against exact float32 search and the p50 of ``union.top`` per
(nprobe, rerank), plus each build's time and size. Needs the table that ``search_bench.py --kinds vector``
builds in the cache.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_bench
import superfile
from superfile.format.vector_index import VectorIndex, VectorIndexParams, build_vector_index
from superfile.format.vector_union import VectorUnion
from superfile.table.search import Searcher

K = 10
SETTINGS = [(8, None), (16, None), (48, None), (16, 40), (16, 100), (16, 400)]  # (nprobe, rerank); None: default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--out", default="vector_codes")
    args = p.parse_args()
    table = superfile.connect(f"file://{Path(args.cache) / 'superfile'}").open_table("bench")
    built = Searcher(table._snapshot)._vector_union("embedding")
    assert built is not None, "the bench table has no IVF superfiles"
    stored = [np.array(lists.vectors) for lists in built[0]._lists]  # list order: rows are rows, order aside
    queries = search_bench.query_vectors(search_bench.queries())
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    truth = exact_top(stored, queries)
    unions, builds = {}, {}
    for name, reduce in (("full", False), ("reduced", True)):
        start, blobs = time.perf_counter(), []
        for x in stored:
            blobs.append(build_vector_index(x, "cosine", VectorIndexParams(reduce=reduce)))
        parts = [VectorIndex.from_buffer(b) for b in blobs]
        lists = parts[0].ivf_lists
        builds[name] = {
            "seconds": time.perf_counter() - start,
            "mib": sum(len(b) for b in blobs) / 2**20,
            "code_dims": None if lists is None else int(lists.codes.shape[1]),
            "rerank_default": None if lists is None else lists.rerank,
        }
        unions[name] = VectorUnion(parts)
        print(name, json.dumps(builds[name]), flush=True)
    results = []
    for nprobe, rerank in SETTINGS:
        times: dict[str, list[float]] = {n: [] for n in unions}
        hits = dict.fromkeys(unions, 0)
        for q, want in zip(queries, truth, strict=True):
            for name, union in unions.items():
                start = time.perf_counter()
                got = union.top(q, K, range(len(stored)), nprobe=nprobe, rerank=rerank)
                times[name].append(time.perf_counter() - start)
                hits[name] += len(want & {(p, int(r)) for p, rows, _ in got for r in rows})
        for name in unions:
            row = {
                "codes": name,
                "nprobe": nprobe,
                "rerank": rerank or builds[name]["rerank_default"],
                "recall": hits[name] / (K * len(queries)),
                "p50_ms": float(np.median(times[name]) * 1e3),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    out = Path(__file__).parent / "results" / f"{args.out}.json"
    out.write_text(json.dumps({"builds": builds, "results": results}, indent=2))


def exact_top(stored: list[np.ndarray], queries: np.ndarray) -> list[set[tuple[int, int]]]:
    """The exact top 10 of each query as (part, row offset); a part's vectors are in its index's list order."""
    best = []
    for p, x in enumerate(stored):
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        sims = queries @ unit.T
        top = np.argpartition(-sims, K, axis=1)[:, :K]
        best.append((np.take_along_axis(sims, top, 1), p, top))
    sims = np.concatenate([b[0] for b in best], 1)
    where = np.concatenate([np.stack([np.full_like(b[2], b[1]), b[2]], -1) for b in best], 1)
    order = np.argsort(-sims, 1)[:, :K]
    return [{(int(p), int(r)) for p, r in where[i, order[i]]} for i in range(len(queries))]


if __name__ == "__main__":
    main()
