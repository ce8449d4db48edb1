"""Shared benchmark helpers: real corpus rows repeated to any size, timing, memory, result files."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SAMPLE = ROOT / "examples" / "data"
RESULTS = ROOT / "bench" / "results"


def corpus() -> pa.Table:
    """Cranfield and (when ../shared is present) Vaswani docs as (text, embedding) rows."""
    tables = []
    cran = pq.read_table(SAMPLE / "cranfield" / "docs.parquet")
    tables.append(
        pa.table(
            {
                "text": pc.binary_join_element_wise(cran["title"], cran["text"], " "),
                "embedding": cran["embedding"].cast(pa.list_(pa.float32(), 384)),
            }
        )
    )
    vas = SHARED / "vaswani" / "docs.parquet"
    if vas.exists():
        v = pq.read_table(vas, columns=["text", "embedding"])
        tables.append(v.set_column(1, "embedding", v["embedding"].cast(pa.list_(pa.float32(), 384))))
    return pa.concat_tables(tables).combine_chunks()


def repeated(rows: int, batch_rows: int, seed: int = 0) -> Iterator[pa.Table]:
    """Batches of ``batch_rows`` real rows, the corpus repeated (vectors jittered so copies differ)."""
    base = corpus()
    rng = np.random.default_rng(seed)
    vectors = np.asarray(base["embedding"].combine_chunks().values.to_numpy(), np.float32).reshape(-1, 384)
    made = 0
    while made < rows:
        n = min(batch_rows, rows - made)
        idx = (np.arange(made, made + n) % base.num_rows).astype(np.int64)
        vec = vectors[idx] + rng.normal(0, 0.01, (n, 384)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        yield pa.table(
            {
                "doc_id": pa.array(np.arange(made, made + n), pa.int64()),
                "text": base["text"].take(pa.array(idx)),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 384),
            }
        )
        made += n


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_isolated(script: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement in its own process (so peak memory is its own); it prints one JSON line."""
    out = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script.name} {args} failed:\n{out.stderr[-4000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def lancedb_english_fts(table: Any, column: str = "text") -> None:
    """LanceDB's native full-text index on ``column`` with the analysis of superfile's "english" tokenizer
    (simple tokenizer, tokens up to 40 characters, lower case, English stopwords and stemmer), so BM25 results
    compare."""
    table.create_fts_index(
        column,
        use_tantivy=False,
        base_tokenizer="simple",
        language="English",
        max_token_length=40,
        lower_case=True,
        stem=True,
        remove_stop_words=True,
        ascii_folding=False,
        with_position=False,
    )
