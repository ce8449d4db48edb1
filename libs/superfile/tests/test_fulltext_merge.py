"""Merged segments of full-text unions (``format/fulltext_merge.py``): a union of many superfiles' segments is
merged in the background, and searches answer exactly as before (ids, order, scores), ties included."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
import tantivy
from superfile.format import fulltext_merge, fulltext_union
from superfile.format.fulltext import ID_FIELD, ROW_FIELD, TEXT_FIELD, analyzer_name, index_schema, make_analyzer
from superfile.format.fulltext_merge import MIN_SEGMENTS, plan
from superfile.table import search as search_module
from superfile.table.search import Searcher

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"
WAIT_S = 60.0


def test_plan_merges_a_level_of_similar_sizes_once_it_is_full() -> None:
    assert plan([15_625] * 16) == list(range(16))
    assert plan([15_625] * (MIN_SEGMENTS - 1)) == []
    # the big ones are a level of their own; the small ones (under 10,000 rows count as 10,000) are another
    sizes = [900_000, 1_000_000] + [50] * 3 + [9_000] * 5 + [3_000_000]
    assert sorted(plan(sizes)) == list(range(2, 10))
    assert plan([20_000_000] * 8) == []  # too big to merge again
    assert plan([0] * 8) == []


def _table(tmp_path: Path, rows: pa.Table, superfiles: int) -> superfile.Supertable:
    db = superfile.connect(f"memory://merge-{os.urandom(6).hex()}", cache_dir=str(tmp_path))
    t = db.create_table(
        "d",
        rows.schema,
        fts_columns=["text"],
        max_rows_per_superfile=-(-rows.num_rows // superfiles),
        min_rows_per_shard=rows.num_rows,
    )
    t.append(rows)
    assert t.stats()["superfile_count"] == superfiles
    return t


def _union_segments(t: superfile.Supertable) -> tuple[int, int]:
    """The current snapshot's BM25 union: its segments, and how many of them are merged ones."""
    united = Searcher(t.snapshot())._union("text")
    assert united is not None
    union = united[0]
    return union.searcher.num_segments, len(union.merged)


def _search(t: superfile.Supertable, asked: list[tuple[str, str, int]]) -> list[pa.Table]:
    return [t.bm25_search("text", q, k=k, mode=mode, projection=["_id", "score", "id"]) for q, mode, k in asked]


def test_a_merged_union_answers_as_the_segments_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cranfield in 16 superfiles: once merged, the union is one segment, and every answer (ids, order, scores)
    is the separate segments' and the per-superfile path's."""
    t = _table(tmp_path, pq.read_table(CRANFIELD / "docs.parquet").select(["id", "text"]), 16)
    queries = pq.read_table(CRANFIELD / "queries.parquet").column("text").to_pylist()[:40]
    asked = [(q, mode, k) for q in queries for mode, k in (("any", 10), ("any", 100), ("all", 5))]
    with monkeypatch.context() as m:
        m.setattr(fulltext_merge, "plan", lambda sizes: [])  # no merge: the union of 16 segments
        m.setattr(search_module, "_unions", search_module._NewestSnapshots())
        assert _union_segments(t) == (16, 0)
        apart = _search(t, asked)
        m.setattr(Searcher, "_union", lambda self, column: None)
        one_by_one = _search(t, asked)
    assert all(a.equals(b) for a, b in zip(apart, one_by_one, strict=True))
    _search(t, asked[:1])  # a union that schedules the merge
    assert fulltext_union.merges_done(WAIT_S)
    assert _union_segments(t) == (1, 1)
    merged = _search(t, asked)
    assert all(a.equals(b) for a, b in zip(apart, merged, strict=True))
    assert all(r.num_rows for r in merged[::3])


def test_a_merged_segment_locates_each_document_and_keeps_id_order(tmp_path: Path) -> None:
    """Appended rows merge into a segment in ``_id`` order (tantivy took its inputs in an order of its own), so
    the union breaks ties by document; each document's part and row name the row whose ``_id`` it holds."""
    t = _table(tmp_path, pq.read_table(CRANFIELD / "docs.parquet").select(["id", "text"]), 16)
    t.bm25_search("text", "boundary layer", k=10)
    assert fulltext_union.merges_done(WAIT_S)
    union, _, ids, starts = Searcher(t.snapshot())._union("text")  # type: ignore[misc]
    assert union.searcher.num_segments == 1 and union.ordered
    docs = [tantivy.DocAddress(0, d) for d in range(union.searcher.num_docs)]
    parts, rows = union._located(docs)
    held = np.asarray(union.searcher.fast_field_values(ID_FIELD, docs), np.uint64)
    assert np.array_equal(ids[starts[parts] + rows], held)
    assert np.array_equal(rows, union.searcher.fast_field_values(ROW_FIELD, docs))
    assert np.all(held[1:] > held[:-1]) and sorted(set(parts.tolist())) == list(range(16))


