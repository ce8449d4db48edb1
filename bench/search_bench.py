"""Search latency, throughput and CPU per query: superfile (file://) beside a single tantivy index, a single
usearch HNSW index and LanceDB, over the same rows, in the same run.

    .venv/bin/python bench/search_bench.py --kinds vector,bm25

The table (default 1M rows = 16 superfiles of 62,500) and every peer index are
built once into a cache directory (``--cache``, default /tmp/sfbench-search)
and reused by later runs; ``--rebuild`` builds them again, ``--build-only``
builds without measuring. The cache is keyed by rows, superfile size and the
data's version (a hash of the corpus and of the code that repeats it): a change
rebuilds everything. Before recall is measured, the ground truth's best
similarities are recomputed from the vectors the measured index stores
(superfile, usearch, LanceDB); a mismatch fails that measurement
(tests/test_bench_cache.py). Each build and each measurement runs in its own
process, one after another.

Queries are the real Vaswani (93) and Cranfield (225) query texts and
embeddings. Per system and setting: a warm-up pass, then ``--passes`` passes
over all queries from 1 client thread (sequential) and from 2 client threads
(a ThreadPoolExecutor issuing queries concurrently): p50/p99 latency over
queries, queries/s = queries / wall time, CPU ms per query = the measuring
process's CPU time (``time.process_time``: every thread, the library's pools
included) over the timed passes / their queries. Recall@10 of every vector
setting is against exact float32 brute force over all rows (computed once,
cached).

``--kinds filtered`` runs vector search with a ``where`` predicate on
``doc_id % 1000`` keeping 0.1%, 1%, 10% and 50% of the rows (uniform over the
corpus), superfile beside LanceDB (``prefilter=True``); recall@10 is against the
exact top 10 among the allowed rows. usearch has no predicate filter in its
Python API and is left out.

``--kinds hybrid`` runs ``hybrid_search`` (BM25 and vector fused by reciprocal
rank, k=60, 100 candidates from each) beside LanceDB's ``query_type="hybrid"``
with its RRFReranker (k=60), asked for 100 and cut to 10 so that it, too, fuses
100 candidates from each side. There is no exact reference, so no recall.

``--before-path DIR`` (a checkout's ``libs/superfile``) adds the system
``superfile-before``: the same table files, measured in the same run by a
process with DIR first on PYTHONPATH, so before and after see the same machine
load; its answers are compared query by query with ``superfile``'s.

Each run replaces its kinds in ``<results-dir>/<out>.json`` (default
bench/results/search.json; medians over ``--repeat`` runs, the systems
interleaved) and rewrites ``<out>.md`` from the whole file.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    RESULTS,
    ROOT,
    SHARED,
    corpus,
    lancedb_english_fts,
    median,
    peak_rss_mb,
    percentile,
    repeated,
    run_isolated,
)

DIM = 384
K = 10
BUILD_BATCH = 62_500
# superfile-before: the same table opened by another checkout of the library (--before-path), in the same run
SYSTEMS = ("superfile", "superfile-before", "tantivy", "usearch", "lancedb")
KINDS = ("vector", "filtered", "bm25", "hybrid")
KIND_SYSTEMS = {
    "vector": ("superfile", "superfile-before", "usearch", "lancedb"),
    "filtered": ("superfile", "superfile-before", "lancedb"),
    "bm25": ("superfile", "superfile-before", "tantivy", "lancedb"),
    "hybrid": ("superfile", "superfile-before", "lancedb"),
}
# systems that open the superfile table built for "superfile" and need no build of their own
SUPERFILE_SYSTEMS = ("superfile", "superfile-before")
# hybrid: candidates per retriever before reciprocal-rank fusion (superfile's HYBRID_DEPTH; LanceDB is given the same)
HYBRID_DEPTH = 100
# filtered kind: rows with doc_id % 1000 < cut, i.e. these fractions of the table
FILTER_LEVELS = (0.001, 0.01, 0.1, 0.5)
# The settings measured per system; the first one is the system's defaults.
VECTOR_SETTINGS: dict[str, list[dict[str, Any]]] = {
    "superfile": [{}, {"nprobe": 32}, {"nprobe": 24}, {"nprobe": 16}, {"nprobe": 8}],
    "superfile-before": [{}, {"nprobe": 32}, {"nprobe": 24}, {"nprobe": 16}, {"nprobe": 8}],
    # the corpus repeats every document ~78 times with small jitter: near-duplicate clusters that need
    # a wide HNSW beam and a deep PQ refine pool to rank the true top 10
    "usearch": [{}, {"ef": 32}, {"ef": 256}, {"ef": 512}, {"ef": 1024}, {"ef": 2048}],
    "lancedb": [
        {},
        {"nprobes": 20, "refine": 50},
        {"nprobes": 20, "refine": 100},
        {"nprobes": 40, "refine": 200},
    ],
}


# -- shared -----------------------------------------------------------------------------------


def queries() -> pa.Table:
    """The real query texts and embeddings: Vaswani (93) then Cranfield (225)."""
    parts = []
    for name in ("vaswani", "cranfield"):
        t = pq.read_table(SHARED / name / "queries.parquet", columns=["text", "embedding"])
        parts.append(t.set_column(1, "embedding", t["embedding"].cast(pa.list_(pa.float32(), DIM))))
    return pa.concat_tables(parts).combine_chunks()


def query_vectors(q: pa.Table) -> np.ndarray:
    return np.asarray(q["embedding"].combine_chunks().values.to_numpy(), np.float32).reshape(-1, DIM)


def label(setting: dict[str, Any]) -> str:
    if "level" in setting:
        return f"where {setting['level']:.1%}"
    return "default" if not setting else " ".join(f"{k}={v}" for k, v in setting.items())


def where_clause(level: float) -> str:
    return f"doc_id % 1000 < {round(level * 1000)}"


def paths(cache: Path) -> dict[str, Path]:
    return {
        "gt": cache / "ground_truth.npz",
        "gt_filtered": cache / "ground_truth_filtered.npz",
        "superfile": cache / "superfile",
        "tantivy": cache / "tantivy",
        "usearch": cache / "usearch.index",
        "lancedb": cache / "lancedb",
    }


def build_info(cache: Path) -> dict[str, Any]:
    f = cache / "builds.json"
    return json.loads(f.read_text()) if f.exists() else {}


def record_build(cache: Path, what: str, info: dict[str, Any]) -> None:
    all_info = build_info(cache)
    all_info[what] = info
    (cache / "builds.json").write_text(json.dumps(all_info, indent=2))


# -- builds (each in its own process) -----------------------------------------------------------


def build_gt(cache: Path, rows: int, filtered: bool = False) -> dict[str, Any]:
    """Exact top-k by cosine (float32 numpy) for every query: over all rows, or (``filtered``) among the
    rows each FILTER_LEVELS predicate keeps."""
    qv = query_vectors(queries())
    qn = qv / np.linalg.norm(qv, axis=1, keepdims=True)
    cuts = [round(level * 1000) for level in FILTER_LEVELS] if filtered else [1000]
    best_ids = [np.zeros((len(qn), 0), np.int64) for _ in cuts]
    best_sim = [np.zeros((len(qn), 0), np.float32) for _ in cuts]
    t0 = time.perf_counter()
    for b in repeated(rows, BUILD_BATCH):
        v = np.asarray(b["embedding"].combine_chunks().values.to_numpy(), np.float32).reshape(-1, DIM)
        ids = b["doc_id"].to_numpy()
        sim_all = qn @ v.T  # stored vectors are unit length
        for j, cut in enumerate(cuts):
            keep_rows = np.flatnonzero(ids % 1000 < cut)
            if len(keep_rows) == 0:
                continue
            sim = sim_all[:, keep_rows]
            kk = min(K, len(keep_rows))
            top = np.argpartition(-sim, kk - 1, axis=1)[:, :kk]
            cand_ids = np.concatenate([best_ids[j], ids[keep_rows][top]], axis=1)
            cand_sim = np.concatenate([best_sim[j], np.take_along_axis(sim, top, axis=1)], axis=1)
            keep = np.argsort(-cand_sim, axis=1, kind="stable")[:, :K]
            best_ids[j] = np.take_along_axis(cand_ids, keep, axis=1)
            best_sim[j] = np.take_along_axis(cand_sim, keep, axis=1)
    if filtered:
        np.savez(
            paths(cache)["gt_filtered"], **{f"ids_{lv}": ids for lv, ids in zip(FILTER_LEVELS, best_ids, strict=True)}
        )
    else:
        np.savez(paths(cache)["gt"], ids=best_ids[0], sim=best_sim[0])
    return {"seconds": time.perf_counter() - t0, "queries": len(qn)}


def all_rows(rows: int) -> pa.Table:
    return pa.concat_tables(list(repeated(rows, BUILD_BATCH))).combine_chunks()


def build_superfile(cache: Path, rows: int, max_rows: int) -> dict[str, Any]:
    import superfile

    data = all_rows(rows)
    db = superfile.connect(f"file://{paths(cache)['superfile']}")
    t = db.create_table(
        "bench",
        data.schema,
        fts_columns=["text"],
        vector_columns={"embedding": {"dim": DIM, "metric": "cosine"}},
        max_rows_per_superfile=max_rows,
    )
    t0 = time.perf_counter()
    t.append(data)
    elapsed = time.perf_counter() - t0
    st = t.stats()
    assert st["row_count"] == rows, st
    return {
        "seconds": elapsed,
        "superfiles": st["superfile_count"],
        "rows": st["row_count"],
        "peak_rss_mb": peak_rss_mb(),
    }


def _tantivy_schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("doc_id", indexed=False, fast=True)
    sb.add_text_field("text", stored=False, tokenizer_name="en", index_option="freq")
    return sb.build()


def build_tantivy(cache: Path, rows: int) -> dict[str, Any]:
    """One tantivy index over every text, analysed exactly like superfile's "english" columns."""
    import tantivy
    from superfile.format.fulltext import make_analyzer

    data = all_rows(rows)
    path = paths(cache)["tantivy"]
    path.mkdir(parents=True)
    index = tantivy.Index(_tantivy_schema(), path=str(path))
    index.register_tokenizer("en", make_analyzer("english"))
    t0 = time.perf_counter()
    writer = index.writer(heap_size=1_500_000_000, num_threads=1)
    dumps = json.dumps
    for doc_id, text in zip(data["doc_id"].to_pylist(), data["text"].to_pylist(), strict=True):
        writer.add_json(dumps({"doc_id": doc_id, "text": text}))
    writer.commit()
    writer.wait_merging_threads()
    elapsed = time.perf_counter() - t0
    index.reload()
    s = index.searcher()
    assert s.num_docs == rows
    return {"seconds": elapsed, "segments": s.num_segments, "peak_rss_mb": peak_rss_mb()}


