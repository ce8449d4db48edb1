"""Table-wide BM25 (``FullTextIndex.candidates``, ``global_top_k``): exact against brute force, invariant under
splitting."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyroaring
import pytest
import superfile.format.fulltext as fulltext
import tantivy
from superfile.errors import InvalidOptionError
from superfile.format import SuperfileReader, SuperfileSpec, build_superfile
from superfile.format.fulltext import CorpusStats, FullTextIndex, global_top_k
from superfile.format.tantivy_files import FIELDNORMS, fieldnorm_id

DATA = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"
SPEC = SuperfileSpec(fts_columns={"text": "english"}, vector_columns={})
K1, B = 1.2, 0.75


@dataclass
class Part:
    base: int  # global row of the file's row 0
    fts: FullTextIndex
    num_docs: int
    total_tokens: int


@pytest.fixture(scope="module")
def docs() -> pa.Table:
    t = pq.read_table(DATA / "docs.parquet")
    assert t["id"].to_pylist() == list(range(1, t.num_rows + 1))  # qrels doc_id = row + 1
    titles, bodies = t["title"].to_pylist(), t["text"].to_pylist()
    text = pa.array([f"{a} {b}" for a, b in zip(titles, bodies, strict=True)], pa.string())
    return pa.table({"_id": pa.array(np.arange(t.num_rows, dtype=np.uint64)), "text": text})


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [str(q) for q in pq.read_table(DATA / "queries.parquet")["text"].to_pylist()]


def split(docs: pa.Table, n: int, cache: Path) -> list[Part]:
    bounds = [round(i * docs.num_rows / n) for i in range(n + 1)]
    parts = []
    for i in range(n):
        built = build_superfile(docs.slice(bounds[i], bounds[i + 1] - bounds[i]), SPEC)
        fts = SuperfileReader.open(built.data, name=f"split{n}-{i}", cache_dir=str(cache)).fulltext("text")
        n_docs, tokens = built.fts_stats["text"]
        assert (n_docs, tokens) == (fts.num_docs, fts.total_tokens) == (bounds[i + 1] - bounds[i], tokens)
        assert built.directory["sections"][1]["total_tokens"] == tokens
        parts.append(Part(bounds[i], fts, n_docs, tokens))
    return parts


@pytest.fixture(scope="module")
def one(docs: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> list[Part]:
    return split(docs, 1, tmp_path_factory.mktemp("one"))


@pytest.fixture(scope="module")
def sixteen(docs: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> list[Part]:
    return split(docs, 16, tmp_path_factory.mktemp("sixteen"))


def search_global(
    fts: FullTextIndex,
    terms: Sequence[str],
    k: int,
    stats: CorpusStats,
    *,
    mode: str = "any",
    allow: pyroaring.AbstractBitMap | None = None,
    weights: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One file's exact top-``k`` under table-wide statistics, best first (ties by row): the table's path,
    ``candidates`` then ``global_top_k``, over this one file."""
    found = fts.candidates(terms, k, stats, mode=mode, allow=allow, weights=weights)
    if found is None:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    rows, scores = global_top_k([found], k)[0]
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]


def stats_of(parts: Sequence[Part], terms: Sequence[str]) -> CorpusStats:
    """What the table computes: N and token totals from the manifest, df summed over files."""
    return CorpusStats(
        sum(p.num_docs for p in parts),
        sum(p.total_tokens for p in parts),
        {t: sum(p.fts.doc_freq(t) for p in parts) for t in terms},
    )


def table_search(parts: Sequence[Part], terms: list[str], k: int = 10, mode: str = "any") -> list[tuple[int, float]]:
    """The table's merge: every file's exact top-k, then the global top-k by (-score, global row)."""
    stats = stats_of(parts, terms)
    hits = []
    for p in parts:
        rows, scores = search_global(p.fts, terms, k, stats, mode=mode)
        hits += [(p.base + r, s) for r, s in zip(rows.tolist(), scores.tolist(), strict=True)]
    return sorted(hits, key=lambda h: (-h[1], h[0]))[:k]


