"""A leaf's BM25 with the root's table-wide statistics: one union search over its share's superfiles without
deletes (``UnionText``), the rest one by one, gives exactly the per-superfile path's hits (ids, order, scores),
and the leaves' merged answers are the embedded search's, to the bit. A leaf searches its share's superfiles
without deletes as one union padded to score with the table's statistics (``format/fulltext_pads.py``): the
same answers again, without rescoring (its superfiles with deletes are still rescored)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from superfile.search.leaf import LeafRequest, run
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot, open_readers, set_open_budget

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"
COLUMN = "text"
ROWS_PER_SUPERFILE = 100


@pytest.fixture(scope="module")
def snapshots() -> tuple[Snapshot, Snapshot]:
    """Cranfield in 14 superfiles, repeated once (so rows tie), before and after deleting rows of 3 of them."""
    docs = pq.read_table(CRANFIELD / "docs.parquet").select(["id", "title", "text"])
    docs = pa.concat_tables([docs, docs.slice(0, 300)])
    db = superfile.connect(f"memory://leaf-bm25-{os.urandom(6).hex()}")
    t = db.create_table("docs", docs.schema, fts_columns=["title", "text"])
    for start in range(0, docs.num_rows, ROWS_PER_SUPERFILE):
        t.append(docs.slice(start, ROWS_PER_SUPERFILE))
    before = t.snapshot()
    t.delete("id <= 300 AND id % 3 = 0")
    after = t.snapshot()
    assert sum(e.deletes is not None for e in after.entries()) == 6  # the rows 1-300 are in two copies
    return before, after


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [str(q) for q in pq.read_table(CRANFIELD / "queries.parquet")["text"].to_pylist()]


def _leaf(snap: Snapshot, share: list[str], terms: list[str], k: int, mode: str) -> pa.Table:
    root = Searcher(snap)
    df, deleted_tokens = root.term_stats(COLUMN, terms)
    corpus = root.corpus_of(COLUMN, terms, df, deleted_tokens)
    args = {
        "column": COLUMN,
        "terms": terms,
        "k": k,
        "mode": mode,
        "projection": ["id"],
        "num_docs": corpus.num_docs,
        "total_tokens": corpus.total_tokens,
        "df": df,
    }
    answer = run(snap, LeafRequest("docs", snap.path, tuple(share), "bm25", args))
    assert isinstance(answer, pa.Table)
    return answer


def _per_superfile(monkeypatch: pytest.MonkeyPatch, *args: object) -> pa.Table:
    with monkeypatch.context() as m:
        m.setattr(Searcher, "_exact_union", lambda self, column: None)
        m.setattr(Searcher, "_padded_top", lambda self, *a: None)
        return _leaf(*args)  # type: ignore[arg-type]


def _rescored(monkeypatch: pytest.MonkeyPatch, *args: object) -> pa.Table:
    """The leaf without padding: its superfiles without deletes in one union, ranked and rescored."""
    with monkeypatch.context() as m:
        m.setattr(Searcher, "_padded_top", lambda self, *a: None)
        return _leaf(*args)  # type: ignore[arg-type]


def _ranked(tables: list[pa.Table], k: int) -> pa.Table:
    """The root's merge: best score first, ties by ``_id``, cut to ``k``."""
    merged = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    return merged.sort_by([("score", "descending"), ("_id", "ascending")]).slice(0, k)


def _same(a: pa.Table, b: pa.Table, exact: bool) -> None:
    assert a.column("_id").to_pylist() == b.column("_id").to_pylist()
    assert a.column("id").to_pylist() == b.column("id").to_pylist()
    sa, sb = a.column("score").to_pylist(), b.column("score").to_pylist()
    assert sa == sb if exact else sa == pytest.approx(sb, rel=1e-6)


