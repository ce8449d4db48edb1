"""Commit and open cost against the length of the history: a 1-row append, and a fresh process opening the
table and counting rows, at about 100 versions and at ``--versions`` (default 20,000), same table, same run.

    .venv/bin/python bench/history_bench.py --versions 20000

Before the history left the manifest list, a 1-row append took 23.5 ms at 100-200 versions and 54 ms at
3,000, and a fresh open 3 ms and 205 ms. Each measurement starts from a compacted table (``optimize``), so
both points have the same superfiles and only the history differs: an open also reads every manifest part,
so it grows with the number of small superfiles until compaction merges them. Prints and saves medians to
bench/results/history.json.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, save

_OPEN = """
import sys, time
t0 = time.perf_counter()
import superfile
t1 = time.perf_counter()
n = superfile.connect(sys.argv[1]).open_table("t").count_rows()
print(time.perf_counter() - t1)
"""


def measure(uri: str, samples: int) -> dict[str, float]:
    """Median 1-row append (ms) and median fresh-process open + count (ms, the import excluded)."""
    import superfile

    t = superfile.connect(uri).open_table("t")
    t.optimize()
    appends = []
    for i in range(samples):
        t0 = time.perf_counter()
        t.append({"id": [i], "text": ["one more row"]})
        appends.append((time.perf_counter() - t0) * 1000)
    opens = []
    for _ in range(max(5, samples // 10)):
        out = subprocess.run([sys.executable, "-c", _OPEN, uri], capture_output=True, text=True, check=True)
        opens.append(float(out.stdout.strip()) * 1000)
    superfiles = t.stats()["superfile_count"]
    return {"version": t.version, "superfiles": superfiles, "append_ms": median(appends), "open_ms": median(opens)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", type=int, default=20_000)
    p.add_argument("--samples", type=int, default=50)
    args = p.parse_args()
    import pyarrow as pa
    import superfile

    root = tempfile.mkdtemp(prefix="history-bench-")
    uri = f"file://{root}"
    try:
        t = superfile.connect(uri).create_table(
            "t", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
        )
        for i in range(100 - t.version):
            t.append({"id": [i], "text": ["a row"]})
        short = measure(uri, args.samples)
        t = superfile.connect(uri).open_table("t")
        started = time.perf_counter()
        while t.version < args.versions:
            t.append({"id": [t.version], "text": ["a row"]})
        fill_s = time.perf_counter() - started
        long = measure(uri, args.samples)
        result = {
            "short": short,
            "long": long,
            "append_ratio": long["append_ms"] / short["append_ms"],
            "open_ratio": long["open_ms"] / short["open_ms"],
            "fill_seconds": fill_s,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name in ("short", "long"):
        r = result[name]
        v, a, o = r["version"], r["append_ms"], r["open_ms"]
        print(f"at version {v:>6}: 1-row append {a:.2f} ms, fresh open+count {o:.2f} ms")
    print(f"ratios long/short: append {result['append_ratio']:.2f}x, open {result['open_ratio']:.2f}x")
    print(f"saved {save('history', result)}")


if __name__ == "__main__":
    main()
