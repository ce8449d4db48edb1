"""What one large commit leaves in a committing process's memory, under glibc allocator settings.

    .venv/bin/python bench/commit_memory.py --rounds 2

The builder commits about 2,000 rows a second; after a compaction wait its next commit takes the backlog
(~10,000 rows) at once. Each configuration runs in its own process, the configurations interleaved round
by round: ``--small`` commits of 2,000 rows (the soak's rows: text with a full-text index, 384-d vectors),
one of ``--big`` rows, then ``--small`` of 2,000 again, each on a thread of its own as the builder's
publisher does and each followed by ``release_unused`` (as the builder does every 10 s). Reported: the
process's anonymous memory (median over the commits of each phase) and the commits' p50. Results:
``bench/results/commit_memory.json``; ``docs/builder.md``, "Memory".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, run_isolated, save

# name -> (call bound_arenas at start, GLIBC_TUNABLES)
CONFIGS: dict[str, tuple[bool, str]] = {
    "glibc defaults (dynamic threshold, 8 arenas a core)": (False, ""),
    "bound_arenas (the builder): 2 arenas, blocks < 32 MiB from them, tops back past 8 MiB": (True, ""),
    "2 arenas, dynamic threshold": (False, "glibc.malloc.arena_max=2"),
    "8 arenas a core, blocks < 32 MiB from them, tops back past 4 MiB": (
        False,
        "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4194304",
    ),
}


def child(bounded: bool, small: int, big: int) -> None:
    """One configuration's run; prints one JSON line."""
    from superfile.allocator import bound_arenas, release_unused

    if bounded:
        assert bound_arenas()
    import superfile
    from soak import Rows, _memory

    rows = Rows()
    table = superfile.connect(f"file://{tempfile.mkdtemp(prefix='commit-memory-')}").create_table(
        "t", rows.batch(1).schema, fts_columns=["text"], vector_columns={"embedding": {"dim": 384}}
    )
    publisher = ThreadPoolExecutor(1)
    out: dict[str, dict[str, float]] = {}
    for phase, n, count in (("before", 2000, small), ("big", big, 1), ("after", 2000, small)):
        anon, took = [], []
        for _ in range(count):
            batch = rows.batch(n)
            start = time.perf_counter()
            publisher.submit(table.append, batch).result()
            took.append(time.perf_counter() - start)
            release_unused()
            memory = _memory(os.getpid())
            assert memory is not None
            anon.append(memory[1])
        out[phase] = {"anon_mb": median(anon), "commit_ms": 1000 * median(took)}
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--small", type=int, default=30, help="2,000-row commits before and after the big one")
    p.add_argument("--big", type=int, default=10_000, help="rows of the big commit")
    p.add_argument("--child", nargs=3, metavar=("BOUNDED", "SMALL", "BIG"))
    args = p.parse_args()
    if args.child:
        child(args.child[0] == "1", int(args.child[1]), int(args.child[2]))
        return
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, (bounded, tunables) in CONFIGS.items():
            env = {"GLIBC_TUNABLES": tunables} if tunables else {}
            flag = "1" if bounded else "0"
            runs[name].append(run_isolated(Path(__file__), "--child", flag, str(args.small), str(args.big), env=env))
    print("| settings | anonymous MB before the big commit | after it | commit ms p50 before / after |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():

        def span(phase: str, key: str, results: list[dict[str, dict[str, float]]] = results) -> str:
            values = sorted(r[phase][key] for r in results)
            return f"{values[0]:.0f}-{values[-1]:.0f}" if len(values) > 1 else f"{values[0]:.0f}"

        print(
            f"| {name} | {span('before', 'anon_mb')} | {span('after', 'anon_mb')} | "
            f"{span('before', 'commit_ms')} / {span('after', 'commit_ms')} |"
        )
    save("commit_memory", {"command": " ".join(sys.argv), "big": args.big, "small": args.small, "runs": runs})


if __name__ == "__main__":
    main()
