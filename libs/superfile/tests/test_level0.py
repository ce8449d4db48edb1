"""Level-0 superfiles (docs/maintenance.md, "Small writes: level 0"): a small append commits its rows without
the full-text and vector indexes, every search kind and SQL answers over them as over indexed superfiles (the
same ids, order and scores), deletes on them are deletion vectors, and ``optimize`` and the background
maintenance merge them into indexed superfiles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.errors import InvalidOptionError
from superfile.maintenance import CompactionPolicy, MaintenancePolicy
from superfile.table import Supertable
from superfile.table import evolve as evolve_module

WORDS = ["boundary", "layer", "supersonic", "flutter", "wing", "shock", "wave", "heat", "flow", "plate"]
DIM = 8
SCHEMA = pa.schema(
    [pa.field("key", pa.int32()), pa.field("title", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM), False)]
)


def _row(i: int) -> dict[str, Any]:
    """Row ``i``: the same whichever batch it comes in."""
    rng = np.random.default_rng(i)
    words = " ".join(rng.choice(WORDS, 3 + i % 5))
    return {"key": i, "title": f"{words} doc{i}", "vec": rng.normal(size=DIM).astype(np.float32).tolist()}


def _rows(start: int, count: int) -> list[dict[str, Any]]:
    return [_row(i) for i in range(start, start + count)]


@pytest.fixture
def db() -> Iterator[superfile.Connection]:
    conn = superfile.connect(f"memory://{uuid.uuid4().hex}")
    yield conn
    conn.close()


@pytest.fixture(autouse=True)
def no_background(monkeypatch: pytest.MonkeyPatch) -> None:
    """No index-creation rewrite runs behind a test's back (these tables create no index later anyway)."""
    monkeypatch.setattr(evolve_module, "index_in_background", lambda table: None)


def _table(db: superfile.Connection, name: str, metric: str, level0_max_rows: int) -> Supertable:
    return db.create_table(
        name,
        SCHEMA,
        fts_columns=["title"],
        vector_columns={"vec": {"dim": DIM, "metric": metric}},
        level0_max_rows=level0_max_rows,
    )


def _tables(db: superfile.Connection, metric: str) -> tuple[Supertable, Supertable, Supertable]:
    """The same rows and deletes in three tables: every superfile indexed (level 0 off), every superfile level 0,
    and a mix (a bulk load indexed, small appends level 0)."""
    indexed = _table(db, "indexed", metric, 0)
    level0 = _table(db, "level0", metric, 1000)
    mixed = _table(db, "mixed", metric, 30)
    for t in (indexed, level0, mixed):
        t.append(_rows(0, 60))  # mixed: over its limit, indexed
        t.append(_rows(60, 25))
        t.append(_rows(85, 25))
        t.delete("key = 7")  # deletion vectors: on an indexed and ...
        t.delete("key = 70 OR key = 99")  # ... on level-0 superfiles
    return indexed, level0, mixed


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.column("_id").to_pylist() == b.column("_id").to_pylist()
    assert a.column("score").to_pylist() == b.column("score").to_pylist()  # bit for bit


