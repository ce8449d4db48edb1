"""The read path's work split, in one process: what a fan-out's leaves cost against one embedded search.

    .venv/bin/python bench/leaf_bench.py               # the 1M-row search bench table, 3 shares
    .venv/bin/python bench/leaf_bench.py --nodes 4

The table of ``search_bench.py`` (``--rows`` rows in superfiles of ``--max-rows-per-superfile``, built
into its cache if missing) on file://. Its superfiles are split among ``--nodes`` shares by rendezvous
hashing, as a query root places them, under node names picked for the most even split (6 / 5 / 5 for 16
superfiles, as ``fanout_bench.py`` picks its nodes' ports). For each of the 318 real queries, top-10
BM25 and vector searches, ids and scores only, two ways:

- **embedded**: the snapshot's own :class:`~superfile.table.search.Searcher` (one union per kind);
- **fan-out in process**: a :class:`~superfile.search.root.RootSearcher` whose fleet runs each share's
  :class:`~superfile.search.leaf.LeafRequest` with :func:`superfile.search.leaf.run` here, so the root's
  planning and merging and each share's leaf work are measured without HTTP, serialization, or other
  processes on the cores (``fanout_bench.py`` measures the real fleet).

CPU per query (``time.process_time``, this process's threads) over ``--passes`` passes, the two ways
interleaved query by query; the leaves' time is taken around each leaf call, so the root's own share is
the rest. The answers of the two ways are compared (ids and scores, and whether the scores are bit-equal),
and the BM25 leaf calls are counted by the way they were answered: padded (one tantivy search of the share
padded to the table's statistics) or rescored. Before measuring, it waits for the full-text merges its
unions asked for, and warms again on the merged segments. Saves ``bench/results/<--out>.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import median, save
from search_bench import ensure_builds, paths, queries, query_vectors
from superfile.format import fulltext_pads, fulltext_union
from superfile.search.leaf import LeafRequest, run
from superfile.search.placement import assign
from superfile.search.root import RootSearcher
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot

TABLE = "bench"  # search_bench.py's table
K = 10
PROJECTION = ["_id", "score"]


class LocalFleet:
    """A fleet whose nodes are shares of the snapshot's superfiles, their leaf requests run in this process."""

    def __init__(self, owner: dict[str, str]) -> None:
        self.owner = owner
        self.cpu: dict[str, float] = dict.fromkeys(sorted(set(owner.values())), 0.0)

    def run(self, snap: Snapshot, paths: list[str], op: str, args: dict[str, Any]) -> list[Any]:
        shares: dict[str, list[str]] = {}
        for path in paths:
            shares.setdefault(self.owner[path], []).append(path)
        answers = []
        for node, share in sorted(shares.items()):
            start = time.process_time()
            answers.append(run(snap, LeafRequest(TABLE, snap.path, tuple(share), op, args)))
            self.cpu[node] += time.process_time() - start
        return answers


padded: dict[str, int] = {}  # a BM25 leaf call's way: padded (one tantivy search) or rescored


def _counting(native_top: Callable[..., Any]) -> Callable[..., Any]:
    def counted(self: Searcher, *args: Any) -> Any:
        found = native_top(self, *args)
        way = "padded" if found is not None else "rescored"
        padded[way] = padded.get(way, 0) + 1
        return found

    return counted


Searcher._padded_top = _counting(Searcher._padded_top)  # type: ignore[method-assign]


def searches(texts: list[str], vectors: np.ndarray) -> dict[str, Callable[[Searcher, int], pa.Table]]:
    return {
        "bm25": lambda s, i: s.bm25_search("text", texts[i], K, "any", PROJECTION),
        "vector": lambda s, i: s.vector_search(
            "embedding", vectors[i], K, nprobe=None, rerank=None, text_filter=None, where=None, projection=PROJECTION
        ),
    }


