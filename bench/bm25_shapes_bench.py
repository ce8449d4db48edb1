"""BM25 by query shape beside one tantivy index: one-term and two-term queries over short rows of one length.

    .venv/bin/python bench/bm25_shapes_bench.py [--rows 250000] [--max-rows-per-superfile 15625] \
        [--repeat 3] [--before-path /tmp/wt-base/libs/superfile]

Rows are log lines of three words (a level out of 6, a component out of 50, a status out of 10; seed 0), so
every row has the same analysed length, as short fields (levels, tags, titles) do, and every query ties
thousands of rows. Queries: each of the 66 words alone, and 100 level-component pairs. Systems, each in its own
process, over the same rows: superfile (a ``file://`` table of ``--max-rows-per-superfile`` superfiles,
searched once its full-text segments are merged), superfile-before (the same table searched by the library at
``--before-path``, when given) and tantivy (one index of the same rows and analyser, queried with the term
query alone for one term, else a boolean of the terms, as ``parse_query`` would). Per shape: p50 latency of a
top-10 (``_id`` and score) over 5 passes from one thread, medians of ``--repeat`` runs. Results:
``bench/results/<--out>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, run_isolated, save

LEVELS = ["error", "warning", "info", "debug", "trace", "fatal"]
COMPONENTS = [f"service{c}" for c in range(50)]
STATUSES = [f"code{s}" for s in range(10)]
PASSES = 5
K = 10


def rows(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    picks = zip(rng.integers(0, 6, n), rng.integers(0, 50, n), rng.integers(0, 10, n), strict=True)
    return [f"{LEVELS[a]} {COMPONENTS[b]} {STATUSES[c]}" for a, b, c in picks]


def queries() -> dict[str, list[str]]:
    rng = np.random.default_rng(1)
    pairs = [
        f"{LEVELS[a]} {COMPONENTS[b]}" for a, b in zip(rng.integers(0, 6, 100), rng.integers(0, 50, 100), strict=True)
    ]
    return {"one term": LEVELS + COMPONENTS + STATUSES, "two terms": pairs}


def build(cache: Path, n: int, per_superfile: int) -> None:
    """The table and the tantivy index, once per cache directory."""
    import superfile
    import tantivy
    from superfile.format.fulltext import make_analyzer

    if (cache / "done").exists():
        return
    texts = rows(n)
    db = superfile.connect(f"file://{cache / 'superfile'}")
    db.create_table("logs", data=pa.table({"text": texts}), fts_columns=["text"], max_rows_per_superfile=per_superfile)
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("text", tokenizer_name="en")
    sb.add_unsigned_field("doc_id", fast=True)
    (cache / "tantivy").mkdir()
    index = tantivy.Index(sb.build(), path=str(cache / "tantivy"))
    index.register_tokenizer("en", make_analyzer("english"))
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for i, text in enumerate(texts):
        writer.add_json(json.dumps({"text": text, "doc_id": i}))
    writer.commit()
    writer.wait_merging_threads()
    (cache / "done").touch()


def _timed(search: Any, asked: list[str]) -> float:
    for q in asked:  # warm
        search(q)
    passes = []
    for _ in range(PASSES):
        lat = []
        for q in asked:
            t0 = time.perf_counter()
            search(q)
            lat.append(time.perf_counter() - t0)
        passes.append(float(np.median(lat)))
    return median(passes) * 1e3


def measure(system: str, cache: Path) -> dict[str, float]:
    """p50 ms of each query shape, in this process."""
    if system == "tantivy":
        import tantivy
        from superfile.format.fulltext import make_analyzer

        index = tantivy.Index.open(str(cache / "tantivy"))
        index.register_tokenizer("en", make_analyzer("english"))
        searcher, schema, analyzer = index.searcher(), index.schema, make_analyzer("english")

        def search(q: str) -> Any:
            terms = [tantivy.Query.term_query(schema, "text", t) for t in dict.fromkeys(analyzer.analyze(q))]
            query = (
                terms[0] if len(terms) == 1 else tantivy.Query.boolean_query([(tantivy.Occur.Should, t) for t in terms])
            )
            hits = searcher.search(query, K, count=False).hits
            return [h[0] for h in hits], searcher.fast_field_values("doc_id", [h[1] for h in hits])

    else:
        import superfile
        from superfile.format import fulltext_union

        table = superfile.connect(f"file://{cache / 'superfile'}").open_table("logs")
        table.bm25_search("text", "error", k=K)  # builds the union, which schedules the merge
        fulltext_union.merges_done(300)

        def search(q: str) -> Any:
            return table.bm25_search("text", q, k=K, projection=["_id", "score"])

    return {shape: _timed(search, asked) for shape, asked in queries().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--max-rows-per-superfile", type=int, default=15_625)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before-path", default=None)
    ap.add_argument("--out", default="bm25_shapes")
    ap.add_argument("--child", nargs=2, metavar=("SYSTEM", "CACHE"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[1]))))
        return
    cache = args.cache or Path(f"/tmp/sfbench-shapes-{args.rows}-{args.max_rows_per_superfile}")
    cache.mkdir(parents=True, exist_ok=True)
    build(cache, args.rows, args.max_rows_per_superfile)
    systems = ["superfile", "tantivy"] + (["superfile-before"] if args.before_path else [])
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for _ in range(args.repeat):
        for system in systems:
            env = {"PYTHONPATH": args.before_path} if system == "superfile-before" else None
            runs[system].append(run_isolated(Path(__file__), "--child", system.split("-")[0], str(cache), env=env))
    shapes = list(queries())
    p50 = {s: {shape: median([r[shape] for r in runs[s]]) for shape in shapes} for s in systems}
    result = {
        "rows": args.rows,
        "max_rows_per_superfile": args.max_rows_per_superfile,
        "repeat": args.repeat,
        "p50_ms": p50,
        "vs_tantivy": {s: {shape: p50[s][shape] / p50["tantivy"][shape] for shape in shapes} for s in systems},
        "runs": runs,
    }
    print(json.dumps({k: result[k] for k in ("p50_ms", "vs_tantivy")}, indent=2))
    print("saved", save(args.out, result))


if __name__ == "__main__":
    main()
