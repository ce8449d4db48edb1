"""SQL latency: Connection.sql (DataFusion over pinned snapshots) vs DuckDB over the same superfiles as Parquet.

Builds (once) a 1M-row table of real text rows (bench/common.py's ``repeated``) plus scalar columns under
``--root`` (default /tmp/sqlbench), then times each query ``--runs`` times on both engines in the same run
and reports the medians. DuckDB reads the table's superfiles directly (they are Parquet files).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import duckdb
import superfile
from common import repeated

QUERIES = {
    "count_filter": "SELECT count(*) FROM bench WHERE year >= 2010",
    "point_eq": "SELECT doc_id, price FROM bench WHERE doc_id = 777777",
    "in_list": "SELECT count(*), avg(price) FROM bench WHERE grp IN (3, 17, 42)",
    "range_agg": "SELECT grp, count(*) AS n, avg(price) AS p FROM bench WHERE price BETWEEN 10 AND 20 GROUP BY grp",
    "group_by": "SELECT year, count(*) AS n, sum(price) AS s, max(doc_id) AS m FROM bench GROUP BY year",
    "top_n": "SELECT doc_id, price FROM bench WHERE year IS NULL ORDER BY price DESC, doc_id LIMIT 10",
    "like": "SELECT count(*) FROM bench WHERE text LIKE '%supersonic%'",
}


def build(root: Path, rows: int) -> superfile.Connection:
    conn = superfile.connect(str(root))
    if "bench" in conn.table_names():
        return conn
    t = None
    rng = np.random.default_rng(1)
    for batch in repeated(rows, 200_000):
        n = batch.num_rows
        year = rng.integers(1990, 2025, n)
        data = pa.table(
            {
                "doc_id": batch["doc_id"],
                "grp": pa.array(batch["doc_id"].to_numpy() % 100, pa.int64()),
                "price": pa.array(rng.uniform(0, 100, n)),
                "year": pa.array(year, pa.int64(), mask=rng.random(n) < 0.05),
                "text": batch["text"],
            }
        )
        if t is None:
            t = conn.create_table("bench", data.schema)
        t.append(data)
    return conn


def answer(table: pa.Table) -> list[tuple[object, ...]]:
    """Rows, sorted, floats rounded (the two engines sum in different orders)."""
    rows = zip(*(c.to_pylist() for c in table.columns), strict=True)
    return sorted((tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows), key=repr)


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/tmp/sqlbench")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    root = Path(args.root)
    t0 = time.perf_counter()
    conn = build(root, args.rows)
    print(f"table ready in {time.perf_counter() - t0:.1f}s: {conn.open_table('bench').stats()}", flush=True)
    files = sorted(glob.glob(str(root / "bench" / "data" / "*.parquet")))
    duck = duckdb.connect()
    duck.execute(f"CREATE VIEW bench AS SELECT * FROM read_parquet({files!r})")
    out = {}
    for name, q in QUERIES.items():
        a, b = conn.sql(q), duck.sql(q).to_arrow_table()  # warm-up, and the answers must agree
        assert answer(a) == answer(b), (name, a, b)
        sf = [timed(lambda q=q: conn.sql(q)) for _ in range(args.runs)]
        dk = [timed(lambda q=q: duck.sql(q).to_arrow_table()) for _ in range(args.runs)]
        out[name] = {"sql": q, "superfile_ms": statistics.median(sf), "duckdb_ms": statistics.median(dk)}
        print(
            f"{name:14s} superfile {out[name]['superfile_ms']:8.1f} ms   duckdb {out[name]['duckdb_ms']:8.1f} ms",
            flush=True,
        )
    result = {"rows": args.rows, "runs": args.runs, "superfiles": len(files), "queries": out}
    path = Path(__file__).resolve().parent / "results" / "sql.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