def _check_equal(db: superfile.Connection, indexed: Supertable, other: Supertable) -> None:
    for query in ("boundary layer", "flutter wing shock", "doc12", "doc71", "doc70", "heat", "nothing"):
        for mode in ("any", "all"):
            a = indexed.bm25_search("title", query, k=10, mode=mode)
            _same(a, other.bm25_search("title", query, k=10, mode=mode))
    _same(indexed.bm25_search_prefix("title", "fl", k=10), other.bm25_search_prefix("title", "fl", k=10))
    _same(indexed.bm25_search_prefix("title", "doc8", k=20), other.bm25_search_prefix("title", "doc8", k=20))
    for mode in ("and", "or"):
        a = indexed.token_match("title", ["boundary", "layer"], mode, projection=["key"])
        b = other.token_match("title", ["boundary", "layer"], mode, projection=["key"])
        assert a.column("key").to_pylist() == b.column("key").to_pylist() and len(a) > 0
    for i in (12, 71, 99):  # 99 is deleted
        value = _row(i)["title"]
        a = indexed.exact_match("title", value, projection=["key"]).column("key").to_pylist()
        assert other.exact_match("title", value, projection=["key"]).column("key").to_pylist() == a
        assert a == ([] if i == 99 else [i])
    for seed in (1, 2):
        q = np.random.default_rng(seed).normal(size=DIM).tolist()
        _same(indexed.vector_search("vec", q, k=10), other.vector_search("vec", q, k=10))
        _same(
            indexed.vector_search("vec", q, k=5, where="key >= 50"),
            other.vector_search("vec", q, k=5, where="key >= 50"),
        )
        flt = {"column": "title", "query": "flutter"}
        _same(indexed.vector_search("vec", q, k=5, filter=flt), other.vector_search("vec", q, k=5, filter=flt))
        _same(
            indexed.hybrid_search("title", "boundary flutter", "vec", q, k=8),
            other.hybrid_search("title", "boundary flutter", "vec", q, k=8),
        )
    v = ", ".join(str(x) for x in np.random.default_rng(3).normal(size=DIM).round(3))
    for sql in (
        "SELECT _id, key, score FROM bm25_search('{}', 'title', 'boundary layer', 7)",
        "SELECT _id, score FROM bm25_search_prefix('{}', 'title', 'sup', 6)",
        "SELECT _id FROM token_match('{}', 'title', 'shock wave', 'and') ORDER BY _id",
        "SELECT _id FROM token_match('{}', 'title', 'shock wave', 'or') ORDER BY _id",
        f"SELECT _id, score FROM vector_search('{{}}', 'vec', [{v}], 7)",
        f"SELECT _id, score FROM hybrid_search('{{}}', 'title', 'heat flow', 'vec', [{v}], 6)",
        "SELECT key, title FROM {} WHERE key BETWEEN 55 AND 90 AND title LIKE '%flow%' ORDER BY key",
        "SELECT count(*) AS n, sum(key) AS s FROM {} WHERE title LIKE '%wing%'",
    ):
        assert db.sql(sql.format(indexed.name)).to_pylist() == db.sql(sql.format(other.name)).to_pylist(), sql
    assert other.count_rows() == indexed.count_rows() == 107
    assert other.count_rows("key >= 60") == indexed.count_rows("key >= 60")
    key = other.to_arrow(columns=["key", "title", "vec"]).sort_by("key")
    assert key.equals(indexed.to_arrow(columns=["key", "title", "vec"]).sort_by("key"))


@pytest.mark.parametrize("metric", ["cosine", "l2", "dot"])
def test_level0_answers_as_the_indexed_path(db: superfile.Connection, metric: str) -> None:
    indexed, level0, mixed = _tables(db, metric)
    assert indexed.stats()["unindexed_superfiles"] == 0
    assert level0.stats()["unindexed_superfiles"] == 3
    assert mixed.stats()["unindexed_superfiles"] == 2
    _check_equal(db, indexed, level0)
    _check_equal(db, indexed, mixed)
    # compaction merges level 0 into indexed superfiles; the answers stay (all three compacted alike: a table
    # of one superfile without deletes is searched by the single-searcher union, which rounds otherwise)
    for t in (indexed, level0, mixed):
        done = t.optimize()
        assert done["superfiles_added"] == 1 and t.stats()["unindexed_superfiles"] == 0
    _check_equal(db, indexed, level0)
    _check_equal(db, indexed, mixed)


def _data_sections(t: Supertable) -> list[set[str]]:
    snap = t.snapshot()
    return [set(e.sections) for e in snap.entries()]


