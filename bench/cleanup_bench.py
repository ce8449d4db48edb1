"""What a cleanup costs when it keeps every version: superfile beside LanceDB, same rows, same run.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/cleanup_bench.py --versions 300

A streaming table cleans up every minute (the builder's ``--cleanup-interval-s``) with a retention of
minutes, so every run walks every retained version to learn which files they name, and most runs delete
little. Each system gets ``--versions`` appends of ``--rows`` real rows (Cranfield and Vaswani text with
their 384-d embeddings; superfile indexes both columns), then, in a fresh process per system, one cleanup
keeping everything (``older_than`` a day: the marking alone; the first in a process pays every read) and
``--repeats`` more in that process (median). LanceDB: Lance's ``cleanup_old_versions(older_than=1 day)`` (what
LanceDB's deprecated method of that name calls; needs ``pylance``, installed by ``make bench``).
Results: bench/results/cleanup.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, repeated, run_isolated, save

DAY = datetime.timedelta(days=1)


def fill(system: str, path: str, versions: int, rows: int) -> None:
    batches = repeated(versions * rows, rows)
    if system == "superfile":
        import superfile

        first = next(batches)
        t = superfile.connect(f"file://{path}").create_table(
            "t", first.schema, fts_columns=["text"], vector_columns={"embedding": 384}
        )
        t.append(first)
        for batch in batches:
            t.append(batch)
    else:
        import lancedb

        lt = lancedb.connect(path).create_table("t", next(batches))
        for batch in batches:
            lt.add(batch)


def measure(system: str, path: str, repeats: int) -> None:
    """In this fresh process: the first cleanup's seconds, then ``repeats`` more (one JSON line)."""
    if system == "superfile":
        import superfile

        t = superfile.connect(f"file://{path}").open_table("t")

        def clean() -> None:
            assert t.cleanup(DAY)["files_removed"] == 0
    else:
        import lancedb

        dataset = lancedb.connect(path).open_table("t").to_lance()  # LanceDB's cleanup is Lance's (pylance)

        def clean() -> None:
            assert dataset.cleanup_old_versions(older_than=DAY).old_versions == 0

    times = []
    for _ in range(1 + repeats):
        started = time.perf_counter()
        clean()
        times.append(time.perf_counter() - started)
    print(json.dumps({"first_ms": times[0] * 1000, "again_ms": [t * 1000 for t in times[1:]]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", type=int, default=300)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per system, alternating")
    p.add_argument("--child", nargs=2, metavar=("SYSTEM", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        measure(*args.child, args.repeats)
        return
    work = Path(tempfile.mkdtemp(prefix="cleanup-bench-"))
    systems = ("superfile", "lancedb")
    try:
        for system in systems:
            started = time.perf_counter()
            fill(system, str(work / system), args.versions, args.rows)
            print(f"{system}: {args.versions} appends in {time.perf_counter() - started:.1f} s", flush=True)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
        for _ in range(args.rounds):
            for system in systems:
                runs[system].append(
                    run_isolated(Path(__file__), "--child", system, str(work / system), "--repeats", str(args.repeats))
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, object] = {"versions": args.versions, "rows_per_append": args.rows}
    for system in systems:
        result[system] = {
            "first_ms_median": median([r["first_ms"] for r in runs[system]]),
            "again_ms_median": median([t for r in runs[system] for t in r["again_ms"]]),
        }
    for key in ("first_ms_median", "again_ms_median"):
        result[f"{key}_ratio"] = result["superfile"][key] / result["lancedb"][key]  # type: ignore[index]
    print(json.dumps(result, indent=2))
    save("cleanup", result)


if __name__ == "__main__":
    main()
