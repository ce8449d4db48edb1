"""Where a query's time goes (issue 20 item 4): a py-spy profile of each query kind over the search
benchmark's table, as a flame graph and a list of the frames with the most self time.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/profile_search.py

For each kind, py-spy starts a child process (``py-spy record --native -- python ...``) that opens the table
``bench/search_bench.py`` built (default /tmp/sfbench-search: 1M rows in 16 superfiles), runs every query once
(``warm_up``) and then loops over the 318 real queries from one client thread for ``--seconds``
(``measured_loop``). It does so twice: into ``docs/profiles/<kind>.svg`` (``--format flamegraph``), then as
collapsed stacks, from which ``docs/profiles/README.md`` lists the frames with the most self time (the
innermost frame of each sample: where the CPU was) and the share of samples in native code, leaving out the
samples of the open, the imports and the warm-up (with the superfile opens and segment merges it sets off), and
counting apart the samples of threads that wait; ``--native`` shows the time inside tantivy, usearch, numpy and
Arrow under their own frames. py-spy cannot attach (``--pid``) to a process whose BLAS threads are busy on this
machine, hence the start from py-spy.

Kinds: ``bm25`` (top 10), ``vector`` (top 10, default knobs), ``filtered`` (vector, ``where doc_id % 1000
< 100``: 10% of the rows), ``hybrid`` (BM25 + vector, RRF) and ``sql_count`` (``SELECT count(*) ... WHERE
doc_id % 1000 < c``, c varying with the query).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT
from search_bench import K, Superfile, queries, query_vectors

KINDS = ("bm25", "vector", "filtered", "hybrid", "sql_count")
PROFILES = ROOT / "docs" / "profiles"
PY_SPY = Path(sys.executable).parent / "py-spy"
TOP = 12
# frames of the table's open, the imports and the warm-up pass: left out of the self-time list; so are what the
# warm-up sets off on other threads: the superfiles' opens (checksums, on the query pool; the table's 16 stay
# open after) and the segment merges it waits for (``Superfile.settle``, on the merge thread)
SETUP_FRAMES = (
    "warm_up (",
    "query_fn (",
    "_find_and_load",
    "TableFiles.open (",
    "_work (superfile/format/fulltext_merge.py",
)
# innermost frames of a thread that waits (py-spy's idle filter misses them with --native): counted apart
WAIT_FRAMES = ("acquire_lock", "cond_wait", "cond_timedwait", "sem_wait", "sem_timedwait", "futex", "epoll_wait")


def query_fn(kind: str, cache: Path) -> tuple[Callable[[int], Any], int]:
    """The kind's query i on the cached table (i indexes the real queries), and how many queries there are."""
    import superfile

    db = superfile.connect(f"file://{cache / 'superfile'}")
    t = db.open_table("bench")
    q = queries()
    texts, vectors = q["text"].to_pylist(), query_vectors(q)
    proj = ["_id", "score"]
    fns: dict[str, Callable[[int], Any]] = {
        "bm25": lambda i: t.bm25_search("text", texts[i], k=K, projection=proj),
        "vector": lambda i: t.vector_search("embedding", vectors[i], k=K, projection=proj),
        "filtered": lambda i: t.vector_search(
            "embedding", vectors[i], k=K, where="doc_id % 1000 < 100", projection=proj
        ),
        "hybrid": lambda i: t.hybrid_search("text", texts[i], "embedding", vectors[i], k=K, projection=proj),
        "sql_count": lambda i: db.sql(f"SELECT count(*) AS n FROM bench WHERE doc_id % 1000 < {1 + i * 997 % 999}"),
    }
    return fns[kind], q.num_rows


def warm_up(fn: Callable[[int], Any], n: int) -> None:
    """Every query once, then once more after the background work they set off (``Superfile.settle``)."""
    for i in range(n):
        fn(i)
    if Superfile.settle():
        for i in range(n):
            fn(i)


def measured_loop(fn: Callable[[int], Any], n: int, seconds: float) -> tuple[int, float]:
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(done % n)
        done += 1
    return done, time.perf_counter() - t0


def child(kind: str, cache: Path, seconds: float) -> None:
    """Open, warm up, then loop; the phases have frames of their own so the profiles can tell them apart."""
    fn, n = query_fn(kind, cache)
    warm_up(fn, n)
    done, elapsed = measured_loop(fn, n, seconds)
    print(f"{done} queries in {elapsed:.1f} s ({elapsed / done * 1e3:.2f} ms each)", flush=True)
    os._exit(0)  # no interpreter teardown (seconds of garbage collection) in the recording


def py_spy(kind: str, cache: Path, seconds: float, fmt: str, out: Path, rate: int) -> str:
    """py-spy over a child that runs ``kind``; returns the child's last line (how many queries it ran)."""
    cmd = [str(PY_SPY), "record", "--rate", str(rate), "--native", "--format", fmt, "-o", str(out), "--"]
    child_cmd = [sys.executable, __file__, "--child", kind, "--cache", str(cache), "--seconds", str(seconds)]
    run = subprocess.run([*cmd, *child_cmd], capture_output=True, text=True, timeout=seconds + 600, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"py-spy over {kind} failed:\n{run.stderr[-3000:]}")
    return next(line for line in run.stdout.splitlines() if " queries in " in line)


