"""Commit and open cost against the length of the history: a 1-row append, and a fresh process opening the
table and counting rows, on a table of 100 versions and one of ``--versions`` (default 20,000), same run.

    .venv/bin/python bench/history_bench.py --versions 20000

Before the history left the manifest list, a 1-row append took 23.5 ms at 100-200 versions and 54 ms at
3,000, and a fresh open 3 ms and 205 ms. The two tables are measured in alternation (one sample of each in
turn), so the machine's noise falls on both alike. Both are compacted (``optimize``) before they are measured,
and the long one every 1,000 versions while it is filled, as automatic maintenance would: an open reads every
manifest part, so it also grows with the number of small superfiles, which is compaction's business, not the
history's. Prints and saves medians to bench/results/history.json.
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
import superfile
t0 = time.perf_counter()
superfile.connect(sys.argv[1]).open_table("t").count_rows()
print(time.perf_counter() - t0)
"""


def fill(uri: str, versions: int) -> float:
    """A table ``t`` of ``versions`` versions made by 1-row appends; seconds it took."""
    import pyarrow as pa
    import superfile

    t = superfile.connect(uri).create_table(
        "t", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
    )
    started = time.perf_counter()
    while t.version < versions:
        t.append({"id": [t.version], "text": ["a row"]})
        if t.version % 1_000 == 0:
            t.optimize()
    t.optimize()
    return time.perf_counter() - started


def open_ms(uri: str) -> float:
    out = subprocess.run([sys.executable, "-c", _OPEN, uri], capture_output=True, text=True, check=True)
    return float(out.stdout.strip()) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", type=int, default=20_000)
    p.add_argument("--samples", type=int, default=50)
    args = p.parse_args()
    import superfile

    roots = {"short": tempfile.mkdtemp(prefix="history-short-"), "long": tempfile.mkdtemp(prefix="history-long-")}
    uris = {name: f"file://{root}" for name, root in roots.items()}
    try:
        fill_s = {"short": fill(uris["short"], 100), "long": fill(uris["long"], args.versions)}
        tables = {name: superfile.connect(uri).open_table("t") for name, uri in uris.items()}
        appends: dict[str, list[float]] = {"short": [], "long": []}
        opens: dict[str, list[float]] = {"short": [], "long": []}
        for i in range(args.samples):
            for name, t in tables.items():
                t0 = time.perf_counter()
                t.append({"id": [-i], "text": ["one more row"]})
                appends[name].append((time.perf_counter() - t0) * 1000)
            if i % 2 == 0:
                for name, uri in uris.items():
                    opens[name].append(open_ms(uri))
        result = {
            name: {
                "version": tables[name].version,
                "superfiles": tables[name].stats()["superfile_count"],
                "append_ms": median(appends[name]),
                "open_ms": median(opens[name]),
                "fill_seconds": fill_s[name],
            }
            for name in tables
        }
        result["append_ratio"] = result["long"]["append_ms"] / result["short"]["append_ms"]
        result["open_ratio"] = result["long"]["open_ms"] / result["short"]["open_ms"]
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    for name in ("short", "long"):
        r = result[name]
        v, a, o = r["version"], r["append_ms"], r["open_ms"]
        print(f"at version {v:>6}: 1-row append {a:.2f} ms, fresh open+count {o:.2f} ms")
    print(f"ratios long/short: append {result['append_ratio']:.2f}x, open {result['open_ratio']:.2f}x")
    print(f"saved {save('history', result)}")


if __name__ == "__main__":
    main()