def _segment(path: Path, ids: list[int], *, with_ids: bool = True) -> fulltext_merge.Source:
    """A one-part source: an index whose document i is row i with this ``_id``."""
    path.mkdir()
    index = tantivy.Index(index_schema("english"), path=str(path))
    index.register_tokenizer(analyzer_name("english"), make_analyzer("english"))
    writer = index.writer(heap_size=20_000_000, num_threads=1)
    for row, id_ in enumerate(ids):
        writer.add_json(json.dumps({ROW_FIELD: row, TEXT_FIELD: "some text", **({ID_FIELD: id_} if with_ids else {})}))
    writer.commit()
    writer.wait_merging_threads()
    meta = json.loads((path / "meta.json").read_text())
    if not with_ids:  # as indexes written before the field was added
        meta["schema"] = [f for f in meta["schema"] if f["name"] != ID_FIELD]
        (path / "meta.json").write_text(json.dumps(meta))
    return fulltext_merge.Source(str(path), (meta["segments"][0]["segment_id"],), (len(ids),))


def test_a_merge_sorts_by_id_and_knows_where_each_document_came_from(tmp_path: Path) -> None:
    """Sources whose ``_id`` ranges interleave merge into ``_id`` order where each is in order, and not where one
    is not; every document's part and row are found either way. Sources without the field are not merged."""
    rng = np.random.default_rng(7)
    blocks = [list(range(i * 100, i * 100 + 30)) for i in rng.permutation(MIN_SEGMENTS).tolist()]
    blocks[2] = [b + 50 for b in blocks[1]]  # interleaved with another source's range, still ascending
    sources = [_segment(tmp_path / f"s{i}", b) for i, b in enumerate(blocks)]
    merged = fulltext_merge.merge(sources, str(tmp_path / "m"), "english")
    assert merged.ordered and merged.docs == 30 * MIN_SEGMENTS
    located = [blocks[p][r] for p, r in zip(merged.part.tolist(), merged.rows.tolist(), strict=True)]
    assert located == sorted(located)

    shuffled = [b[::-1] if i == 3 else b for i, b in enumerate(blocks)]  # one source out of _id order
    sources = [_segment(tmp_path / f"u{i}", b) for i, b in enumerate(shuffled)]
    merged = fulltext_merge.merge(sources, str(tmp_path / "n"), "english")
    assert not merged.ordered
    searcher = tantivy.Index.open(str(tmp_path / "n")).searcher()
    held = searcher.fast_field_values(ID_FIELD, [tantivy.DocAddress(0, d) for d in range(merged.docs)])
    assert [shuffled[p][r] for p, r in zip(merged.part.tolist(), merged.rows.tolist(), strict=True)] == held

    old = [_segment(tmp_path / f"o{i}", b, with_ids=i > 0) for i, b in enumerate(blocks)]
    with pytest.raises(ValueError, match="no _id"):
        fulltext_merge.merge(old, str(tmp_path / "o"), "english")