def build_usearch(cache: Path, rows: int) -> dict[str, Any]:
    from usearch.index import Index

    index = Index(ndim=DIM, metric="cos", dtype="f16")
    t0 = time.perf_counter()
    for b in repeated(rows, BUILD_BATCH):
        v = np.asarray(b["embedding"].combine_chunks().values.to_numpy(), np.float32).reshape(-1, DIM)
        index.add(b["doc_id"].to_numpy().astype(np.uint64), v, threads=0)
    elapsed = time.perf_counter() - t0
    index.save(str(paths(cache)["usearch"]))
    return {
        "seconds": elapsed,
        "dtype": "f16",
        "connectivity": index.connectivity,
        "expansion_add": index.expansion_add,
        "expansion_search": index.expansion_search,
        "peak_rss_mb": peak_rss_mb(),
    }


def build_lancedb(cache: Path, rows: int) -> dict[str, Any]:
    import lancedb

    db = lancedb.connect(str(paths(cache)["lancedb"]))
    t0 = time.perf_counter()
    t = None
    for b in repeated(rows, BUILD_BATCH):
        if t is None:
            t = db.create_table("bench", b)
        else:
            t.add(b)
    assert t is not None
    t_add = time.perf_counter() - t0
    lancedb_english_fts(t)
    t_fts = time.perf_counter() - t0 - t_add
    t.create_index(metric="cosine", vector_column_name="embedding", index_type="IVF_PQ")
    t_vec = time.perf_counter() - t0 - t_add - t_fts
    assert t.count_rows() == rows
    indices = [{"name": i.name, "type": str(i.index_type), "columns": i.columns} for i in t.list_indices()]
    vstats = {}
    for i in t.list_indices():
        if "embedding" in i.columns:
            s = t.index_stats(i.name)
            vstats = {"num_indexed_rows": s.num_indexed_rows, "num_indices": s.num_indices, "index_type": s.index_type}
    return {
        "seconds": time.perf_counter() - t0,
        "add_seconds": t_add,
        "fts_index_seconds": t_fts,
        "vector_index_seconds": t_vec,
        "indices": indices,
        "vector_index": vstats,
        "peak_rss_mb": peak_rss_mb(),
    }