class BruteForce:
    """BM25 computed in Python from each row's analysed tokens (dl quantised as tantivy stores it)."""

    def __init__(self, fts: FullTextIndex, texts: Sequence[str | None]) -> None:
        self.tf = [Counter(fts.analyze(t)) if t is not None else Counter() for t in texts]
        self.lengths = np.array([sum(c.values()) for c in self.tf], np.int64)
        self.norm = FIELDNORMS[[fieldnorm_id(n) for n in self.lengths]].astype(np.float64)

    def stats(self, terms: Sequence[str]) -> CorpusStats:
        return CorpusStats(len(self.tf), int(self.lengths.sum()), {t: sum(t in c for c in self.tf) for t in terms})

    def top(
        self,
        terms: Sequence[str],
        k: int,
        stats: CorpusStats,
        mode: str = "any",
        allow: set[int] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        uniq = list(dict.fromkeys(terms))
        avgdl = stats.total_tokens / stats.num_docs
        scores = np.zeros(len(self.tf))
        for row, counts in enumerate(self.tf):
            if (allow is not None and row not in allow) or (mode == "all" and not all(t in counts for t in uniq)):
                continue
            for t in uniq:
                tf, df = counts.get(t, 0), stats.doc_freq.get(t, 0)
                if tf:
                    idf = math.log(1 + (stats.num_docs - df + 0.5) / (df + 0.5))
                    w = (weights or {}).get(t, 1.0)
                    scores[row] += w * idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * self.norm[row] / avgdl))
        rows = np.flatnonzero(scores > 0)
        s32 = scores[rows].astype(np.float32)
        order = np.lexsort((rows, -s32))[:k]
        return rows[order], s32[order]


