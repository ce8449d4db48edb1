"""Schema evolution in the engine (docs/schema.md): what is stored where, what a change rewrites (nothing but
the manifest list), writes racing schema changes, and searches over superfiles written before an index,
which must answer as the index does.

The shared API suite (tests/e2e/test_api.py) runs the user-facing behaviour on every side; this file checks
the storage mapping and the concurrency underneath, with the background index build turned off where a test
needs superfiles without the index.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.commit.requirements import AssertSchemaId
from superfile.errors import InvalidVectorError, SchemaChangeError, SchemaMismatchError, UnknownColumnError
from superfile.evolution import (
    field_id,
    former_names,
    identified,
    next_schema,
    physical_names,
    schema_id,
    widens,
)
from superfile.expressions import parse_predicate
from superfile.table import Supertable
from superfile.table import evolve as evolve_module

WORDS = ["boundary", "layer", "supersonic", "flutter", "wing", "shock", "wave", "heat", "flow", "plate"]
DIM = 8


def _row(i: int) -> dict[str, Any]:
    """Row ``i``: the same whichever batch it comes in."""
    rng = np.random.default_rng(i)
    words = " ".join(rng.choice(WORDS, 3 + i % 5))
    return {"key": i, "title": f"{words} doc{i}", "vec": rng.normal(size=DIM).astype(np.float32).tolist()}


def _rows(start: int, count: int) -> list[dict[str, Any]]:
    return [_row(i) for i in range(start, start + count)]


SCHEMA = pa.schema(
    [pa.field("key", pa.int32()), pa.field("title", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM), False)]
)


@pytest.fixture
def db() -> Iterator[superfile.Connection]:
    conn = superfile.connect(f"memory://{uuid.uuid4().hex}")
    yield conn
    conn.close()


@pytest.fixture(autouse=True)
def settled() -> Iterator[None]:
    """No index build of a test outlives it (its commits would land in the next test's tables' history)."""
    yield
    deadline = time.monotonic() + 60
    while evolve_module._running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not evolve_module._running


@pytest.fixture
def no_background(monkeypatch: pytest.MonkeyPatch) -> None:
    """Superfiles written before an index keep lacking it until the test rewrites them."""
    monkeypatch.setattr(evolve_module, "index_in_background", lambda table: None)


def _data_files(t: Supertable) -> set[str]:
    return {p for p in t.files.storage.list("data/")}


def _raw_entries(t: Supertable) -> list[dict[str, Any]]:
    """The part entries as stored (JSON), not as a schema reads them."""
    out = []
    for ref in t.snapshot().manifest.parts:
        raw = pa.CompressedInputStream(pa.BufferReader(t.files.storage.read(ref.path)), "zstd").read()
        out.extend(json.loads(raw)["entries"])
    return out


# -- the rules ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        (pa.int8(), pa.int16(), True),
        (pa.int16(), pa.int64(), True),
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.uint8(), pa.int16(), True),
        (pa.uint32(), pa.int64(), True),
        (pa.uint32(), pa.int32(), False),
        (pa.int32(), pa.uint64(), False),
        (pa.int32(), pa.float64(), True),
        (pa.uint32(), pa.float64(), True),
        (pa.int64(), pa.float64(), False),  # 2**53 + 1 has no float64
        (pa.int16(), pa.float32(), True),
        (pa.int32(), pa.float32(), False),
        (pa.float32(), pa.float64(), True),
        (pa.float64(), pa.float32(), False),
        (pa.string(), pa.large_string(), True),
        (pa.large_string(), pa.string(), False),
        (pa.binary(), pa.large_binary(), True),
        (pa.decimal128(10, 2), pa.decimal128(12, 2), True),
        (pa.decimal128(10, 2), pa.decimal128(12, 3), False),
        (pa.string(), pa.int64(), False),
        (pa.timestamp("ms"), pa.timestamp("us"), False),
        (pa.int32(), pa.int32(), False),
    ],
)
def test_widening_rules(src: pa.DataType, dst: pa.DataType, ok: bool) -> None:
    assert widens(src, dst) is ok


def test_field_ids_and_the_schemas_a_table_had() -> None:
    legacy = pa.schema([pa.field("_id", pa.uint64(), False), pa.field("a", pa.int32()), pa.field("b", pa.string())])
    s0 = identified(legacy)  # a table from before field ids: by position, as its superfiles were written
    assert [field_id(f) for f in s0] == [0, 1, 2] and schema_id(s0) == 0
    s1 = next_schema(s0, [s0.field("_id"), s0.field("a").with_name("renamed"), pa.field("b", pa.int64())])
    assert schema_id(s1) == 1 and [field_id(f) for f in s1] == [0, 1, 3]  # a new "b": a new id, never 2 again
    assert physical_names(s1, 0) == {"_id": "_id", "renamed": "a"}  # files of schema 0: the old b is not the new
    assert physical_names(s1, 1) == {"_id": "_id", "renamed": "renamed", "b": "b"}
    assert former_names(s1) == {"a": "renamed"}  # "b" is a name of the current schema
    s2 = next_schema(s1, [s1.field("_id"), s1.field("b")])
    assert former_names(s2) == {"a": None, "renamed": None}  # dropped
    assert physical_names(s2, 0) == {"_id": "_id"}
    with pytest.raises(SchemaMismatchError):
        physical_names(s2, 5)


# -- what a change stores -------------------------------------------------------------------------------------
def test_changes_are_metadata_only_and_older_versions_read_their_own_schema(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA, fts_columns=["title"])
    t.append(_rows(0, 10))
    t.append(_rows(10, 10))
    v2 = t.version
    files, parts = _data_files(t), [p.path for p in t.snapshot().manifest.parts]
    t.rename_column("title", "headline")
    t.add_columns([pa.field("n", pa.int64(), nullable=False)], defaults={"n": 4})
    t.alter_column_type("key", pa.int64())
    t.drop_columns("vec")
    assert _data_files(t) == files and [p.path for p in t.snapshot().manifest.parts] == parts  # nothing rewritten
    assert [h["operation"] for h in t.versions()][-4:] == [
        "rename_column",
        "add_columns",
        "alter_column_type",
        "drop_columns",
    ]
    raw = _raw_entries(t)
    assert {e.get("schema_id", 0) for e in raw} == {0}
    assert all("title" in e["stats"] and "title" in e["text"] and "headline" not in e["stats"] for e in raw)
    entries = t.snapshot().entries()  # read under the current schema: current names, by field id
    assert all("headline" in e.stats and "headline" in e.text and e.fts_tokens.get("headline") for e in entries)
    assert all("vec" not in e.stats for e in entries)
    meta = t.schema.metadata
    assert schema_id(t.schema) == 4 and json.loads(meta[b"superfile.schemas"])["0"] == {
        "1": "key",
        "2": "title",
        "3": "vec",
    }
    rows = t.to_arrow().sort_by("key")
    assert rows.column_names == ["_id", "key", "headline", "n"] and rows.schema.field("key").type == pa.int64()
    assert rows.column("n").to_pylist() == [4] * 20 and rows.schema.field("key").metadata is None  # results: plain
    old = t.checkout(v2)
    assert old.schema.names == ["_id", "key", "title", "vec"] and old.to_arrow().num_rows == 20
    assert old.schema.field("key").type == pa.int32() and "title" in old.snapshot().entries()[0].stats
    assert t.bm25_search("headline", "flutter", k=3).num_rows == old.bm25_search("title", "flutter", k=3).num_rows
    # pruning reads the renamed column's statistics
    pred = parse_predicate("headline = 'nothing like it'", t.schema)
    assert t.snapshot().entries(pred) == []
    # a write under the current schema: a superfile of the new schema, its own names
    t.append([{"key": 99, "headline": "last flutter"}])
    assert max(e.get("schema_id", 0) for e in _raw_entries(t)) == 4
    assert t.to_arrow(where="key = 99").to_pylist() == [{"_id": 20, "key": 99, "headline": "last flutter", "n": 4}]
    # optimize rewrites under the current schema: the dropped column's bytes go
    t.optimize()
    snap = t.snapshot()
    assert {e.schema_id for e in snap.entries()} == {4}
    assert snap.open(snap.entries()[0]).reader.columns == ["_id", "key", "headline", "n"]
    assert t.checkout(v2).to_arrow(columns=["vec"]).num_rows == 20  # the old version's files are still there


def test_a_name_dropped_and_added_again_is_a_new_column(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA)
    t.append(_rows(0, 5))
    t.drop_columns("title")
    t.add_columns([pa.field("title", pa.int64())])
    assert t.to_arrow(columns=["title"]).column("title").null_count == 5  # not the old strings
    assert t.count_rows("title IS NULL") == 5
    assert all("title" not in e.stats for e in t.snapshot().entries())  # nor their statistics


def test_defaults_for_rows_and_for_writes_that_leave_the_column_out(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA)
    t.append(_rows(0, 3))
    t.add_columns(
        [pa.field("n", pa.int16(), nullable=False), pa.field("ts", pa.timestamp("ms", "UTC"))],
        defaults={"n": 3, "ts": 1_700_000_000_000},
    )
    t.alter_column_type("n", pa.int64())  # a widened default
    t.append([{"key": 3, "title": "a", "vec": [1.0] * DIM}])  # a list of dicts without n or ts
    t.append(pa.table({"key": pa.array([4], pa.int32()), "title": ["b"], "vec": [[1.0] * DIM], "n": [9]}))
    rows = t.to_arrow(columns=["key", "n", "ts"]).sort_by("key").to_pylist()
    assert [r["n"] for r in rows] == [3, 3, 3, 3, 9] and rows[0]["ts"] == rows[4]["ts"] is not None
    assert t.count_rows("n = 3") == 4 and t.count_rows("n > 3") == 1
    with pytest.raises(SchemaMismatchError):
        t.append([{"key": 5, "title": "c", "vec": [1.0] * DIM, "n": None}])  # not null: an explicit null is refused


# -- writes racing schema changes -----------------------------------------------------------------------------
def test_an_append_staged_under_the_old_schema_publishes_over_the_new(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA, fts_columns=["title"])
    t.append(_rows(0, 4))
    staged = db.open_table("t").transaction()
    staged.append(_rows(4, 4))
    staged.flush()  # its superfile is written under schema 0
    t.rename_column("title", "headline")
    t.add_columns([pa.field("n", pa.int64(), nullable=False)], defaults={"n": 1})
    t.drop_columns("vec")
    t.alter_column_type("key", pa.int64())
    staged.commit()
    assert sorted(t.to_arrow(columns=["key"]).column("key").to_pylist()) == list(range(8))
    assert t.to_arrow(columns=["n"]).column("n").to_pylist() == [1] * 8
    assert t.count_rows("headline = 'nothing'") == 0 and t.count_rows("key >= 4") == 4
    found = t.bm25_search("headline", "doc5", k=3, projection=["key"])
    assert found.column("key").to_pylist() == [5]
    assert {e.schema_id for e in t.snapshot().entries()} == {0}
    assert all("headline" in e.stats for e in t.snapshot().entries())  # re-keyed at publish, by field id


def test_a_transaction_moves_up_to_a_schema_change_its_rows_need(db: superfile.Connection) -> None:
    """What a log consumer meets: rows checked against a schema newer than its transaction's, and rows
    checked against an older one (renamed and dropped columns), in one transaction."""
    t = db.create_table("t", SCHEMA)
    t.append(_rows(0, 2))
    tx = db.open_table("t").transaction()
    tx.append(_rows(2, 2))  # buffered under schema 0
    t.rename_column("title", "headline")
    t.add_columns([pa.field("n", pa.int64())])
    t.drop_columns("vec")
    tx.append([{"key": 4, "headline": "new", "n": 7}])  # fits only the latest schema: the transaction moves up
    tx.append(pa.table({"key": pa.array([5], pa.int32()), "title": ["old"], "vec": [[0.5] * DIM]}))  # the old names
    tx.delete("n = 7")
    tx.append([{"key": 6, "headline": "kept", "n": 8}])
    tx.commit()
    rows = t.to_arrow(columns=["key", "headline", "n"]).sort_by("key").to_pylist()
    assert [(r["key"], r["headline"], r["n"]) for r in rows] == [
        *[(r["key"], r["title"], None) for r in _rows(0, 4)],
        (5, "old", None),
        (6, "kept", 8),
    ]
    with pytest.raises(SchemaMismatchError):
        t.append(pa.table({"nope": [1]}))  # a name no schema had is still refused


def test_concurrent_schema_changes_are_planned_again(db: superfile.Connection) -> None:
    t, other = db.create_table("t", SCHEMA), db.open_table("t")
    raced: list[int] = []

    def racing(column: str) -> Any:
        plan = evolve_module.add_columns([pa.field(column, pa.int64())])

        def first_loses(schema: pa.Schema, options: Any) -> Any:
            if not raced:  # planned on this schema, but another change lands before the commit
                raced.append(other.add_columns([pa.field("x", pa.int64())]))
            return plan(schema, options)

        return first_loses

    v = evolve_module.evolve(t, "add_columns", racing("y"))  # planned again on the schema with x
    assert t.schema.names[-2:] == ["x", "y"] and v == raced[0] + 1
    raced.clear()
    with pytest.raises(SchemaChangeError, match="already exists"):
        evolve_module.evolve(t, "add_columns", racing("x"))
    assert schema_id(t.schema) == 2


def test_requirement_names_the_schema(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA)
    AssertSchemaId(0).check(t.snapshot().manifest)
    t.add_columns([pa.field("n", pa.int64())])
    with pytest.raises(Exception, match="schema 0 required"):
        AssertSchemaId(0).check(t.snapshot().manifest)


# -- searches over superfiles written before an index ---------------------------------------------------------
def _pair(db: superfile.Connection, metric: str) -> tuple[Supertable, Supertable]:
    """The same rows in two tables: one indexed from the start, one indexed after its superfiles were written."""
    indexed = db.create_table(
        "indexed", SCHEMA, fts_columns=["title"], vector_columns={"vec": {"dim": DIM, "metric": metric}}
    )
    later = db.create_table("later", SCHEMA)
    for t in (indexed, later):
        t.append(_rows(0, 40))
        t.append(_rows(40, 40))
    later.create_fts_index("title")
    later.create_vector_index("vec", metric=metric)
    for t in (indexed, later):  # one more superfile, written with the index in both
        t.append(_rows(80, 40))
        t.delete("key = 7")  # deletion vectors: the indexed table takes the per-superfile path too
    return indexed, later


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.column("_id").to_pylist() == b.column("_id").to_pylist()
    assert a.column("score").to_pylist() == b.column("score").to_pylist()  # bit for bit


@pytest.mark.parametrize("metric", ["cosine", "l2", "dot"])
def test_searches_without_the_index_answer_as_the_index(
    db: superfile.Connection, no_background: None, metric: str
) -> None:
    indexed, later = _pair(db, metric)
    assert later.stats()["unindexed_superfiles"] == 2 and indexed.stats()["unindexed_superfiles"] == 0
    for query in ("boundary layer", "flutter wing shock", "doc12", "heat"):
        for mode in ("any", "all"):
            _same(
                indexed.bm25_search("title", query, k=10, mode=mode), later.bm25_search("title", query, k=10, mode=mode)
            )
    _same(indexed.bm25_search_prefix("title", "fl", k=10), later.bm25_search_prefix("title", "fl", k=10))
    for kind in ("and", "or"):
        a = indexed.token_match("title", ["boundary", "layer"], kind, projection=["key"])
        b = later.token_match("title", ["boundary", "layer"], kind, projection=["key"])
        assert a.column("key").to_pylist() == b.column("key").to_pylist() and len(a) > 0
    value = _row(12)["title"]
    assert later.exact_match("title", value, projection=["key"]).column("key").to_pylist() == [12]
    assert later.count_rows(f"title = '{value}'") == 1
    q = np.random.default_rng(99).normal(size=DIM).tolist()
    _same(indexed.vector_search("vec", q, k=10), later.vector_search("vec", q, k=10))
    _same(indexed.vector_search("vec", q, k=5, where="key < 50"), later.vector_search("vec", q, k=5, where="key < 50"))
    flt = {"column": "title", "query": "flutter"}
    _same(indexed.vector_search("vec", q, k=5, filter=flt), later.vector_search("vec", q, k=5, filter=flt))
    _same(
        indexed.hybrid_search("title", "boundary flutter", "vec", q, k=8),
        later.hybrid_search("title", "boundary flutter", "vec", q, k=8),
    )
    sql = "SELECT key, score FROM bm25_search('{}', 'title', 'boundary layer', 5) ORDER BY score DESC, key"
    assert db.sql(sql.format("indexed")).to_pylist() == db.sql(sql.format("later")).to_pylist()
    later.optimize()  # the rewrite builds the indexes; the answers stay
    assert later.stats()["unindexed_superfiles"] == 0
    assert (
        later.bm25_search("title", "boundary layer", k=10).column("_id").to_pylist()
        == indexed.bm25_search("title", "boundary layer", k=10).column("_id").to_pylist()
    )
    assert (
        later.vector_search("vec", q, k=10).column("_id").to_pylist()
        == indexed.vector_search("vec", q, k=10).column("_id").to_pylist()
    )


def test_an_index_created_again_is_not_the_old_one(db: superfile.Connection, no_background: None) -> None:
    """A superfile holding an index from before a drop (another tokenizer, another metric) is searched without
    it: only superfiles written since the index was created carry it."""
    t = db.create_table("t", SCHEMA, fts_columns={"title": "raw"}, vector_columns={"vec": {"dim": DIM, "metric": "l2"}})
    t.append(_rows(0, 30))
    t.drop_index("title")
    t.drop_index("vec")
    t.append(_rows(30, 10))  # no vector blob: vectors in Parquet
    t.create_fts_index("title", tokenizer="english")
    t.create_vector_index("vec", metric="cosine")
    assert t.stats()["unindexed_superfiles"] == 2
    # a raw-tokenized index would match nothing for one word of a title; the English analysis does
    assert len(t.bm25_search("title", "boundary", k=50)) == sum("boundary" in r["title"] for r in _rows(0, 40))
    q = np.random.default_rng(3).normal(size=DIM)
    vectors = np.asarray([r["vec"] for r in _rows(0, 40)], np.float32)
    cosine = 1 - (vectors @ q.astype(np.float32)) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(q)
    got = t.vector_search("vec", q, k=5, projection=["key"])
    assert got.column("key").to_pylist() == np.argsort(cosine)[:5].tolist()
    assert got.column("score").to_pylist() == pytest.approx(np.sort(cosine)[:5].tolist(), abs=1e-5)
    rows = t.to_arrow(columns=["key", "vec"]).sort_by("key")  # blob (old files) or Parquet (newer ones)
    assert np.allclose(np.asarray(rows.column("vec").to_pylist(), np.float32), vectors)


def test_indexes_are_built_in_the_background(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA)
    t.append(_rows(0, 20))
    t.append(_rows(20, 20))
    t.create_fts_index("title")
    deadline = time.monotonic() + 60
    while t.stats()["unindexed_superfiles"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.stats()["unindexed_superfiles"] == 0
    assert "optimize" in [h["operation"] for h in t.versions()]
    assert t.bm25_search("title", "doc3", k=1, projection=["key"]).column("key").to_pylist() == [3]


def test_index_creation_refuses_what_it_cannot_index(db: superfile.Connection) -> None:
    t = db.create_table("t", SCHEMA)
    t.append([{"key": 0, "title": "x", "vec": [0.0] * DIM}])
    with pytest.raises(InvalidVectorError, match="zero vectors"):
        t.create_vector_index("vec")  # cosine has no direction for a zero vector
    t.create_vector_index("vec", metric="l2")  # l2 has
    with pytest.raises(UnknownColumnError):
        t.create_fts_index("nope")
    assert t.options.vector_columns["vec"].metric == "l2"
