"""Where a search lets the interpreter lock go: each release, by the Python line that made it, per query.

    .venv/bin/python bench/lock_releases.py --cache /tmp/sfbench-250k-chain --kind bm25

With a second query thread waiting for the lock, every release hands it over and waits to get it back: two
context switches, tens of microseconds of CPU on these VMs (``docs/search.md``, "Short lock releases cost
most"). This runs ``--queries`` searches of one kind over a ``search_bench.py`` cache under gdb, with a
breakpoint on ``PyEval_SaveThread`` that prints the running Python frame's file and line, after a warm-up
outside the count. It needs gdb and a libpython with symbols (pyenv's builds have them).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("bm25", "vector", "filtered", "hybrid")

_GDB = """set pagination off
set confirm off
handle SIGTRAP stop nopass
run
break PyEval_SaveThread
commands
silent
set $ts = (PyThreadState*)PyGILState_GetThisThreadState()
set $fr = $ts->cframe->current_frame
set $co = $fr->f_code
printf "RELEASE %s:%d\\n", (char*)PyUnicode_AsUTF8($co->co_filename), \
(int)PyCode_Addr2Line($co, (int)((char*)$fr->prev_instr - (char*)$co->co_code_adaptive))
continue
end
continue
"""

# The child: warm the kind up (unions merged), stop itself so gdb arms the breakpoint, then run the counted queries.
_CHILD = """
import os, sys
sys.path.insert(0, {bench!r})
from pathlib import Path
import search_bench as sb
import superfile
from superfile.format import fulltext_union
kind, n = {kind!r}, {queries}
table = superfile.connect("file://" + str(sb.paths(Path({cache!r}))["superfile"])).open_table("bench")
q = sb.queries()
texts, vectors = q.column("text").to_pylist(), sb.query_vectors(q)
kept = ["_id", "score"]
def one(i):
    i %= len(texts)
    if kind == "bm25":
        return table.bm25_search("text", texts[i], k=10, projection=kept)
    if kind == "vector":
        return table.vector_search("embedding", vectors[i], k=10, projection=kept)
    if kind == "hybrid":
        return table.hybrid_search("text", texts[i], "embedding", vectors[i], k=10, projection=kept)
    return table.vector_search("embedding", vectors[i], k=10, where=sb.where_clause({level}), projection=kept)
for i in range(len(texts)):
    one(i)
fulltext_union.merges_done(120)
for i in range(len(texts)):
    one(i)
os.kill(os.getpid(), 5)  # SIGTRAP: gdb sets its breakpoint here
for i in range(n):
    one(i)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, required=True, help="a search_bench.py cache (its table is searched)")
    p.add_argument("--kind", choices=KINDS, default="bm25")
    p.add_argument("--level", type=float, default=0.001, help="filtered: the share of rows allowed")
    p.add_argument("--queries", type=int, default=20)
    args = p.parse_args()
    bench = str(Path(__file__).resolve().parent)
    child = _CHILD.format(bench=bench, kind=args.kind, queries=args.queries, cache=str(args.cache), level=args.level)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "commands").write_text(_GDB)
        (Path(tmp) / "child.py").write_text(child)
        run = subprocess.run(
            [
                "gdb",
                "-q",
                "-batch",
                "-x",
                str(Path(tmp) / "commands"),
                "--args",
                sys.executable,
                str(Path(tmp) / "child.py"),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    lines = re.findall(r"^RELEASE (.+)$", run.stdout, re.MULTILINE)
    if not lines:
        sys.exit(f"gdb found no releases; its output ends:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    counts = collections.Counter(lines)
    print(f"{args.kind}: {len(lines) / args.queries:.1f} releases of the interpreter lock a query, over {args.queries}")
    for where, n in counts.most_common():
        print(f"{n / args.queries:6.2f}  {where}")


if __name__ == "__main__":
    main()