def assert_same_top(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    """Same scores (float rounding aside) and same rows, except that rows tied with others may swap."""
    (rows, scores), (want_rows, want_scores) = got, want
    assert len(rows) == len(want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    for i in range(len(rows)):
        if rows[i] != want_rows[i]:
            tied = np.isclose(want_scores, want_scores[i], rtol=1e-6)
            assert rows[i] in set(want_rows[tied].tolist()), (i, rows, want_rows)


@pytest.fixture(scope="module")
def brute(one: list[Part], docs: pa.Table) -> BruteForce:
    return BruteForce(one[0].fts, docs["text"].to_pylist())


def test_split_into_16_files_gives_the_same_top_10(one: list[Part], sixteen: list[Part], queries: list[str]) -> None:
    assert len({round(p.total_tokens / p.num_docs) for p in sixteen}) > 5  # the files' avgdl differ
    for mode in ("any", "all"):
        identical = 0
        for q in queries:
            terms = one[0].fts.analyze(q)
            a, b = table_search(one, terms, mode=mode), table_search(sixteen, terms, mode=mode)
            identical += [r for r, _ in a] == [r for r, _ in b]
            assert len(a) == len(b)
            np.testing.assert_allclose([s for _, s in a], [s for _, s in b], rtol=1e-4)
        assert identical >= 0.95 * len(queries), (mode, identical)


def test_one_file_with_its_own_statistics_is_tantivys_bm25(one: list[Part], queries: list[str]) -> None:
    fts = one[0].fts
    for q in queries[:60]:
        terms = fts.analyze(q)
        got = search_global(fts, terms, 10, stats_of(one, terms))
        assert_same_top(got, fts.search(terms, 10))


@pytest.mark.parametrize(("n_factor", "token_factor"), [(1, 1.0), (3, 1.3), (2, 0.7), (50, 1.0)])
def test_exact_against_brute_force(
    one: list[Part], brute: BruteForce, queries: list[str], n_factor: int, token_factor: float
) -> None:
    """The file is part of a bigger corpus (N, avgdl and df differ from its own): still exact."""
    fts = one[0].fts
    for mode in ("any", "all"):
        for q in queries[::3]:
            terms = fts.analyze(q)
            own = brute.stats(terms)
            stats = CorpusStats(
                own.num_docs * n_factor,
                round(own.total_tokens * n_factor * token_factor),
                {t: df * n_factor + (n_factor > 1) for t, df in own.doc_freq.items()},
            )
            for k in (1, 10, 40):
                assert_same_top(search_global(fts, terms, k, stats, mode=mode), brute.top(terms, k, stats, mode))


def test_allow_bitmap(one: list[Part], brute: BruteForce, queries: list[str]) -> None:
    fts = one[0].fts
    rng = np.random.default_rng(7)
    n = fts.num_docs
    allows = [
        pyroaring.BitMap(np.flatnonzero(rng.random(n) < 0.5).tolist()),  # large: ranking read in prefixes
        pyroaring.BitMap(np.flatnonzero(rng.random(n) < 0.02).tolist()),  # small: a row filter in the query
        pyroaring.BitMap(range(n)),
        pyroaring.BitMap([5, 17, 400, 1399, 5000]),  # rows past the end are ignored
    ]
    for q in queries[:40]:
        terms = fts.analyze(q)
        stats = CorpusStats(n * 4, brute.lengths.sum() * 5, {t: 4 * d for t, d in brute.stats(terms).doc_freq.items()})
        for allow in allows:
            for mode in ("any", "all"):
                got = search_global(fts, terms, 10, stats, mode=mode, allow=allow)
                assert_same_top(got, brute.top(terms, 10, stats, mode, allow=set(allow)))
    assert search_global(fts, ["flow"], 10, brute.stats(["flow"]), allow=pyroaring.BitMap())[0].size == 0


def test_prefix_expansion_and_weights(one: list[Part], brute: BruteForce) -> None:
    """The table expands a prefix into many terms (and may weight them)."""
    fts = one[0].fts
    for prefix in ("aero", "pr", "con", "s"):
        terms = fts.prefix_terms(prefix)[:64]
        assert len(terms) > 3
        stats = brute.stats(terms)
        assert_same_top(search_global(fts, terms, 10, stats), brute.top(terms, 10, stats))
        weights = {t: 1 / (1 + i) for i, t in enumerate(terms)}
        got = search_global(fts, terms, 10, stats, weights=weights)
        assert_same_top(got, brute.top(terms, 10, stats, weights=weights))


def test_edge_cases(one: list[Part], brute: BruteForce) -> None:
    fts = one[0].fts
    stats = brute.stats(["flow", "wing", "zzzabsent"])
    assert search_global(fts, [], 10, stats)[0].size == 0
    assert search_global(fts, ["flow"], 0, stats)[0].size == 0
    assert search_global(fts, ["zzzabsent"], 10, stats)[0].size == 0
    assert search_global(fts, ["flow", "zzzabsent"], 10, stats, mode="all")[0].size == 0
    every = search_global(fts, ["flow", "flow"], 10**6, stats)  # duplicates count once; k beyond the matches
    assert_same_top(every, brute.top(["flow"], 10**6, stats))
    assert len(every[0]) == stats.doc_freq["flow"]
    # weight 0: in "all" the term still filters, in "any" it is dropped
    zero = {"wing": 0.0}
    assert_same_top(
        search_global(fts, ["flow", "wing"], 20, stats, mode="all", weights=zero),
        brute.top(["flow", "wing"], 20, stats, "all", weights=zero),
    )
    assert_same_top(search_global(fts, ["flow", "wing"], 20, stats, weights=zero), brute.top(["flow"], 20, stats))
    with pytest.raises(InvalidOptionError):
        search_global(fts, ["flow"], 10, CorpusStats(10, stats.total_tokens, stats.doc_freq))  # N below the file's
    with pytest.raises(InvalidOptionError):
        search_global(fts, ["flow"], 10, CorpusStats(stats.num_docs, stats.total_tokens, {}))  # df missing
    with pytest.raises(InvalidOptionError):
        search_global(fts, ["flow"], 10, stats, mode="some")
    with pytest.raises(InvalidOptionError):
        search_global(fts, ["flow"], 10, stats, weights={"flow": -1.0})


def test_ndcg_at_10(sixteen: list[Part], queries: list[str]) -> None:
    qrels = pq.read_table(DATA / "qrels.parquet").to_pylist()
    grades: dict[int, dict[int, int]] = {}
    for r in qrels:
        grades.setdefault(r["query_id"], {})[r["doc_id"] - 1] = r["grade"]
    total = 0.0
    for qid, q in enumerate(queries, start=1):
        rel = grades.get(qid, {})
        found = table_search(sixteen, sixteen[0].fts.analyze(q))
        dcg = sum(rel.get(row, 0) / math.log2(i + 2) for i, (row, _) in enumerate(found))
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(rel.values(), reverse=True)[:10]))
        total += dcg / ideal if ideal else 0.0
    assert total / len(queries) >= 0.35


