"""Vector blobs laid out for their offset in the file (aligned views) against laid out for offset 0 (as
superfiles written before were: views as unaligned as the offset the blob landed at).

    .venv/bin/python bench/vector_layout_bench.py [--cache /tmp/sfbench-search] [--out vector_layout]

Each superfile's stored vectors of the search benchmark's table are indexed once with the defaults; the
blob is placed at an odd offset of a 64-byte-aligned buffer (as inside a memory-mapped superfile) twice:
laid out for that offset, and laid out for offset 0. The two sets are searched as one ``VectorUnion`` each
(the table's path for superfiles without deletes) with the 318 real queries, interleaved query by query:
the p50 of ``union.top`` per nprobe, and a check that both answer alike. Needs the table that
``search_bench.py --kinds vector`` builds in the cache.
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
from superfile.format.vector_index import VectorIndex, build_vector_blob
from superfile.format.vector_union import VectorUnion
from superfile.table.search import Searcher

K = 10
NPROBES = [8, 16, None]  # None: the parts' default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out", default="vector_layout")
    args = p.parse_args()
    table = superfile.connect(f"file://{Path(args.cache) / 'superfile'}").open_table("bench")
    built = Searcher(table._snapshot)._vector_union("embedding")
    assert built is not None, "the bench table has no IVF superfiles"
    parts: dict[str, list[VectorIndex]] = {"aligned": [], "unaligned": []}
    for i, lists in enumerate(built[0]._lists):
        blob = build_vector_blob(np.array(lists.vectors), "cosine")
        offset = 1001 + 7 * i  # where the Parquet data before the blob happened to end
        for name, layout in (("aligned", offset), ("unaligned", 0)):
            parts[name].append(VectorIndex.from_buffer(_placed(blob(layout), offset)))
    unions = {name: VectorUnion(p) for name, p in parts.items()}
    queries = search_bench.query_vectors(search_bench.queries())
    every = range(len(parts["aligned"]))
    results = []
    for nprobe in NPROBES:
        times: dict[str, list[float]] = {n: [] for n in unions}
        for _ in range(args.passes):
            for q in queries:
                answers = []
                for name, union in unions.items():
                    start = time.perf_counter()
                    answers.append(union.top(q, K, every, nprobe=nprobe))
                    times[name].append(time.perf_counter() - start)
                assert _same(*answers), "the two layouts answered differently"
        row = {"nprobe": nprobe} | {f"{n}_p50_ms": float(np.median(t) * 1e3) for n, t in times.items()}
        results.append(row)
        print(json.dumps(row), flush=True)
    out = Path(__file__).parent / "results" / f"{args.out}.json"
    out.write_text(json.dumps({"cache": args.cache, "results": results}, indent=2))


def _placed(blob: bytes, offset: int) -> memoryview:
    """``blob`` at ``offset`` of a fresh 64-byte-aligned buffer: a mapped file holding it there."""
    buf = np.zeros(offset + len(blob) + 64, np.uint8)
    start = -buf.ctypes.data % 64 + offset
    buf[start : start + len(blob)] = np.frombuffer(blob, np.uint8)
    return memoryview(buf)[start : start + len(blob)]


def _same(a: list[tuple[int, np.ndarray, np.ndarray]], b: list[tuple[int, np.ndarray, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        p == q and np.array_equal(r, s) and np.array_equal(d, e) for (p, r, d), (q, s, e) in zip(a, b, strict=True)
    )


if __name__ == "__main__":
    main()