def test_a_small_append_builds_no_text_or_vector_index(db: superfile.Connection) -> None:
    t = _table(db, "t", "cosine", 50)
    t.append(_rows(0, 50))  # at the limit: level 0
    t.append(_rows(50, 51))  # over it: indexed
    entries = sorted(t.snapshot().entries(), key=lambda e: e.id_min)
    assert [("title" in e.text, "vec" in e.vectors) for e in entries] == [(False, False), (True, True)]
    small, big = (set(e.sections) for e in entries)
    assert not any(s.startswith(("fts/", "vec/")) for s in small)  # no tantivy or vector blob
    assert any(s.startswith("fts/") for s in big) and any(s.startswith("vec/") for s in big)
    assert any(s.startswith("idx/") for s in small)  # scalar indexes are still built
    assert t.stats()["unindexed_superfiles"] == 1
    off = _table(db, "off", "cosine", 0)
    off.append(_rows(0, 3))
    assert off.stats()["unindexed_superfiles"] == 0
    with pytest.raises(InvalidOptionError):
        _table(db, "bad", "cosine", -1)


def test_deletes_on_level0_rows_are_deletion_vectors(db: superfile.Connection) -> None:
    t = _table(db, "t", "cosine", 1000)
    t.append(_rows(0, 20))
    before = {e.path for e in t.snapshot().entries()}
    t.delete("key = 3 OR key = 4")
    t.update("key = 5", [{**_row(5), "title": "replaced flutter"}])
    entries = t.snapshot().entries()
    old = [e for e in entries if e.path in before]
    assert len(old) == 1 and old[0].deletes is not None and old[0].deletes.count == 3  # not rewritten
    assert t.count_rows() == 18
    assert t.bm25_search("title", "replaced", k=5, projection=["key"]).column("key").to_pylist() == [5]
    assert t.stats()["unindexed_superfiles"] == 2  # the update's replacement is a small write too


def test_level0_superfiles_survive_a_reopen(tmp_path: Any) -> None:
    uri = f"file://{tmp_path}"
    with superfile.connect(uri) as conn:
        t = _table(conn, "t", "l2", 1000)
        t.append(_rows(0, 30))
        t.append(_rows(30, 30))
        t.delete("key = 1")
        expected = t.bm25_search("title", "boundary layer", k=10)
        q = np.random.default_rng(5).normal(size=DIM).tolist()
        nearest = t.vector_search("vec", q, k=10)
    with superfile.connect(uri) as conn:  # a fresh connection: nothing cached
        t = conn.open_table("t")
        assert t.stats()["unindexed_superfiles"] == 2 and t.count_rows() == 59
        _same(t.bm25_search("title", "boundary layer", k=10), expected)
        _same(t.vector_search("vec", q, k=10), nearest)
        t.optimize()
        assert t.stats()["unindexed_superfiles"] == 0 and t.stats()["superfile_count"] == 1
        # one superfile without deletes: the single-searcher union answers, in its own float32 rounding
        after = t.bm25_search("title", "boundary layer", k=10)
        assert after.column("_id").to_pylist() == expected.column("_id").to_pylist()
        assert after.column("score").to_pylist() == pytest.approx(expected.column("score").to_pylist(), rel=1e-6)


def test_background_maintenance_merges_level0_into_indexed(tmp_path: Any) -> None:
    policy = MaintenancePolicy(CompactionPolicy(small_files=4), cleanup_interval_s=0)
    with superfile.connect(f"file://{tmp_path}", maintenance=policy) as conn:
        t = _table(conn, "t", "cosine", 1000)
        for i in range(6):
            t.append(_rows(10 * i, 10))
        assert conn.maintenance is not None and conn.maintenance.wait_idle(120)
        stats = t.stats()
        assert stats["superfile_count"] < 6 and stats["unindexed_superfiles"] < 6
        assert conn.maintenance.counts["compactions"] >= 1
        merged = [e for e in t.snapshot().entries() if e.rows > 10]
        assert merged and all("title" in e.text and "vec" in e.vectors for e in merged)
        assert t.count_rows() == 60
        assert t.exact_match("title", _row(42)["title"], projection=["key"]).column("key").to_pylist() == [42]
