"""What a serving process keeps of its reads while it follows a table that commits: Arrow's pool compared.

    .venv/bin/python bench/reader_memory.py --rounds 2
    .venv/bin/python bench/reader_memory.py --rounds 1 --appends 120 --optimize-every 6   # bounded table

A writer process appends ``--appends`` batches of ``--rows`` (the soak's rows: text with a full-text index,
384-d vectors), optimizing every ``--optimize-every`` appends when given (then the table's superfiles stay
few while versions and superfiles come and go). The reader, a process started as a gateway is
(``tune_for_serving``, its release every second here), follows it: at each new version 4 pool threads run 5
BM25, 5 vector and 5 count queries each, as a gateway's request threads do, then the release. Each Arrow pool
runs in its own process, the two interleaved round by round: ``jemalloc`` (what ``tune_for_serving`` sets)
and ``mimalloc`` (pyarrow's default, set back after it). Reported: the reader's anonymous memory at the
first version it read, at the last, and the most, with the table's superfiles. Results:
``bench/results/reader_memory.json``; ``docs/gateway.md``, "Memory".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_isolated, save

POOLS = ("jemalloc", "mimalloc")
_THREADS = 4


def writer(root: str, appends: int, rows: int, optimize_every: int) -> None:
    """Create the table (with one batch) when it is not there, else append ``appends`` batches."""
    import pyarrow.parquet as pq
    import superfile
    from soak import Rows

    made = Rows()
    db = superfile.connect(f"file://{root}")
    if appends == 0:
        first = made.batch(rows)
        db.create_table("t", first.schema, fts_columns=["text"], vector_columns={"embedding": {"dim": 384}})
        db.open_table("t").append(first)
        pq.write_table(first.slice(0, 20), os.path.join(root, "probe.parquet"))
        return
    table = db.open_table("t")
    made.made = rows  # fresh doc_ids after the first batch
    for i in range(appends):
        table.append(made.batch(rows))
        if optimize_every and (i + 1) % optimize_every == 0:
            table.optimize(target_rows=1_000_000)


def child(pool: str, appends: int, rows: int, optimize_every: int) -> None:
    """One pool's run: follow the writer's commits; prints one JSON line."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from superfile.allocator import release_unused, tune_for_serving

    tune_for_serving(release_every_s=1.0)
    if pool == "mimalloc":
        pa.set_memory_pool(pa.mimalloc_memory_pool())
    import superfile
    from soak import _memory

    root = tempfile.mkdtemp(prefix="reader-memory-")
    me = Path(__file__)
    subprocess.run([sys.executable, str(me), "--writer", root, "0", str(rows), "0"], check=True)
    probe = pq.read_table(os.path.join(root, "probe.parquet"))
    words = [str(t)[:60] for t in probe["text"].to_pylist()]
    vectors = [np.asarray(v, np.float32) for v in probe["embedding"].to_pylist()]
    table = superfile.connect(f"file://{root}").open_table("t")
    threads = ThreadPoolExecutor(_THREADS)

    def read(_: int) -> None:
        for i in range(5):
            table.bm25_search("text", words[i], k=10)
            table.vector_search("embedding", vectors[i], k=10)
            table.count_rows()

    seen: list[dict[str, float]] = []
    write = subprocess.Popen([sys.executable, str(me), "--writer", root, str(appends), str(rows), str(optimize_every)])
    last = 0
    while True:
        done = write.poll() is not None
        version = table.version
        if version != last:
            last = version
            list(threads.map(read, range(_THREADS)))
            release_unused()
            memory = _memory(os.getpid())
            assert memory is not None
            seen.append({"version": version, "anon_mb": memory[1], "superfiles": table.stats()["superfile_count"]})
        if done:
            break
        time.sleep(0.05)
    assert write.returncode == 0, write.returncode
    shutil.rmtree(root, ignore_errors=True)
    anon = [s["anon_mb"] for s in seen]
    superfiles = [s["superfiles"] for s in seen]
    print(
        json.dumps(
            {
                "versions_read": len(seen),
                "first_anon_mb": anon[0],
                "last_anon_mb": anon[-1],
                "max_anon_mb": max(anon),
                "superfiles": [min(superfiles), max(superfiles), superfiles[-1]],
                "series": seen,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--appends", type=int, default=40)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--optimize-every", type=int, default=0, help="optimize after every N appends (0: never)")
    p.add_argument("--name", default="reader_memory")
    p.add_argument("--child", nargs=4, metavar=("POOL", "APPENDS", "ROWS", "OPTIMIZE_EVERY"))
    p.add_argument("--writer", nargs=4, metavar=("ROOT", "APPENDS", "ROWS", "OPTIMIZE_EVERY"))
    args = p.parse_args()
    if args.writer:
        writer(args.writer[0], *map(int, args.writer[1:]))
        return
    if args.child:
        child(args.child[0], *map(int, args.child[1:]))
        return
    runs: dict[str, list[dict[str, object]]] = {pool: [] for pool in POOLS}
    for _ in range(args.rounds):
        for pool in POOLS:
            sizes = (str(args.appends), str(args.rows), str(args.optimize_every))
            runs[pool].append(run_isolated(Path(__file__), "--child", pool, *sizes))
    print("| Arrow pool | anonymous MB at the first version / the last / the most | superfiles (min-max, last) |")
    print("|---|---:|---:|")
    for pool, results in runs.items():
        for r in results:
            lo, hi, end = r["superfiles"]  # type: ignore[misc]
            print(
                f"| {pool} | {r['first_anon_mb']:.0f} / {r['last_anon_mb']:.0f} / {r['max_anon_mb']:.0f} "
                f"| {lo}-{hi}, {end} |"
            )
    save(args.name, {"command": " ".join(sys.argv), **vars(args), "runs": runs})


if __name__ == "__main__":
    main()