# -- systems under measurement ---------------------------------------------------------------
# Each opens its index and returns search(i, setting) -> native result and decode(result) ->
# (doc_ids, scores); only search() is timed.


class Superfile:
    def __init__(self, cache: Path, q: pa.Table) -> None:
        import superfile

        self.t = superfile.connect(f"file://{paths(cache)['superfile']}").open_table("bench")
        m = self.t.to_arrow(columns=["_id", "doc_id"])
        ids = m["_id"].to_numpy()
        self.id2doc = np.full(int(ids.max()) + 1, -1, np.int64)
        self.id2doc[ids] = m["doc_id"].to_numpy()
        self.texts = q["text"].to_pylist()
        self.vectors = query_vectors(q)
        self.stats = {**self.t.stats(), "library": str(Path(superfile.__file__).parent)}

    def stored_vectors(self, doc_ids: np.ndarray) -> np.ndarray:
        where = f"doc_id IN ({', '.join(str(int(d)) for d in doc_ids)})"
        got = self.t.to_arrow(columns=["doc_id", "embedding"], where=where)
        by_doc = dict(zip(got["doc_id"].to_pylist(), got["embedding"].to_pylist(), strict=True))
        return np.asarray([by_doc[int(d)] for d in doc_ids], np.float32)

    def vector(self, i: int, s: dict[str, Any]) -> pa.Table:
        return self.t.vector_search(
            "embedding", self.vectors[i], k=K, nprobe=s.get("nprobe"), projection=["_id", "score"]
        )

    def filtered(self, i: int, s: dict[str, Any]) -> pa.Table:
        return self.t.vector_search(
            "embedding", self.vectors[i], k=K, where=where_clause(s["level"]), projection=["_id", "score"]
        )

    def bm25(self, i: int, s: dict[str, Any]) -> pa.Table:
        return self.t.bm25_search("text", self.texts[i], k=K, projection=["_id", "score"])

    def hybrid(self, i: int, s: dict[str, Any]) -> pa.Table:
        return self.t.hybrid_search(
            "text", self.texts[i], "embedding", self.vectors[i], k=K, projection=["_id", "score"]
        )

    def decode(self, r: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        return self.id2doc[r["_id"].to_numpy().astype(np.int64)], r["score"].to_numpy()

    @staticmethod
    def settle() -> bool:
        """Wait for the work the warm-up's searches set off in the background (merging a BM25 union's segments,
        ``format/fulltext_merge.py``): the state a serving process reaches. Whether there was any to wait for
        (a library without it has none)."""
        from superfile.format import fulltext_union

        done = getattr(fulltext_union, "merges_done", None)
        if done is None:
            return False
        if not done(300.0):
            raise RuntimeError("segment merges still running after 300 s")
        return True

    @staticmethod
    def extra(results: list[pa.Table]) -> dict[str, float]:
        """How many superfiles a search saw and pruned, from the result's metadata (hybrid results carry none)."""
        keys = {
            "superfiles": b"superfile.superfiles",
            "searched_avg": b"superfile.searched",
            "pruned_avg": b"superfile.pruned",
        }
        if not all(r.schema.metadata and keys["superfiles"] in r.schema.metadata for r in results):
            return {}
        return {name: float(np.mean([int(r.schema.metadata[key]) for r in results])) for name, key in keys.items()}


class Tantivy:
    def __init__(self, cache: Path, q: pa.Table) -> None:
        import tantivy
        from superfile.format.fulltext import make_analyzer

        self.tantivy = tantivy
        self.index = tantivy.Index.open(str(paths(cache)["tantivy"]))
        self.index.register_tokenizer("en", make_analyzer("english"))
        self.searcher = self.index.searcher()
        self.schema = self.index.schema
        self.texts = q["text"].to_pylist()
        self._local = threading.local()  # a TextAnalyzer is not shareable between threads while it runs
        self._make_analyzer = make_analyzer
        self.stats = {"segments": self.searcher.num_segments, "num_docs": self.searcher.num_docs}

    def bm25(self, i: int, s: dict[str, Any]) -> tuple[list[float], list[int]]:
        an = getattr(self._local, "an", None)
        if an is None:
            an = self._local.an = self._make_analyzer("english")
        terms = list(dict.fromkeys(an.analyze(self.texts[i])))
        if not terms:
            return [], []
        T = self.tantivy
        clauses = [T.Query.term_query(self.schema, "text", t) for t in terms]
        # one term: the term query itself, as parse_query makes it (tantivy ranks it by block-WAND)
        query = clauses[0] if len(clauses) == 1 else T.Query.boolean_query([(T.Occur.Should, q) for q in clauses])
        hits = self.searcher.search(query, K, count=False).hits
        return [h[0] for h in hits], self.searcher.fast_field_values("doc_id", [h[1] for h in hits])

    def decode(self, r: tuple[list[float], list[int]]) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(r[1], np.int64), np.asarray(r[0], np.float32)


class Usearch:
    def __init__(self, cache: Path, q: pa.Table) -> None:
        from usearch.index import Index

        self.index = Index.restore(str(paths(cache)["usearch"]))  # loaded into memory, not viewed
        self.default_ef = self.index.expansion_search
        self.vectors = query_vectors(q)
        self.stats = {"size": len(self.index), "expansion_search_default": self.default_ef}

    def prepare(self, s: dict[str, Any]) -> None:
        self.index.expansion_search = s.get("ef", self.default_ef)

    def vector(self, i: int, s: dict[str, Any]) -> Any:
        return self.index.search(self.vectors[i], K)

    def stored_vectors(self, doc_ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.get(doc_ids.astype(np.uint64)), np.float32)

    def decode(self, r: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(r.keys, np.int64), np.asarray(r.distances, np.float32)


class LanceDB:
    def __init__(self, cache: Path, q: pa.Table) -> None:
        import lancedb
        from lancedb.rerankers import RRFReranker

        self.t = lancedb.connect(str(paths(cache)["lancedb"])).open_table("bench")
        self._rrf = RRFReranker(K=60)
        self.texts = q["text"].to_pylist()
        self.vectors = query_vectors(q)
        self.stats = {"rows": self.t.count_rows()}

    def stored_vectors(self, doc_ids: np.ndarray) -> np.ndarray:
        where = f"doc_id IN ({', '.join(str(int(d)) for d in doc_ids)})"
        got = self.t.search().where(where).select(["doc_id", "embedding"]).limit(len(doc_ids)).to_arrow()
        by_doc = dict(zip(got["doc_id"].to_pylist(), got["embedding"].to_pylist(), strict=True))
        return np.asarray([by_doc[int(d)] for d in doc_ids], np.float32)

    def vector(self, i: int, s: dict[str, Any]) -> pa.Table:
        b = self.t.search(self.vectors[i], vector_column_name="embedding").distance_type("cosine")
        if "nprobes" in s:
            b = b.nprobes(s["nprobes"])
        if s.get("refine"):
            b = b.refine_factor(s["refine"])
        return b.limit(K).select(["doc_id"]).to_arrow()

    def filtered(self, i: int, s: dict[str, Any]) -> pa.Table:
        b = self.t.search(self.vectors[i], vector_column_name="embedding").distance_type("cosine")
        return b.where(where_clause(s["level"]), prefilter=True).limit(K).select(["doc_id"]).to_arrow()

    def bm25(self, i: int, s: dict[str, Any]) -> pa.Table:
        return self.t.search(self.texts[i], query_type="fts", fts_columns="text").limit(K).select(["doc_id"]).to_arrow()

    def hybrid(self, i: int, s: dict[str, Any]) -> pa.Table:
        """Vector (default IVF_PQ knobs) and native FTS fused by RRF (k=60, as superfile's). LanceDB takes
        ``limit`` candidates from each retriever, so it is asked for HYBRID_DEPTH and the fused list cut to K."""
        b = self.t.search(query_type="hybrid", vector_column_name="embedding", fts_columns="text")
        b = b.vector(self.vectors[i]).text(self.texts[i]).distance_type("cosine").rerank(self._rrf)
        return b.limit(HYBRID_DEPTH).select(["doc_id"]).to_arrow().slice(0, K)

    def decode(self, r: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        col = next(c for c in ("_relevance_score", "_distance", "_score") if c in r.column_names)
        return r["doc_id"].to_numpy().astype(np.int64), r[col].to_numpy().astype(np.float32)


CLASSES: dict[str, Any] = {
    "superfile": Superfile,
    "superfile-before": Superfile,
    "tantivy": Tantivy,
    "usearch": Usearch,
    "lancedb": LanceDB,
}


def timed_pass(fn: Callable[[int], Any], n: int, threads: int) -> tuple[list[float], float, list[Any]]:
    """All n queries from ``threads`` client threads: per-query latencies (s), wall time (s), results."""
    lat = [0.0] * n
    out: list[Any] = [None] * n

    def one(i: int) -> None:
        t0 = time.perf_counter()
        out[i] = fn(i)
        lat[i] = time.perf_counter() - t0

    if threads == 1:
        t0 = time.perf_counter()
        for i in range(n):
            one(i)
        return lat, time.perf_counter() - t0, out
    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        list(ex.map(one, range(n)))
        wall = time.perf_counter() - t0
    return lat, wall, out


def warm_up(sysobj: Any, fn: Callable[[int], Any], n: int) -> None:
    """Every query once; then, for a system with background work (``settle``), once more after it ends."""
    timed_pass(fn, n, 1)
    if hasattr(sysobj, "settle") and sysobj.settle():
        timed_pass(fn, n, 1)


def measure(system: str, kind: str, cache: Path, passes: int, threads: list[int]) -> dict[str, Any]:
    """One system and kind in this process: per setting, latency, q/s and CPU time per query at each client
    thread count. CPU time is the process's (every thread's, the library's pools included) over the timed
    passes, divided by the queries they ran."""
    q = queries()
    n = q.num_rows
    t0 = time.perf_counter()
    sysobj = CLASSES[system](cache, q)
    open_s = time.perf_counter() - t0
    if system == "superfile-before" and Path(sysobj.stats["library"]).is_relative_to(ROOT):
        raise RuntimeError(f"superfile-before imported this checkout's library ({sysobj.stats['library']})")
    fn = getattr(sysobj, kind)
    settings: list[dict[str, Any]] = [{}]
    gts: list[np.ndarray | None] = [None]
    if kind == "vector":
        settings = VECTOR_SETTINGS[system]
        gts = [np.load(paths(cache)["gt"])["ids"]] * len(settings)
        if hasattr(sysobj, "stored_vectors"):
            check_ground_truth(sysobj.stored_vectors, cache, atol=5e-3 if system == "usearch" else 1e-4)
    elif kind == "filtered":
        settings = [{"level": level} for level in FILTER_LEVELS]
        stored = np.load(paths(cache)["gt_filtered"])
        gts = [stored[f"ids_{level}"] for level in FILTER_LEVELS]
    rows = []
    first_query_s = None

    def run_one(setting: dict[str, Any], i: int) -> Any:
        return fn(i, setting)

    for s, gt in zip(settings, gts, strict=True):
        if hasattr(sysobj, "prepare"):
            sysobj.prepare(s)
        t0 = time.perf_counter()
        fn(0, s)
        if first_query_s is None:
            first_query_s = time.perf_counter() - t0  # cold: opens/extracts what the first query touches
        warm_up(sysobj, functools.partial(run_one, s), n)
        row: dict[str, Any] = {"setting": label(s), "params": s, "threads": {}}
        for th in threads:
            lats: list[float] = []
            qps = []
            results: list[Any] = []
            cpu0 = time.process_time()
            for _ in range(passes):
                lat, wall, out = timed_pass(functools.partial(run_one, s), n, th)
                lats += lat
                qps.append(n / wall)
                results = out
            cpu = time.process_time() - cpu0
            row["threads"][str(th)] = {
                "p50_ms": percentile(lats, 50) * 1e3,
                "p99_ms": percentile(lats, 99) * 1e3,
                "mean_ms": float(np.mean(lats)) * 1e3,
                "qps": median(qps),
                "cpu_ms": cpu / (n * passes) * 1e3,
            }
            if th == threads[0]:
                decoded = [sysobj.decode(r) for r in results]
                row["ids"] = [d[0].tolist() for d in decoded]  # for the before/after comparison; not saved
                row["hits_avg"] = float(np.mean([len(d[0]) for d in decoded]))
                row["scores"] = [d[1].tolist() for d in decoded]  # for the score comparisons; not saved
                if gt is not None:
                    row["recall"] = float(
                        np.mean(
                            [
                                len(set(d[0].tolist()) & set(gt[i].tolist())) / max(1, len(gt[i]))
                                for i, d in enumerate(decoded)
                            ]
                        )
                    )
                if hasattr(sysobj, "extra"):
                    row.update(sysobj.extra(results))
        rows.append(row)
    return {
        "system": system,
        "kind": kind,
        "queries": n,
        "passes": passes,
        "open_s": open_s,
        "first_query_s": first_query_s,
        "info": sysobj.stats,
        "settings": rows,
        "peak_rss_mb": peak_rss_mb(),
    }


# -- parent: builds, runs, summary -------------------------------------------------------------


def data_version() -> str:
    """What the built rows depend on besides their count: the corpus and the code that repeats it. A cache
    built from other data (an older corpus, another jitter) would be measured against the wrong ground
    truth: a run once reported recall 0.005 for tables built by an earlier version of this benchmark."""
    digest = hashlib.sha256(inspect.getsource(repeated).encode())
    base = corpus()
    digest.update(str(BUILD_BATCH).encode())
    for column in base.columns:
        for buf in column.combine_chunks().buffers():
            if buf is not None:
                digest.update(buf)
    return digest.hexdigest()[:16]


def superfile_format() -> str:
    """What the superfile table depends on besides its rows: the code that writes superfiles, their indexes
    included. A table written before a layout or index change (as page reads made) would measure the old one,
    so it is built again."""
    from superfile.format import fulltext, layout, scalar_index, vector_index, writer

    digest = hashlib.sha256()
    for module in (layout, writer, fulltext, scalar_index, vector_index):
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:16]


def check_ground_truth(vectors: Callable[[np.ndarray], np.ndarray], cache: Path, atol: float = 1e-4) -> None:
    """The ground truth's best similarities, recomputed from the vectors the measured system stores for
    those doc_ids: a table that holds other vectors than the ground truth was computed over fails here,
    instead of reporting a recall near zero. ``atol`` allows for an index that stores vectors in f16."""
    gt = np.load(paths(cache)["gt"])
    qv = query_vectors(queries())
    qn = qv / np.linalg.norm(qv, axis=1, keepdims=True)
    sample = range(0, len(qn), max(1, len(qn) // 10))
    ids = np.asarray([gt["ids"][i, 0] for i in sample], np.int64)
    stored = vectors(ids)
    got = np.einsum("ij,ij->i", qn[list(sample)], stored / np.linalg.norm(stored, axis=1, keepdims=True))
    want = np.asarray([gt["sim"][i, 0] for i in sample])
    if not np.allclose(got, want, atol=atol):
        raise RuntimeError(f"the ground truth in {cache} was not computed over the measured table: run with --rebuild")


def ensure_builds(args: argparse.Namespace, kinds: list[str], systems: list[str]) -> None:
    """Build what the kinds and systems need into the cache, keyed by rows, superfile size and data version:
    a cache built from other inputs is dropped whole, so no index and ground truth from different runs meet."""
    cache = Path(args.cache)
    p = paths(cache)
    cfg = {"rows": args.rows, "max_rows_per_superfile": args.max_rows_per_superfile, "data": data_version()}
    info = build_info(cache)
    if args.rebuild or (info.get("config") not in (None, cfg)):
        shutil.rmtree(cache, ignore_errors=True)
        info = {}
    cache.mkdir(parents=True, exist_ok=True)
    record_build(cache, "config", cfg)
    needed = ["superfile"] + [s for s in systems if s not in SUPERFILE_SYSTEMS]
    needed = [s for s in needed if any(s in KIND_SYSTEMS[k] for k in kinds)]
    if "filtered" in kinds:
        needed = ["gt_filtered", *needed]
    if "vector" in kinds:
        needed = ["gt", *needed]
    written_by = superfile_format()
    for what in needed:
        if what in info and p[what].exists() and (what != "superfile" or info[what].get("format") == written_by):
            continue
        if p[what].is_dir():
            shutil.rmtree(p[what])
        elif p[what].exists():
            p[what].unlink()
        print(f"building {what} ...", flush=True)
        res = run_isolated(Path(__file__), *common_argv(args), "--child-build", what)
        if what == "superfile":
            res["format"] = written_by
        record_build(cache, what, res)
        print(f"  {what}: {json.dumps(res)}", flush=True)


def common_argv(args: argparse.Namespace) -> list[str]:
    return [
        "--rows",
        str(args.rows),
        "--max-rows-per-superfile",
        str(args.max_rows_per_superfile),
        "--cache",
        args.cache,
        "--passes",
        str(args.passes),
        "--threads",
        args.threads,
    ]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeat runs of one (system, kind), setting by setting."""
    out = {k: runs[-1][k] for k in ("system", "kind", "queries", "passes", "info")}
    out["open_s"] = median([r["open_s"] for r in runs])
    out["first_query_s"] = median([r["first_query_s"] for r in runs])
    out["peak_rss_mb"] = median([r["peak_rss_mb"] for r in runs])
    out["repeat"] = len(runs)
    settings = []
    for i, s in enumerate(runs[-1]["settings"]):
        per = [r["settings"][i] for r in runs]
        row: dict[str, Any] = {"setting": s["setting"], "params": s["params"], "threads": {}}
        for th in s["threads"]:
            row["threads"][th] = {m: median([p["threads"][th][m] for p in per]) for m in s["threads"][th]}
        for m in ("recall", "hits_avg", "superfiles", "searched_avg", "pruned_avg"):
            if m in s:
                row[m] = median([p[m] for p in per])
        row["ids"], row["scores"] = s["ids"], s["scores"]
        settings.append(row)
    out["settings"] = settings
    return out


def score_agreement(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """How closely two BM25 rankings' score lists agree (ties make the row sets arbitrary; scores are not)."""
    same, rel = 0, []
    for x, y in zip(a, b, strict=True):
        if len(x) == len(y) and np.allclose(x, y, rtol=1e-4, atol=1e-5):
            same += 1
        if len(x) and len(y):
            m = min(len(x), len(y))
            rel.append(float(np.max(np.abs(np.asarray(x[:m]) - np.asarray(y[:m])) / np.maximum(np.abs(y[:m]), 1e-9))))
    return {"queries_identical_scores": same / max(1, len(a)), "max_rel_score_diff": max(rel, default=0.0)}


def same_answers(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Two runs of one setting, query by query: identical ids in the same order, identical score lists,
    and the mean overlap of the top-k id sets (ties at the k-th score may legitimately swap rows)."""
    ids_same = [x == y for x, y in zip(a["ids"], b["ids"], strict=True)]
    overlap = [len(set(x) & set(y)) / max(1, len(x), len(y)) for x, y in zip(a["ids"], b["ids"], strict=True)]
    return {
        "queries_identical_ids": float(np.mean(ids_same)),
        "mean_overlap": float(np.mean(overlap)),
        **score_agreement(a["scores"], b["scores"]),
    }


def pick_tuned(settings: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The fastest setting (1-thread p50) whose recall reaches ``target``."""
    ok = [s for s in settings if s.get("recall", 0) >= target]
    return min(ok, key=lambda s: s["threads"]["1"]["p50_ms"]) if ok else None


def equal_recall(
    ours: list[dict[str, Any]], peer: list[dict[str, Any]], target: float
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The pair of settings, both at recall >= ``target``, whose recalls are closest to each other."""
    pairs = [(a, b) for a in ours for b in peer if a.get("recall", 0) >= target and b.get("recall", 0) >= target]
    if not pairs:
        return None
    return min(pairs, key=lambda ab: (abs(ab[0]["recall"] - ab[1]["recall"]), ab[0]["threads"]["1"]["p50_ms"]))


def table_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "| kind | system | setting | recall@10 | p50 ms (1 thr) | p99 ms (1 thr) | q/s (1 thr) "
        "| p50 ms (2 thr) | p99 ms (2 thr) | q/s (2 thr) | q/s 2 thr / 1 thr | CPU ms/query (1 thr) "
        "| CPU ms/query (2 thr) | superfiles searched / pruned |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for system in SYSTEMS:
            r = results.get(kind, {}).get(system)
            if not r:
                continue
            for s in r["settings"]:
                t1, t2 = s["threads"].get("1", {}), s["threads"].get("2", {})
                rec = f"{s['recall']:.3f}" if "recall" in s else "-"
                prune = f"{s['searched_avg']:.1f} / {s['pruned_avg']:.1f}" if "searched_avg" in s else "-"
                scale = f"{t2['qps'] / t1['qps']:.2f}x" if "qps" in t1 and "qps" in t2 else "-"

                def f(d: dict[str, float], m: str) -> str:
                    return f"{d[m]:.2f}" if m in d else "-"

                lines.append(
                    f"| {kind} | {system} | {s['setting']} | {rec} | {f(t1, 'p50_ms')} | {f(t1, 'p99_ms')} "
                    f"| {t1.get('qps', 0):.0f} | {f(t2, 'p50_ms')} | {f(t2, 'p99_ms')} "
                    f"| {t2.get('qps', 0):.0f} | {scale} | {f(t1, 'cpu_ms')} | {f(t2, 'cpu_ms')} | {prune} |"
                )
    return lines


def per_thread(a: dict[str, Any], b: dict[str, Any], metric: str) -> dict[str, float]:
    return {th: a[th][metric] / b[th][metric] for th in a if th in b}


def ratios(results: dict[str, Any], target: float) -> dict[str, Any]:
    """Superfile against its peers: BM25 at the defaults, vector at the fastest setting reaching ``target``."""
    out: dict[str, Any] = {}
    b = results.get("bm25", {})
    if "superfile" in b:
        sf = b["superfile"]["settings"][0]["threads"]
        for peer in ("tantivy", "lancedb"):
            if peer in b:
                pt = b[peer]["settings"][0]["threads"]
                out[f"bm25 superfile/{peer} p50"] = per_thread(sf, pt, "p50_ms")
                out[f"bm25 superfile/{peer} qps"] = per_thread(sf, pt, "qps")
    v = results.get("vector", {})
    if "superfile" in v:
        sf_def = v["superfile"]["settings"][0]
        sf_tuned = pick_tuned(v["superfile"]["settings"], target)
        for peer in ("usearch", "lancedb"):
            if peer not in v:
                continue
            pdef = v[peer]["settings"][0]
            ptuned = pick_tuned(v[peer]["settings"], target)
            out[f"vector superfile default/{peer} default p50"] = per_thread(
                sf_def["threads"], pdef["threads"], "p50_ms"
            )
            if sf_tuned and ptuned:
                out[f"vector superfile@{target}/{peer}@{target} p50"] = {
                    "superfile_setting": sf_tuned["setting"],
                    "peer_setting": ptuned["setting"],
                    **per_thread(sf_tuned["threads"], ptuned["threads"], "p50_ms"),
                }
            elif sf_tuned:
                out[f"vector superfile@{target}/{peer}@{target} p50"] = (
                    f"{peer} reached no setting with recall >= {target}"
                )
    return out


# issue 20's targets: ratio name -> (bound, "<=" or ">=")
TARGETS = {
    "vector_vs_usearch_p50": (1.5, "<="),
    "bm25_vs_tantivy_p50": (1.2, "<="),
    "bm25_vs_tantivy_qps2": (0.9, ">="),
}
SCALING_TARGET = 1.8


def verdict(x: float, bound: float, op: str) -> str:
    return "met" if (x <= bound if op == "<=" else x >= bound) else "not met"


def issue20(results: dict[str, Any], target: float) -> dict[str, Any]:
    """Issue 20's ratios for superfile and superfile-before: vector p50 against usearch at equal recall, BM25
    p50 and 2-thread q/s against tantivy, q/s at 2 threads over 1 thread per kind and setting, and after /
    before per kind and setting."""
    out: dict[str, Any] = {"vector_vs_usearch_p50": {}, "bm25_vs_tantivy_p50": {}, "bm25_vs_tantivy_qps2": {}}
    v, b = results.get("vector", {}), results.get("bm25", {})
    for sf in SUPERFILE_SYSTEMS:
        if sf in v and "usearch" in v:
            pair = equal_recall(v[sf]["settings"], v["usearch"]["settings"], target)
            if pair is None:
                out["vector_vs_usearch_p50"][sf] = f"no pair of settings with recall >= {target}"
            else:
                a, p = pair
                out["vector_vs_usearch_p50"][sf] = {
                    "superfile_setting": a["setting"],
                    "superfile_recall": a["recall"],
                    "usearch_setting": p["setting"],
                    "usearch_recall": p["recall"],
                    **per_thread(a["threads"], p["threads"], "p50_ms"),
                }
        if sf in b and "tantivy" in b:
            st, tt = b[sf]["settings"][0]["threads"], b["tantivy"]["settings"][0]["threads"]
            out["bm25_vs_tantivy_p50"][sf] = per_thread(st, tt, "p50_ms")
            if "2" in st and "2" in tt:
                out["bm25_vs_tantivy_qps2"][sf] = {"2": st["2"]["qps"] / tt["2"]["qps"]}
    scaling: dict[str, Any] = {}
    after_before: dict[str, Any] = {}
    for kind in KINDS:
        for system, r in results.get(kind, {}).items():
            for s in r["settings"]:
                t = s["threads"]
                if "1" in t and "2" in t:
                    scaling.setdefault(kind, {}).setdefault(system, {})[s["setting"]] = t["2"]["qps"] / t["1"]["qps"]
        k = results.get(kind, {})
        if "superfile" in k and "superfile-before" in k:
            for a, p in zip(k["superfile"]["settings"], k["superfile-before"]["settings"], strict=True):
                after_before.setdefault(kind, {})[a["setting"]] = {
                    f"{m} {th} thr": a["threads"][th][m] / p["threads"][th][m]
                    for th in a["threads"]
                    for m in ("p50_ms", "qps", "cpu_ms")
                }
    out["qps_2_over_1"] = scaling
    out["after_over_before"] = after_before
    return out


def git_commit(path: Path) -> str:
    """The commit checked out at ``path`` and, if the library there has uncommitted changes, a mark."""
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no", "."], capture_output=True, text=True
    )
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def ratio_lines(results: dict[str, Any]) -> list[str]:
    i20 = results.get("issue20", {})
    lines = ["Issue 20's ratios (superfile / peer; `met` against the issue's bound):", ""]
    for name, (bound, op) in TARGETS.items():
        for sf, val in i20.get(name, {}).items():
            if not isinstance(val, dict):
                lines.append(f"- {name} {sf}: {val}")
                continue
            nums = ", ".join(
                f"{th} thr {x:.2f}x ({verdict(x, bound, op)})" for th, x in val.items() if th in ("1", "2")
            )
            extra = ""
            if "usearch_setting" in val:
                extra = (
                    f" (superfile {val['superfile_setting']} recall {val['superfile_recall']:.3f}, "
                    f"usearch {val['usearch_setting']} recall {val['usearch_recall']:.3f})"
                )
            lines.append(f"- {name} {sf} (target {op} {bound}x): {nums}{extra}")
    lines += ["", f"q/s at 2 client threads / at 1 (target >= {SCALING_TARGET}x):", ""]
    for kind, systems in i20.get("qps_2_over_1", {}).items():
        for system, per in systems.items():
            nums = ", ".join(f"{s} {x:.2f}x" for s, x in per.items())
            lines.append(f"- {kind} {system}: {nums}")
    if i20.get("after_over_before"):
        lines += ["", "superfile / superfile-before (after / before, same run; below 1 is faster for p50 and CPU):", ""]
        for kind, per in i20["after_over_before"].items():
            for setting, m in per.items():
                lines.append(f"- {kind} {setting}: " + ", ".join(f"{k} {x:.2f}x" for k, x in m.items()))
    return lines


def markdown(results: dict[str, Any], target: float) -> str:
    cfg = results.get("config", {})
    builds = results.get("builds", {})
    lines = [
        f"## Search latency and throughput ({cfg.get('rows', 0):,} rows, "
        f"{builds.get('superfile', {}).get('superfiles', '?')} superfiles)",
        "",
        *[
            f"- {kind}: `{run['command']}` (superfile {run['after']}"
            + (f", superfile-before {run['before']}" if run.get("before") else "")
            + f"; load average {run['load_start']} at the start, {run['load_end']} at the end; {run['utc']})"
            for kind, run in results.get("runs", {}).items()
        ],
        "",
        f"{cfg.get('rows', 0):,} rows (Cranfield + Vaswani documents repeated, vectors jittered) in superfiles of "
        f"<= {cfg.get('max_rows_per_superfile', 0):,} "
        "rows on file://, against a single tantivy index (same English analysis), a single usearch HNSW index (f16, "
        "M=16) and LanceDB (native FTS, IVF_PQ) over the same rows, in the same run, each system in its own process. "
        "superfile-before is the same table opened by the library of another checkout (`--before-path`). "
        f"{results.get('queries', 318)} real queries (Vaswani 93 + Cranfield 225), warm caches; latency percentiles "
        "are over queries; q/s = queries / wall time with 1 and 2 client threads; CPU ms/query = the measuring "
        "process's CPU time (all its threads) over the timed passes / queries. Recall@10 against exact float32 "
        "brute force; filtered rows: `where doc_id % 1000 < cut` (uniform over the corpus), recall against the exact "
        "top 10 among the allowed rows, LanceDB with prefilter=True, usearch has no predicate filter. Hybrid: BM25 "
        f"and vector fused by RRF (k=60), {HYBRID_DEPTH} candidates from each (LanceDB: query_type='hybrid' with its "
        "RRFReranker, limit 100 cut to 10); no exact reference, so no recall. "
        "2-core machine shared with other jobs: medians of "
        f"{cfg.get('repeat', 1)} run(s).",
        "",
        *table_lines(results),
        "",
        *ratio_lines(results),
        "",
        "Earlier ratios (superfile p50 / peer p50; vector at the fastest setting reaching the recall target):",
        "",
    ]
    for name, val in results.get("ratios", {}).items():
        if isinstance(val, dict):
            extra = ""
            if "superfile_setting" in val:
                extra = f" (superfile {val['superfile_setting']}, peer {val['peer_setting']})"
            nums = ", ".join(f"{th} thr {x:.2f}x" for th, x in val.items() if th in ("1", "2"))
            lines.append(f"- {name}: {nums}{extra}")
        else:
            lines.append(f"- {name}: {val}")
    for kind, agree in results.get("agreement", {}).items():
        lines += ["", f"{kind}: answers of superfile against: {json.dumps(agree)}"]
    lines += [
        "",
        "Builds (one process each, seconds): "
        + json.dumps(
            {k: round(v.get("seconds", 0), 1) for k, v in builds.items() if isinstance(v, dict) and "seconds" in v}
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--max-rows-per-superfile", type=int, default=62_500)
    p.add_argument("--cache", default="/tmp/sfbench-search")
    p.add_argument("--rebuild", action="store_true", help="drop the cache and build every index again")
    p.add_argument("--kinds", default="vector,bm25", help="any of vector, filtered, bm25, hybrid (run in that order)")
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s != "superfile-before"))
    p.add_argument(
        "--before-path",
        help="a checkout's libs/superfile: adds the system superfile-before, this table opened with that library",
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--passes", type=int, default=2, help="passes over all queries per measurement")
    p.add_argument("--threads", default="1,2", help="client thread counts")
    p.add_argument("--recall-target", type=float, default=0.95)
    p.add_argument("--out", default="search", help="results go to <results-dir>/<out>.json and .md")
    p.add_argument("--results-dir", default=str(RESULTS))
    p.add_argument("--build-only", action="store_true", help="build what the kinds and systems need, measure nothing")
    p.add_argument("--child-build")
    p.add_argument("--child-measure", nargs=2, metavar=("SYSTEM", "KIND"))
    args = p.parse_args()
    cache = Path(args.cache)
    threads = [int(x) for x in args.threads.split(",")]
    if args.child_build:
        what = args.child_build
        fns: dict[str, Callable[[], dict[str, Any]]] = {
            "gt": lambda: build_gt(cache, args.rows),
            "gt_filtered": lambda: build_gt(cache, args.rows, filtered=True),
            "superfile": lambda: build_superfile(cache, args.rows, args.max_rows_per_superfile),
            "tantivy": lambda: build_tantivy(cache, args.rows),
            "usearch": lambda: build_usearch(cache, args.rows),
            "lancedb": lambda: build_lancedb(cache, args.rows),
        }
        print(json.dumps(fns[what]()))
        return
    if args.child_measure:
        system, kind = args.child_measure
        print(json.dumps(measure(system, kind, cache, args.passes, threads)))
        return

    command = " ".join([".venv/bin/python", "bench/search_bench.py", *map(shlex.quote, sys.argv[1:])])
    kinds = [k for k in KINDS if k in args.kinds.split(",")]
    wanted = args.systems.split(",") + (["superfile-before"] if args.before_path else [])
    systems = [s for s in SYSTEMS if s in wanted]
    if "superfile-before" in systems and not args.before_path:
        p.error("superfile-before needs --before-path")
    ensure_builds(args, kinds, systems)
    if args.build_only:
        return
    before_env: dict[str, str] = {}
    if args.before_path:
        before = str(Path(args.before_path).resolve())
        before_env = {"PYTHONPATH": os.pathsep.join(x for x in (before, os.environ.get("PYTHONPATH")) if x)}

    out_dir = Path(args.results_dir)
    path = out_dir / f"{args.out}.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    same_table = {"rows": args.rows, "max_rows_per_superfile": args.max_rows_per_superfile}
    if {k: results.get("config", {}).get(k) for k in same_table} != same_table:
        results = {}
    runs_info = results.get("runs", {})
    agreement = results.get("agreement", {})
    for kind in kinds:
        load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for system in systems:
                if system not in KIND_SYSTEMS[kind]:
                    continue
                env = before_env if system == "superfile-before" else None
                try:
                    res = run_isolated(Path(__file__), *common_argv(args), "--child-measure", system, kind, env=env)
                except RuntimeError as e:  # e.g. a search the library does not support yet: keep the others
                    print(f"{kind} {system} FAILED: {str(e)[-1500:]}", flush=True)
                    continue
                runs.setdefault(system, []).append(res)
                brief = [(s["setting"], s.get("recall"), s["threads"]) for s in res["settings"]]
                print(kind, system, json.dumps(brief), flush=True)
        kind_res = {s: summarize(rs) for s, rs in runs.items()}
        agree: dict[str, Any] = {}
        if "superfile" in kind_res:
            mine = kind_res["superfile"]["settings"]
            if "superfile-before" in kind_res:
                agree["superfile-before"] = {
                    a["setting"]: same_answers(a, b)
                    for a, b in zip(mine, kind_res["superfile-before"]["settings"], strict=True)
                }
            if kind == "bm25":
                for peer in ("tantivy", "lancedb"):
                    if peer in kind_res:
                        agree[peer] = score_agreement(mine[0]["scores"], kind_res[peer]["settings"][0]["scores"])
        agreement[kind] = agree
        for r in kind_res.values():
            for s in r["settings"]:
                s.pop("scores", None)
                s.pop("ids", None)
        results[kind] = kind_res  # a kind's rows all come from one run
        runs_info[kind] = {
            "command": command,
            "after": git_commit(ROOT / "libs" / "superfile"),
            "before": git_commit(Path(args.before_path)) if args.before_path else None,
            "load_start": load_start,
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "repeat": args.repeat,
            "passes": args.passes,
        }
    results["runs"] = runs_info
    results["agreement"] = agreement
    results["config"] = {
        **same_table,
        "threads": threads,
        "recall_target": args.recall_target,
        "cpu_count": os.cpu_count(),
        "repeat": args.repeat,
    }
    results["queries"] = queries().num_rows
    results["builds"] = {k: v for k, v in build_info(cache).items() if k != "config"}
    results["ratios"] = ratios(results, args.recall_target)
    results["issue20"] = issue20(results, args.recall_target)
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    md = markdown(results, args.recall_target)
    (out_dir / f"{args.out}.md").write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