def _cases(snap: Snapshot, queries: list[str], seed: int) -> Iterator[tuple[list[str], str, int, list[list[str]]]]:
    """40 random searches (terms, mode, k) of the snapshot, each with a random split into three shares."""
    paths = [e.path for e in snap.entries()]
    rng = random.Random(seed)
    searcher = Searcher(snap)
    for i, text in enumerate(rng.sample(queries, 40)):
        terms = list(dict.fromkeys(searcher._analyze(COLUMN, text)))
        mode = "all" if i % 4 == 3 else "any"
        if mode == "all":
            terms = terms[:2]
        k = rng.choice([1, 10, 37])
        shuffled = rng.sample(paths, len(paths))
        cuts = sorted(rng.sample(range(1, len(paths)), 2))
        yield terms, mode, k, [shuffled[: cuts[0]], shuffled[cuts[0] : cuts[1]], shuffled[cuts[1] :]]


@pytest.mark.parametrize("which", ["before deletes", "after deletes"])
def test_leaf_union_is_the_per_superfile_path_and_the_leaves_are_embedded(
    snapshots: tuple[Snapshot, Snapshot], queries: list[str], which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = snapshots[0] if which == "before deletes" else snapshots[1]
    united = 0
    for terms, mode, k, shares in _cases(snap, queries, 16):
        leaves = []
        for share in shares:
            got = _leaf(snap, share, terms, k, mode)
            _same(got, _per_superfile(monkeypatch, snap, share, terms, k, mode), exact=True)
            united += Searcher(snap.restricted(share), None)._exact_union(COLUMN) is not None
            leaves.append(got)
        embedded = Searcher(snap).bm25(COLUMN, terms, k, mode, ["id"])
        _same(_ranked(leaves, k), embedded, exact=True)  # rescoring computes tantivy's float32 scores
    assert united > 40  # most shares have two or more superfiles without deletes: the union was searched


def test_a_share_past_the_open_file_budget_is_searched_one_by_one(
    snapshots: tuple[Snapshot, Snapshot], queries: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = snapshots[0]
    share = [e.path for e in snap.entries()][2:9]
    limits = open_readers().limits
    set_open_budget(limits[0], 8)  # fewer files than one superfile's segment maps
    try:
        assert Searcher(snap.restricted(share))._exact_union(COLUMN) is None
        for text in queries[:10]:
            terms = list(dict.fromkeys(Searcher(snap)._analyze(COLUMN, text)))
            got = _leaf(snap, share, terms, 10, "any")
            _same(got, _per_superfile(monkeypatch, snap, share, terms, 10, "any"), exact=True)
    finally:
        set_open_budget(*limits)


def test_union_rows_split_back_into_their_superfiles(snapshots: tuple[Snapshot, Snapshot]) -> None:
    snap = snapshots[0]
    share = snap.restricted([e.path for e in snap.entries()][:4])
    united = Searcher(share)._exact_union(COLUMN)
    assert united is not None
    union, members = united
    sizes = [e.rows for e in members]
    rows = np.asarray([0, sizes[0] - 1, sizes[0], sum(sizes) - 1], np.int64)
    part, offsets = union.split(rows)
    assert part.tolist() == [0, 0, 1, len(sizes) - 1]
    assert offsets.tolist() == [0, sizes[0] - 1, 0, sizes[-1] - 1]


def _padded_pass(snap: Snapshot, queries: list[str], seed: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Searches of random three-way shares: each leaf's answer is the leaf's without padding, and the merged
    answer the embedded one, to the bit. Returns (leaf calls answered padded, leaf calls)."""
    padded = calls = 0
    for terms, mode, k, shares in _cases(snap, queries, seed):
        leaves = []
        for share in shares:
            got = _leaf(snap, share, terms, k, mode)
            _same(got, _rescored(monkeypatch, snap, share, terms, k, mode), exact=True)
            leaves.append(got)
            calls += 1
            padded += _was_padded(snap, share, terms, k, mode)
        _same(_ranked(leaves, k), Searcher(snap).bm25(COLUMN, terms, k, mode, ["id"]), exact=True)
    return padded, calls


def _was_padded(snap: Snapshot, share: list[str], terms: list[str], k: int, mode: str) -> bool:
    root = Searcher(snap)
    corpus = root.corpus_of(COLUMN, terms, *root.term_stats(COLUMN, terms))
    return Searcher(snap.restricted(share), corpus)._padded_top(COLUMN, terms, k, mode) is not None


@pytest.mark.parametrize("which", ["before deletes", "after deletes"])
def test_padded_leaves_score_as_the_table_s_union(
    snapshots: tuple[Snapshot, Snapshot], queries: list[str], which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before deletes the embedded search is one tantivy search over every superfile; after them, its
    per-superfile path, rescored: either way the leaves' answers are its answers, to the bit."""
    from superfile.format import fulltext_pads

    snap = snapshots[0] if which == "before deletes" else snapshots[1]
    _padded_pass(snap, queries, 20, monkeypatch)  # the padding segments are built in the background meanwhile
    deadline = time.monotonic() + 60
    while fulltext_pads._building and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fulltext_pads._building, "padding segments still being built after 60 s"
    padded, calls = _padded_pass(snap, queries, 20, monkeypatch)  # the same searches: their paddings are built
    assert padded >= 0.8 * calls, f"{padded} of {calls} leaf calls padded"


def test_a_leaf_rescores_its_superfiles_with_deletes(snapshots: tuple[Snapshot, Snapshot], queries: list[str]) -> None:
    snap = snapshots[1]
    with_deletes = [e.path for e in snap.entries() if e.deletes is not None]
    terms = list(dict.fromkeys(Searcher(snap)._analyze(COLUMN, queries[0])))
    assert not _was_padded(snap, with_deletes, terms, 10, "any")


def test_padding_removed_from_the_cache_directory_is_built_again(
    snapshots: tuple[Snapshot, Snapshot], queries: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever clears the cache directory may remove the padding segments under a running node: its searches
    rescore (the same answers) while they are built again, then are padded again."""
    import shutil

    from superfile.format import fulltext_pads
    from superfile.format.fulltext_union import unions_dir
    from superfile.table import search

    snap = snapshots[0]
    _padded_pass(snap, queries, 22, monkeypatch)
    shutil.rmtree(os.path.join(unions_dir(snap.files.cache_dir), "pads"))
    monkeypatch.setattr(search, "_padded_unions", search._NewestSnapshots(keep=4))  # the next version's unions
    _padded_pass(snap, queries, 22, monkeypatch)  # rescored meanwhile, answers unchanged
    deadline = time.monotonic() + 60
    while fulltext_pads._building and time.monotonic() < deadline:
        time.sleep(0.05)
    padded, calls = _padded_pass(snap, queries, 22, monkeypatch)
    assert padded >= 0.8 * calls, f"{padded} of {calls} leaf calls padded after the padding was built again"


def test_a_share_of_many_superfiles_is_searched_merged(
    snapshots: tuple[Snapshot, Snapshot], queries: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share of 12 superfiles: its padded union has their segments merged in the background, then lists the
    merged segment beside its paddings, and the leaf's answers stay those of the union without padding."""
    from superfile.format import fulltext_pads, fulltext_union

    snap = snapshots[0]
    share = [e.path for e in snap.entries()][:12]
    searcher = Searcher(snap)
    asked = [(list(dict.fromkeys(searcher._analyze(COLUMN, q))), "any", k) for q in queries[:25] for k in (1, 10)]
    expected = [_rescored(monkeypatch, snap, share, terms, k, mode) for terms, mode, k in asked]
    for _ in range(2):  # the paddings are built (answered rescored meanwhile), then their unions merge
        for terms, mode, k in asked:
            _leaf(snap, share, terms, k, mode)
        deadline = time.monotonic() + 60
        while fulltext_pads._building and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fulltext_union.merges_done(60)
    got = [_leaf(snap, share, terms, k, mode) for terms, mode, k in asked]
    for a, b in zip(got, expected, strict=True):
        _same(a, b, exact=True)
    root = Searcher(snap)
    terms = asked[0][0]
    corpus = root.corpus_of(COLUMN, terms, *root.term_stats(COLUMN, terms))
    padded = Searcher(snap.restricted(share), corpus)._padded_union(COLUMN)
    assert padded is not None
    built = [u for u in padded[0]._unions.values() if u is not None]
    assert built and all(u.merged and sum(p != -1 for p in u.part_of) < len(share) for u in built)  # -1: paddings
