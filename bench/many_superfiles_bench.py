"""A table of many superfiles (issue 18, item 5): open + count, BM25, vector, SQL and optimize at ``--files``
(default 10,000) level-0 superfiles, with the peak RSS and the open descriptors and mappings of the process.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/many_superfiles_bench.py --files 10000

One append of ``2 x files`` rows with ``max_rows_per_superfile=2`` and ``level0_max_rows`` above it commits
``files`` level-0 superfiles (no full-text or vector index: searched exactly) in one version. Each repeat runs
in a fresh process (so peak memory and handles are its own): open the table and count its rows, a filtered
count, then BM25, vector and SQL queries, the first of each cold (readers opened, columns analysed) and the
next warm; then ``optimize`` compacts the 10,000 superfiles into one and ``restore`` brings them back for the
next repeat. The open budgets are the defaults unless ``SUPERFILE_OPEN_BYTES`` / ``SUPERFILE_OPEN_FILES``
are set (docs/storage.md, "Open superfiles"). Prints and saves medians to bench/results/many_superfiles.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, run_isolated, save

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
DIM = 8
WARM = 5  # warm queries of each kind per repeat


def build(uri: str, files: int) -> tuple[int, float]:
    """Table ``t`` of ``files`` level-0 superfiles of 2 rows; its version and the seconds the append took."""
    import numpy as np
    import pyarrow as pa
    import superfile

    rows = 2 * files
    rng = np.random.default_rng(18)
    vec = rng.standard_normal((rows, DIM)).astype(np.float32)
    data = pa.table(
        {
            "n": pa.array(np.arange(rows), pa.int64()),
            "cat": pa.array([f"c{i % 7}" for i in range(rows)]),
            "text": [" ".join(rng.choice(WORDS, int(rng.integers(1, 8)))) for _ in range(rows)],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), DIM),
        }
    )
    t = superfile.connect(uri).create_table(
        "t",
        data.schema,
        fts_columns=["text"],
        vector_columns={"vec": {"dim": DIM, "metric": "l2"}},
        max_rows_per_superfile=2,
        level0_max_rows=rows,
    )
    t0 = time.perf_counter()
    t.append(data)
    return t.version, time.perf_counter() - t0


def _handles() -> tuple[int, int]:
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return len(os.listdir("/proc/self/fd")), maps


def worker(uri: str, files: int) -> None:
    """One repeat in this fresh process; prints one JSON line of seconds, peaks and counts."""
    import resource

    import superfile
    from superfile.table.snapshot import open_readers

    out: dict[str, object] = {}
    fds, maps = _handles()
    peak = [fds, maps]

    def step(name: str, fn: object) -> object:
        t0 = time.perf_counter()
        result = fn()  # type: ignore[operator]
        out[name] = time.perf_counter() - t0
        now = _handles()
        peak[0], peak[1] = max(peak[0], now[0]), max(peak[1], now[1])
        return result

    db = superfile.connect(uri)
    t = step("open_count_s", lambda: db.open_table("t").count_rows())
    table = db.open_table("t")
    assert table.stats()["superfile_count"] == files, table.stats()["superfile_count"]
    step("count_where_s", lambda: table.count_rows("n % 5 = 0 AND cat = 'c3'"))
    step("bm25_cold_s", lambda: table.bm25_search("text", "alpha beta", k=10))
    warm = []
    for q in ["gamma delta", "zeta mu kappa", "alpha", "theta iota", "beta eta"][:WARM]:
        step("_", lambda q=q: table.bm25_search("text", q, k=10))
        warm.append(out.pop("_"))
    out["bm25_warm_s"] = median(warm)  # type: ignore[arg-type]
    step("vector_cold_s", lambda: table.vector_search("vec", [0.1] * DIM, k=10))
    warm = []
    for i in range(WARM):
        step("_", lambda i=i: table.vector_search("vec", [0.1 * i - 0.2] * DIM, k=10))
        warm.append(out.pop("_"))
    out["vector_warm_s"] = median(warm)  # type: ignore[arg-type]
    step("sql_count_s", lambda: db.sql("SELECT count(*) FROM t WHERE n % 7 = 0"))
    step("sql_group_s", lambda: db.sql("SELECT cat, count(*), sum(n) FROM t WHERE n % 3 = 1 GROUP BY cat"))
    step("optimize_s", lambda: table.optimize(target_rows=2 * files))
    assert table.stats()["superfile_count"] == 1 and table.count_rows() == t
    out["peak_fds"], out["peak_maps"] = peak
    out["start_fds"], out["start_maps"] = fds, maps
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["budget_bytes"], out["budget_files"] = open_readers().limits
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("URI", "FILES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    import superfile

    root = Path(tempfile.mkdtemp(prefix="many-superfiles-"))
    try:
        uri = f"file://{root}"
        wide, append_s = build(uri, args.files)
        runs = []
        for i in range(args.repeats):
            if i:
                superfile.connect(uri).open_table("t").restore(wide)  # the 10,000 superfiles again
            runs.append(run_isolated(Path(__file__), "--worker", uri, str(args.files)))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, object] = {"files": args.files, "rows": 2 * args.files, "append_s": append_s}
    result |= {k: median([float(r[k]) for r in runs]) for k in runs[0]}
    result["repeats"] = args.repeats
    path = save("many_superfiles", result)
    print(json.dumps(result, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
