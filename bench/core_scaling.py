"""Queries/s on two cores: one client thread, two client threads in one process, two processes of one thread.

    .venv/bin/python bench/core_scaling.py --cache /tmp/sfbench-250k-chain
    .venv/bin/python bench/core_scaling.py --cache /tmp/sfbench-250k-chain --serial  # also searches kept serial

Issue 20 asks two client threads for 1.8x the queries/s of one. A search's Python holds the interpreter lock;
its native steps (tantivy, the IVF scan) let it go, and with a second thread waiting each release hands the lock
over (a futex wake and a context switch), so two threads can cost more CPU per query than one. Two processes
share nothing of the kind. A search alone on an idle machine also spreads its filtered scans and hybrid's two
retrievers over the query pool (``pools.searching``), so one client thread may use both cores already;
``--serial`` adds one and two client threads whose searches each stay on their caller's thread
(``SUPERFILE_QUERY_THREADS=1``), to tell the two apart.

This runs the same queries over the same table (a ``search_bench.py`` cache, built there) the three (or five)
ways, for superfile's vector (nprobe 8), BM25, filtered vector (0.1, 1, 10 and 50% of rows) and hybrid searches,
the first two beside the single usearch and tantivy indexes (``--kinds`` picks some), each ``--repeat`` times,
alternating, and reports medians: queries/s (all clients together) and CPU ms per query (every thread of every
measuring process).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, save
from search_bench import CLASSES, build_info, queries, timed_pass, warm_up

Case = tuple[str, str, dict[str, Any]]  # system, kind, setting
CASES: tuple[Case, ...] = (
    ("superfile", "vector", {"nprobe": 8}),
    ("usearch", "vector", {"ef": 256}),
    ("superfile", "bm25", {}),
    ("tantivy", "bm25", {}),
    ("superfile", "filtered", {"level": 0.001}),
    ("superfile", "filtered", {"level": 0.01}),
    ("superfile", "filtered", {"level": 0.1}),
    ("superfile", "filtered", {"level": 0.5}),
    ("superfile", "hybrid", {}),
)
KEYS = ("qps", "cpu_ms_per_query")


def _client(
    system: str,
    kind: str,
    setting: dict[str, Any],
    cache: str,
    threads: int,
    serial: bool,
    passes: int,
    ready: Any,
    out: Any,
) -> None:
    """Open the system, warm it with every query once, wait at ``ready`` for the other clients, then run
    ``passes`` passes over the queries from ``threads`` client threads (``search_bench.timed_pass``); put
    (queries, wall s, CPU s) on ``out``."""
    if serial:  # read when the query pool starts, at the first search
        os.environ["SUPERFILE_QUERY_THREADS"] = "1"
    q = queries()
    n = q.num_rows
    sysobj = CLASSES[system](Path(cache), q)
    if hasattr(sysobj, "prepare"):
        sysobj.prepare(setting)
    fn = getattr(sysobj, kind)

    def query(i: int) -> Any:
        return fn(i, setting)

    warm_up(sysobj, query, n)
    ready.wait()
    cpu0, wall = time.process_time(), 0.0
    for _ in range(passes):  # as search_bench.py runs its client threads
        wall += timed_pass(query, n, threads)[1]
    out.put((n * passes, wall, time.process_time() - cpu0))


def run(case: Case, cache: Path, processes: int, threads: int, serial: bool, passes: int) -> dict[str, float]:
    """``processes`` processes of ``threads`` client threads each, started together once all are warm; with
    ``serial``, no search spreads over the query pool."""
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(*case, str(cache), threads, serial, passes, ready, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    ready.wait(timeout=600)
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    queries_run = sum(r[0] for r in results)
    return {
        "qps": queries_run / max(r[1] for r in results),
        "cpu_ms_per_query": 1e3 * sum(r[2] for r in results) / queries_run,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=Path("/tmp/sfbench-search"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--kinds", default="vector,bm25,filtered,hybrid", help="which of the cases to run")
    p.add_argument("--out", default="core_scaling", help="results file name under bench/results (no .json)")
    p.add_argument(
        "--serial", action="store_true", help="also 1 and 2 client threads whose searches do not spread (see above)"
    )
    args = p.parse_args()
    if not build_info(args.cache):
        raise SystemExit(f"{args.cache}: no search_bench.py build there (run it with --cache {args.cache} first)")
    ways = {"1 thread": (1, 1, False), "2 threads": (1, 2, False), "2 processes": (2, 1, False)}
    if args.serial:
        ways |= {"1 thread, serial": (1, 1, True), "2 threads, serial": (1, 2, True)}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    cases = [c for c in CASES if c[1] in args.kinds.split(",")]
    for _ in range(args.repeat):
        for case in cases:
            level = case[2].get("level")
            name = f"{case[1]} {case[0]}" + ("" if level is None else f" {level:.1%}")
            for way, (procs, threads, serial) in ways.items():
                result = run(case, args.cache, procs, threads, serial, args.passes)
                runs.setdefault(name, {}).setdefault(way, []).append(result)
    summary = {
        name: {way: {key: median([r[key] for r in rs]) for key in KEYS} for way, rs in by_way.items()}
        for name, by_way in runs.items()
    }
    for name, by_way in summary.items():  # each way against 1 thread of its own kind (spreading or serial)
        one = {w: by_way["1 thread, serial" if w.endswith("serial") else "1 thread"]["qps"] for w in by_way}
        cells = [
            f"{w}: {v['qps']:.0f} q/s ({v['qps'] / one[w]:.2f}x), {v['cpu_ms_per_query']:.2f} CPU ms"
            for w, v in by_way.items()
        ]
        print(f"{name}: " + "; ".join(cells), flush=True)
    save(
        args.out,
        {"cache": str(args.cache), "repeat": args.repeat, "passes": args.passes, "runs": runs, "medians": summary},
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