def test_ties_across_superfiles_break_by_id_after_a_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of equal text in every superfile score alike: the union returns the lowest ``_id``\\ s among the rows
    tied with the k-th, from a merged segment in ``_id`` order and from one whose union is told it is not
    (then it fetches the ties past k)."""
    words = ["alpha", "beta", "gamma", "delta", "alpha beta", "gamma delta", "alpha gamma", "beta"]
    texts = [words[i % len(words)] + (" filler" * (i % 3)) for i in range(960)]
    t = _table(tmp_path, pa.table({"id": list(range(960)), "text": texts}), 12)
    asked = [(q, mode, k) for q in ("alpha", "beta gamma", "delta filler") for mode in ("any", "all") for k in (3, 25)]
    with monkeypatch.context() as m:
        m.setattr(Searcher, "_union", lambda self, column: None)
        one_by_one = _search(t, asked)
    _search(t, asked[:1])
    assert fulltext_union.merges_done(WAIT_S)
    assert _union_segments(t) == (1, 1)
    merged = _search(t, asked)
    assert all(a.equals(b) for a, b in zip(one_by_one, merged, strict=True))
    with monkeypatch.context() as m:
        m.setattr(Searcher, "_ordered", lambda self, entries: False)
        m.setattr(search_module, "_unions", search_module._NewestSnapshots())
        assert not Searcher(t.snapshot())._union("text")[0].ordered  # type: ignore[index]
        unordered = _search(t, asked)
    assert all(a.equals(b) for a, b in zip(one_by_one, unordered, strict=True))


def test_superfiles_of_equal_norms_merge(tmp_path: Path) -> None:
    """Superfiles whose rows all have one length, of equal text or not, merge (a merged document is located by
    its ``_id``, not by its norms), and answers are right."""
    same = pa.table({"id": list(range(8 * 50)), "text": ["one two three"] * (8 * 50)})
    t = _table(tmp_path / "same", same, 8)
    expected = t.bm25_search("text", "two", k=30, projection=["_id", "score"])
    assert fulltext_union.merges_done(WAIT_S)
    assert _union_segments(t) == (1, 1)
    assert t.bm25_search("text", "two", k=30, projection=["_id", "score"]).equals(expected)

    texts = [f"word{i // 50} other{i // 50} more{i // 50}" for i in range(8 * 50)]  # equal lengths, other words
    t = _table(tmp_path / "apart", pa.table({"id": list(range(8 * 50)), "text": texts}), 8)
    assert t.bm25_search("text", "word3", k=60, projection=["id"])["id"].to_pylist() == list(range(150, 200))
    assert fulltext_union.merges_done(WAIT_S)
    assert _union_segments(t) == (1, 1)
    assert t.bm25_search("text", "word5 more5", k=60, projection=["id"])["id"].to_pylist() == list(range(250, 300))


def test_merged_segments_no_union_lists_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an optimize replaces the merged superfiles, the merged segment goes once later unions have not
    listed it for a while, in builds and in seconds (an open searcher keeps its mapped files)."""
    monkeypatch.setattr(fulltext_merge, "_GRACE", 1)
    t = _table(tmp_path, pq.read_table(CRANFIELD / "docs.parquet").select(["id", "text"]), 8)
    before = t.bm25_search("text", "boundary layer", k=10, projection=["id"])["id"].to_pylist()
    assert fulltext_union.merges_done(WAIT_S)
    mine = f"pool-{fulltext_union._HOST}-{os.getpid()}-"
    merged_dir = next(p for p in (tmp_path / "unions").iterdir() if p.name.startswith(mine) and p.is_dir()) / "merged"
    assert _union_segments(t) == (1, 1) and len(list(merged_dir.iterdir())) == 1
    assert t.optimize(target_rows=10_000)["superfiles_removed"] == 8
    for i in range(3):  # new snapshots: unions that list the optimized superfile, not the merged segment
        t.append([{"id": 10_000 + i, "text": f"appended row {i}"}])
        assert t.bm25_search("text", "boundary layer", k=10, projection=["id"])["id"].to_pylist() == before
    assert len(list(merged_dir.iterdir())) == 1  # unused for 3 builds, but not yet for _GRACE_S seconds
    monkeypatch.setattr(fulltext_merge, "_GRACE_S", 0.0)
    t.append([{"id": 10_003, "text": "appended row 3"}])
    assert t.bm25_search("text", "boundary layer", k=10, projection=["id"])["id"].to_pylist() == before
    assert not list(merged_dir.iterdir())