def rust_name(frame: str) -> str:
    """A Rust v0-mangled frame (tantivy's) as its path of identifiers, generic arguments flattened in:
    ``_RNvMs0_NtNtNtCs..._7tantivy5query...`` -> ``tantivy::query::...``; other frames unchanged."""
    name, sep, lib = frame.partition(" (")
    if not name.startswith("_R"):
        return frame
    s = re.sub(r"\.llvm\.\d+$", "", name)
    s = re.sub(r"Cs[0-9A-Za-z]+_", "C", s)  # crate disambiguators
    s = re.sub(r"(?<=[MXY])s[0-9A-Za-z]*_", "", s)  # impl disambiguators
    s = re.sub(r"B[0-9A-Za-z]*_", "", s)  # back-references
    parts, i = [], 0
    while i < len(s):
        m = re.match(r"\d+", s[i:])
        if not m:
            i += 1
            continue
        j = i + len(m.group())
        ident = s[j : j + int(m.group())]
        if re.fullmatch(r"_?[A-Za-z][A-Za-z0-9_]*", ident):
            parts.append(ident.removeprefix("_"))
            i = j + len(ident)
        else:
            i = j
    return "::".join(parts) + sep + lib


def self_time(collapsed: Path) -> tuple[int, Counter[str], int, int]:
    """Samples of the query loop (setup left out) with a running thread, samples per innermost frame, how many
    of them are native (no Python file in the innermost frame), and how many samples were of waiting threads."""
    total, leaves, native, waiting = 0, Counter[str](), 0, 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or any(f in stack for f in SETUP_FRAMES):
            continue
        c = int(count)
        frames = stack.split(";")
        leaf = rust_name(frames[-1])
        if leaf.startswith("0x"):  # an unnamed address (libc's are not symbolised): name its caller instead
            named = [f for f in frames if not f.startswith("0x")]
            leaf = f"{leaf.split(' ', 1)[1]} called from {rust_name(named[-1]) if named else '?'}"
        if any(w in leaf for w in WAIT_FRAMES):
            waiting += c
            continue
        total += c
        leaves[leaf] += c
        if ".py:" not in leaf:
            native += c
    return total, leaves, native, waiting


def profile(kind: str, cache: Path, seconds: float, rate: int) -> dict[str, Any]:
    """One kind, twice: a flame graph, then collapsed stacks for the self-time list."""
    py_spy(kind, cache, seconds, "flamegraph", PROFILES / f"{kind}.svg", rate)
    raw = PROFILES / f".{kind}.collapsed"
    summary = py_spy(kind, cache, seconds, "raw", raw, rate)
    total, leaves, native, waiting = self_time(raw)
    raw.unlink()
    return {
        "kind": kind,
        "summary": summary,
        "total": total,
        "leaves": leaves.most_common(TOP),
        "native": native,
        "waiting": waiting,
    }


def readme(results: list[dict[str, Any]], command: str, seconds: float, rate: int) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    lines = [
        "# Where a query's time goes (issue 20)",
        "",
        f"`{command}` at commit {commit.stdout.strip()} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average {load} at the end, on the shared 2-core machine). Table: the search benchmark's 1M rows in "
        f"16 superfiles. One client thread loops over the 318 real queries for {seconds:.0f} s after a warm-up "
        f"pass, under py-spy (`--native --rate {rate}`). The SVGs are flame graphs (open one "
        "in a browser, click a frame to zoom; the query loop is under `measured_loop`, the table's open and the "
        "warm-up beside it). Below, per kind: the frames with the most self time (the innermost frame of each "
        "sample, where the CPU was) as a share of the query loop's samples of running threads, every thread's "
        "included. With `--native` py-spy also samples threads that wait (on a lock, a condition): those samples "
        "are counted apart, and they are in the flame graphs.",
        "",
        '`bench/profile_search.py` writes this file; BENCHMARKS.md, "Per-query cost (issue 20)", says what the '
        "profiles show.",
    ]
    for r in results:
        lines += [
            "",
            f"## {r['kind']} ([flame graph]({r['kind']}.svg))",
            "",
            f"{r['summary']} under the profiler. {r['total']} samples of running threads, "
            f"{r['native'] / max(1, r['total']):.0%} of them in native code; {r['waiting']} more of threads "
            "waiting on a lock or condition (left out below).",
            "",
            "| self time | frame |",
            "|---|---|",
            *[f"| {c / max(1, r['total']):.1%} | `{frame}` |" for frame, c in r["leaves"]],
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seconds", type=float, default=15, help="query loop per recording (each kind is run twice)")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    cache = Path(args.cache)
    if args.child:
        child(args.child, cache, args.seconds)
        return
    if not (cache / "superfile").exists():
        p.error(f"no table in {cache}: build it with bench/search_bench.py --build-only")
    PROFILES.mkdir(parents=True, exist_ok=True)
    command = " ".join([".venv/bin/python", "bench/profile_search.py", *sys.argv[1:]])
    results = []
    for kind in [k for k in KINDS if k in args.kinds.split(",")]:
        r = profile(kind, cache, args.seconds, args.rate)
        print(f"{kind}: {r['summary']}; top self time: {r['leaves'][:3]}", flush=True)
        results.append(r)
    (PROFILES / "README.md").write_text(readme(results, command, args.seconds, args.rate))


if __name__ == "__main__":
    main()