def same(a: pa.Table, b: pa.Table) -> bool:
    return a["_id"].to_pylist() == b["_id"].to_pylist() and np.allclose(
        a["score"].to_numpy(), b["score"].to_numpy(), rtol=1e-6, atol=0
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    table = superfile.connect(f"file://{paths(Path(args.cache))['superfile']}").open_table(TABLE)
    snap = table._snapshot
    entries = snap.entries()
    keys = [e.path for e in entries]
    # node names whose rendezvous split is as even as it gets (fanout_bench.py picks ports the same way)
    owned = min(
        (assign(keys, [f"node-{i}-{salt}" for i in range(args.nodes)]) for salt in range(200)),
        key=lambda split: max(len(share) for share in split.values()),
    )
    owner = {path: node for node, share in owned.items() for path in share}
    q = queries()
    texts, vectors = [str(t) for t in q["text"].to_pylist()], query_vectors(q)
    out: dict[str, Any] = {"superfiles": len(entries), "shares": {n: len(s) for n, s in owned.items()}}
    for kind, search in searches(texts, vectors).items():
        fleet = LocalFleet(owner)
        n = len(texts)
        for _ in range(2):  # the second time, with the segments the first one's unions had merged
            for i in range(min(n, 20)):  # warm: unions, opened superfiles, the root's term statistics
                search(Searcher(snap), i)
                search(RootSearcher(snap, fleet), i)
            deadline = time.monotonic() + 120  # BM25 leaves' padding segments, built in the background once
            while fulltext_pads._building and time.monotonic() < deadline:
                time.sleep(0.05)
            fulltext_union.merges_done(120)
        fleet.cpu = dict.fromkeys(fleet.cpu, 0.0)
        padded.clear()
        embedded: list[float] = []
        fanout: list[float] = []
        differing = bit_equal = 0
        for _ in range(args.passes):
            for i in range(n):
                c0 = time.process_time()
                a = search(Searcher(snap), i)
                c1 = time.process_time()
                b = search(RootSearcher(snap, fleet), i)
                c2 = time.process_time()
                embedded.append(c1 - c0)
                fanout.append(c2 - c1)
                differing += not same(a, b)
                bit_equal += a["score"].to_pylist() == b["score"].to_pylist()
        queries_run = args.passes * n
        leaves = sum(fleet.cpu.values())
        result = {
            "queries": queries_run,
            "embedded_cpu_ms": 1e3 * sum(embedded) / queries_run,
            "embedded_cpu_ms_p50": 1e3 * median(embedded),
            "fanout_cpu_ms": 1e3 * sum(fanout) / queries_run,
            "leaves_cpu_ms": 1e3 * leaves / queries_run,
            "leaf_cpu_ms_by_node": {node: 1e3 * s / queries_run for node, s in fleet.cpu.items()},
            "root_cpu_ms": 1e3 * (sum(fanout) - leaves) / queries_run,
            "answers_differing": differing,
            "scores_bit_equal": bit_equal,
            "leaf_calls_padded": padded.get("padded", 0),
            "leaf_calls_rescored": padded.get("rescored", 0),
        }
        result["leaves_over_embedded"] = result["leaves_cpu_ms"] / result["embedded_cpu_ms"]
        print(kind, {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, flush=True)
        out[kind] = result
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--max-rows-per-superfile", type=int, default=62_500)
    p.add_argument("--cache", help="search_bench's cache (default: /tmp/sfbench-search for 1M rows)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out", default="leaf", help="results file name under bench/results (no .json)")
    args = p.parse_args()
    if args.cache is None:
        default = (args.rows, args.max_rows_per_superfile) == (1_000_000, 62_500)
        args.cache = "/tmp/sfbench-search" if default else f"/tmp/sfbench-search-{args.rows}"
    build = argparse.Namespace(rows=args.rows, max_rows_per_superfile=args.max_rows_per_superfile,
                               cache=args.cache, rebuild=False, passes=1, threads="1")  # fmt: skip
    ensure_builds(build, ["bm25"], ["superfile"])
    command = " ".join([".venv/bin/python", "bench/leaf_bench.py", *sys.argv[1:]])
    result = {
        "command": command,
        "rows": args.rows,
        "nodes": args.nodes,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        **measure(args),
        "load_average_at_end": os.getloadavg(),
    }
    print(save(args.out, result))


if __name__ == "__main__":
    main()
