"""Selective WHERE with and without row-level indexes, same rows, same run.

    .venv/bin/python bench/where_index_bench.py --rows 1000000 --repeat 15

Two tables over the same rows: ``indexed`` (``title`` full-text, ``label``
and ``batch`` with their default bitmap indexes) and ``plain`` (``title`` a
plain string column, every scalar index off). ``label`` spreads each value over
every row group; ``batch`` keeps each value in consecutive rows. Each query runs through SQL and through
``to_arrow(where=...)``; medians over ``--repeat`` runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import corpus, median, save


def rows(n: int) -> pa.Table:
    base = corpus()
    idx = pa.array(np.arange(n) % base.num_rows)
    titles = pc.utf8_slice_codeunits(base["text"].take(idx), 0, 60)
    # make titles unique so an equality matches one row, as a key lookup would
    titles = pc.binary_join_element_wise(titles, pa.array([f"#{i}" for i in range(n)]), " ")
    return pa.table(
        {
            "doc_id": pa.array(np.arange(n), pa.int64()),
            "label": pa.array([f"c{i % 1000}" for i in range(n)]),  # each value spread over every row group
            "batch": pa.array([f"b{i // 1000}" for i in range(n)]),  # each value in 1,000 consecutive rows
            "title": titles,
        }
    )


def timed(fn: object, repeat: int) -> float:
    assert callable(fn)
    fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return median(runs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    data = rows(args.rows)
    with tempfile.TemporaryDirectory(prefix="sfwhere-") as root:  # two tables of ~100 MB each: not kept
        measure(superfile.connect(f"file://{root}"), data, args.rows, args.repeat)


def measure(db: superfile.Connection, data: pa.Table, n: int, repeat: int) -> None:
    """Time the cases on an indexed and a plain table of ``data`` in ``db``; save the results."""
    indexed = db.create_table("indexed", data.schema, fts_columns=["title"], max_rows_per_superfile=62_500)
    plain = db.create_table(
        "plain",
        data.schema,
        scalar_indexes={"doc_id": "none", "label": "none", "batch": "none", "title": "none"},
        max_rows_per_superfile=62_500,
    )
    for t in (indexed, plain):
        t.append(data)
    title = data.column("title")[n // 2].as_py().replace("'", "''")
    batch = f"b{min(517, n // 1000 - 1)}"  # a batch every row count has (at 1M rows, as measured before)
    cases = {
        "bitmap column: label = 'c17' (0.1%)": "label = 'c17'",
        f"bitmap column, clustered: batch = '{batch}' (1,000 rows)": f"batch = '{batch}'",
        "full-text column: title = <one title>": f"title = '{title}'",
    }
    results: dict[str, dict[str, float]] = {}
    for name, where in cases.items():
        entry: dict[str, float] = {}
        for table in ("indexed", "plain"):
            t = indexed if table == "indexed" else plain
            n_api = t.to_arrow(columns=["doc_id"], where=where).num_rows
            n_sql = db.sql(f"SELECT doc_id, title FROM {table} WHERE {where}").num_rows
            assert n_api == n_sql and n_api >= 1
            entry[f"{table}_fetch_api_ms"] = timed(
                lambda t=t, w=where: t.to_arrow(columns=["doc_id", "title"], where=w), repeat
            )
            entry[f"{table}_fetch_sql_ms"] = timed(
                lambda tb=table, w=where: db.sql(f"SELECT doc_id, title FROM {tb} WHERE {w}"), repeat
            )
            entry[f"{table}_count_api_ms"] = timed(lambda t=t, w=where: t.count_rows(w), repeat)
            entry[f"{table}_count_sql_ms"] = timed(
                lambda tb=table, w=where: db.sql(f"SELECT count(*) FROM {tb} WHERE {w}"), repeat
            )
        for what in ("fetch_api", "fetch_sql", "count_api", "count_sql"):
            entry[f"{what}_speedup"] = entry[f"plain_{what}_ms"] / entry[f"indexed_{what}_ms"]
        results[name] = entry
        print(name, json.dumps({k: round(v, 2) for k, v in entry.items()}), flush=True)
    save("where_index", {"rows": n, "repeat": repeat, "results": results})


if __name__ == "__main__":
    main()