def test_fieldnorms_and_token_totals_match_tantivy(tmp_path: Path) -> None:
    lengths = [0, 1, 2, 39, 40, 41, 42, 43, 55, 56, 57, 100, 129, 1000, 4097, 70_000, 3]
    texts = [" ".join(["w"] * n) if n else None for n in lengths]
    table = pa.table({"_id": pa.array(range(len(texts)), pa.uint64()), "t": pa.array(texts, pa.string())})
    built = build_superfile(table, SuperfileSpec(fts_columns={"t": "simple"}, vector_columns={}))
    fts = SuperfileReader.open(built.data, name="lengths", cache_dir=str(tmp_path)).fulltext("t")
    assert fts.fieldnorm_ids.tolist() == [fieldnorm_id(n) for n in lengths]
    assert fts.total_tokens == sum(lengths) == built.fts_stats["t"][1]
    assert [FIELDNORMS[fieldnorm_id(n)] for n in (40, 41, 43, 1000)] == [40, 40, 42, 984]
    query = tantivy.Query.term_query(fts.index.schema, fulltext.TEXT_FIELD, "w")
    for _, doc in fts.searcher.search(query, 100).hits:  # tantivy's own dl agrees
        row = int(fts.searcher.fast_field_values(fulltext.ROW_FIELD, [doc])[0] or 0)
        explained = fulltext._explanation_values(query.explain(fts.searcher, doc).to_json())
        assert explained["dl"] == FIELDNORMS[fieldnorm_id(lengths[row])]
    # huge tf (70,000, 4,097): float32 scores cannot tell tf apart there, the explanation fallback must
    stats = CorpusStats(1000, 500_000, {"w": 300})
    brute = BruteForce(fts, texts)
    assert_same_top(search_global(fts, ["w"], 20, stats), brute.top(["w"], 20, stats))
    texts2 = [f"{t} x y" if t else "x" for t in texts]
    table2 = pa.table({"_id": pa.array(range(len(texts2)), pa.uint64()), "t": pa.array(texts2, pa.string())})
    built2 = build_superfile(table2, SuperfileSpec(fts_columns={"t": "simple"}, vector_columns={}))
    fts2 = SuperfileReader.open(built2.data, name="lengths2", cache_dir=str(tmp_path)).fulltext("t")
    brute2 = BruteForce(fts2, texts2)
    stats2 = CorpusStats(1000, 500_000, {"w": 300, "x": 500, "y": 20})
    for mode in ("any", "all"):
        got = search_global(fts2, ["w", "x", "y"], 20, stats2, mode=mode)
        assert_same_top(got, brute2.top(["w", "x", "y"], 20, stats2, mode))


def test_several_segments_and_blobs_without_norms(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    words = np.array([f"w{i:x}" for i in range(100_000)])  # a large vocabulary fills tantivy's heap
    common = words[:300]  # and some frequent words, so tf > 1
    texts = [
        " ".join([*words[rng.integers(0, len(words), rng.integers(1, 90))], *common[rng.integers(0, 300, 30)]])
        for _ in range(2000)
    ]
    table = pa.table({"_id": pa.array(range(len(texts)), pa.uint64()), "t": texts})
    spec = SuperfileSpec(fts_columns={"t": "simple"}, vector_columns={})
    monkeypatch.setattr(fulltext, "_WRITER_HEAP", 15_000_000)  # tantivy's minimum: forces flushes
    built = build_superfile(table, spec)
    fts = SuperfileReader.open(built.data, name="segments", cache_dir=str(tmp_path)).fulltext("t")
    assert fts.searcher.num_segments > 1
    brute = BruteForce(fts, texts)
    assert fts.fieldnorm_ids.tolist() == [fieldnorm_id(n) for n in brute.lengths]
    # an index opened from its directory alone (as from a blob written before norms existed) decodes them
    directory = str(fts._directory)
    bare = FullTextIndex(tantivy.Index.open(directory), "simple", directory=directory)
    assert bare.fieldnorm_ids.tolist() == fts.fieldnorm_ids.tolist() and bare.total_tokens == fts.total_tokens
    for row in (0, 999, 1999):
        terms = texts[row].split()[:3]
        stats = CorpusStats(
            7000, int(brute.lengths.sum()) * 3, {t: d + 5 for t, d in brute.stats(terms).doc_freq.items()}
        )
        for index in (fts, bare):
            assert_same_top(search_global(index, terms, 10, stats), brute.top(terms, 10, stats))
