"""Connection.sql: results equal DuckDB over the same rows as plain Parquet; search table functions; safety."""

from __future__ import annotations

import decimal
import gc
import math
import weakref
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import superfile
from superfile.errors import InvalidInputError, SqlError
from superfile.expressions import parse_predicate
from superfile.format.reader import decode_pool
from superfile.sql import RRF_K, SqlSession, rrf_fuse
from superfile.sql.context import pinned_values

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"

_VOCAB = ["rust", "compiler", "python", "engine", "search", "vector", "table", "fast", "query", "index"]


def _items(n: int = 240) -> pa.Table:
    rng = np.random.default_rng(7)
    names = [" ".join(rng.choice(_VOCAB, size=int(rng.integers(2, 6)))) for _ in range(n)]
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "cat": pa.array([None if i % 11 == 0 else f"c{i % 6}" for i in range(n)], pa.string()),
            "price": pa.array([None if i % 13 == 0 else round(float(rng.uniform(1, 100)), 2) for i in range(n)]),
            "qty": pa.array([None if i % 17 == 0 else int(rng.integers(0, 50)) for i in range(n)], pa.int64()),
            "name": pa.array(names, pa.string()),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 4, dtype=np.float32)), 4),
        }
    )


def _shops() -> pa.Table:
    return pa.table(
        {
            "cat": pa.array(["c0", "c1", "c2", "c3", "c9", None], pa.string()),
            "region": pa.array(["north", "south", "north", None, "east", "west"], pa.string()),
            "cap": pa.array([10, 20, None, 40, 50, 60], pa.int64()),
        }
    )


SCALAR_ITEMS = ["id", "cat", "price", "qty", "name"]


class World:
    """The engine's tables and the same rows as Parquet (``items`` without its vector column) for DuckDB."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conn = superfile.connect(str(root / "db"))
        items = _items()
        self.items = self.conn.create_table(
            "items", schema=items.schema, fts_columns=["name"], vector_columns={"emb": {"dim": 4, "metric": "l2"}}
        )
        for start in range(0, items.num_rows, 60):  # several superfiles
            self.items.append(items.slice(start, 60))
        self.shops = self.conn.create_table("shops", data=_shops())
        self.rows = {"items": items.select(SCALAR_ITEMS), "shops": _shops()}
        self.full_items = items

    def duck(self) -> duckdb.DuckDBPyConnection:
        db = duckdb.connect()
        for name, rows in self.rows.items():
            path = self.root / f"{name}-{id(rows)}.parquet"
            pq.write_table(rows, path)
            db.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        return db

    def mutate(self) -> None:
        """Delete some rows and update others, in the engine and in the expected rows alike."""
        self.items.delete("qty IS NULL OR id >= 200 OR cat = 'c5'")
        keep = pc.invert(
            pc.fill_null(
                pc.or_kleene(
                    pc.or_kleene(pc.is_null(self.full_items["qty"]), pc.greater_equal(self.full_items["id"], 200)),
                    pc.equal(self.full_items["cat"], "c5"),
                ),
                False,
            )
        )
        full = self.full_items.filter(keep)
        upd_mask = pc.is_in(full["id"], pa.array([1, 2, 3, 40, 42], pa.int64()))
        old = full.filter(upd_mask)
        new = old.set_column(1, "cat", pa.array([None, "c1", "c2", "zz", None], pa.string()))
        new = new.set_column(2, "price", pa.array([5.5, None, 7.25, 1000.0, 0.5]))
        new = new.set_column(4, "name", pa.array(["compiler rust updated"] * 5, pa.string()))
        self.items.update("id IN (1, 2, 3, 40, 42)", new)
        full = pa.concat_tables([full.filter(pc.invert(upd_mask)), new])
        self.full_items = full
        self.rows["items"] = full.select(SCALAR_ITEMS)
        self.shops.delete("cat = 'c9'")
        self.rows["shops"] = _shops().filter(pc.fill_null(pc.not_equal(_shops()["cat"], "c9"), True))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("sql"))


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int | float | decimal.Decimal):
        return None if isinstance(v, float) and math.isnan(v) else round(float(v), 6)
    return str(v)


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    cols = [c.to_pylist() for c in table.columns]
    rows = [tuple(_norm(c[i]) for c in cols) for i in range(table.num_rows)]
    return sorted(rows, key=lambda r: tuple((x is None, str(type(x)), x if x is not None else 0) for x in r))


QUERIES = [
    "SELECT id, cat, price FROM items",
    "SELECT id FROM items WHERE cat IS NULL",
    "SELECT id FROM items WHERE cat IS NOT NULL AND price IS NULL",
    "SELECT id, qty FROM items WHERE qty = 7",
    "SELECT id FROM items WHERE cat IN ('c1', 'c3')",
    "SELECT id FROM items WHERE cat NOT IN ('c1', 'c3')",
    "SELECT id FROM items WHERE cat = 'c1' OR cat = 'c4'",
    "SELECT id FROM items WHERE price BETWEEN 20 AND 40",
    "SELECT id FROM items WHERE price > 50 AND qty < 10",
    "SELECT count(*), sum(price) FROM items WHERE qty > 10 AND qty <= 30",
    "SELECT count(*) FROM items WHERE cat IN ('c0', 'c2', 'c9')",
    "SELECT id FROM items WHERE id >= 100 AND id < 150 AND cat <> 'c2'",
    "SELECT id, name FROM items WHERE name LIKE 'rust%'",
    "SELECT id FROM items WHERE name LIKE '%vector%' AND name NOT LIKE '%fast%'",
    "SELECT id FROM items WHERE NOT (price < 30) OR price IS NULL",
    "SELECT count(*) FROM items",
    "SELECT count(price), count(qty), count(cat) FROM items",
    "SELECT cat, count(*) AS n FROM items GROUP BY cat",
    "SELECT cat, sum(qty) AS s, min(price) AS lo, max(price) AS hi FROM items GROUP BY cat",
    "SELECT cat, avg(price) AS a FROM items WHERE qty > 10 GROUP BY cat HAVING count(*) > 3",
    "SELECT id, price FROM items ORDER BY price DESC NULLS LAST, id LIMIT 10",
    "SELECT id FROM items WHERE cat IS NOT NULL ORDER BY id DESC LIMIT 7 OFFSET 3",
    "SELECT i.id, s.region FROM items i JOIN shops s ON i.cat = s.cat",
    "SELECT i.id, s.region FROM items i LEFT JOIN shops s ON i.cat = s.cat WHERE i.id < 60",
    "SELECT s.region, count(*) AS n, sum(i.qty) AS q FROM items i JOIN shops s ON i.cat = s.cat GROUP BY s.region",
    "SELECT s.cat, count(i.id) AS n FROM shops s LEFT JOIN items i ON i.cat = s.cat GROUP BY s.cat",
    "SELECT id FROM items WHERE cat IN (SELECT cat FROM shops WHERE region = 'north')",
    "SELECT id FROM items WHERE price > (SELECT avg(price) FROM items)",
    "SELECT id FROM items i WHERE EXISTS (SELECT 1 FROM shops s WHERE s.cat = i.cat AND s.cap >= 20)",
    "SELECT c, n FROM (SELECT cat AS c, count(*) AS n FROM items GROUP BY cat) t WHERE n > 30",
    "WITH big AS (SELECT id, qty FROM items WHERE qty > 40) SELECT count(*), sum(qty) FROM big",
    "SELECT DISTINCT cat FROM items",
    "SELECT cat FROM items WHERE id < 50 UNION SELECT cat FROM shops",
    "SELECT cat FROM shops EXCEPT SELECT cat FROM items",
    "SELECT id, CASE WHEN price IS NULL THEN 'none' WHEN price > 50 THEN 'hi' ELSE 'lo' END AS b FROM items",
    "SELECT id, coalesce(cat, 'missing') AS c, qty * 2 AS q2 FROM items WHERE id % 5 = 0",
    "SELECT upper(cat) AS u, length(name) AS l FROM items WHERE id < 20",
    "SELECT * FROM shops",
    "SELECT * FROM items WHERE id = 5",
    "SELECT count(*) FROM items WHERE cat = 'nope'",
    # pinned columns (filled with the literal, not decoded) in SELECT, GROUP BY and with other conjuncts
    "SELECT cat, qty, count(*) AS n, sum(price) AS s FROM items WHERE cat = 'c1' AND qty = 7 GROUP BY cat, qty",
    "SELECT * FROM items WHERE cat = 'c2' AND price > 20",
    "SELECT count(*) FROM items WHERE qty = 7 AND cat = 'c3'",
]


def _check_all(world: World) -> None:
    db = world.duck()
    for q in QUERIES:
        got = world.conn.sql(q)
        if "_id" in got.schema.names:  # the engine's row id is a real column; the Parquet copies lack it
            got = got.drop_columns(["_id"])
        want = db.sql(q).to_arrow_table()
        assert _rows(got) == _rows(want), q


def test_sql_matches_duckdb_before_and_after_deletes_and_updates(world: World) -> None:
    assert len(QUERIES) >= 30
    _check_all(world)
    world.mutate()
    _check_all(world)
    # the engine's own scan agrees with the expected rows too
    assert _rows(world.items.to_arrow(SCALAR_ITEMS)) == _rows(world.rows["items"])


def test_vector_columns_are_not_sql_columns(world: World) -> None:
    assert "emb" not in world.conn.sql("SELECT * FROM items LIMIT 1").schema.names
    with pytest.raises(SqlError):
        world.conn.sql("SELECT emb FROM items")


def test_pinned_values_are_equality_conjuncts_on_integer_and_string_columns(world: World) -> None:
    schema = world.items.schema
    where = parse_predicate("cat = 'c1' AND qty = 7 AND price = 2.5 AND (id = 3 OR id = 4) AND name <> 'x'", schema)
    pinned = pinned_values(where, schema)
    assert pinned == {"cat": pa.scalar("c1", pa.string()), "qty": pa.scalar(7, pa.int64())}
    assert pinned_values(parse_predicate("cat = 'c1' OR qty = 7", schema), schema) == {}
    assert pinned_values(None, schema) == {}


def test_pushdown_of_simple_filters(world: World) -> None:
    s = SqlSession(world.conn, "SELECT id FROM items WHERE cat IN ('c1', 'c2') AND price > 10 AND id % 2 = 0")
    got = s.run()
    assert "cat" in s.pushed["items"] and "price" in s.pushed["items"] and "%" not in s.pushed["items"]
    want = world.conn.sql(
        "SELECT id FROM (SELECT * FROM items) WHERE cat IN ('c1', 'c2') AND price > 10 AND id % 2 = 0"
    )
    assert _rows(got) == _rows(want) and got.num_rows > 0
    joined = SqlSession(world.conn, "SELECT i.id FROM items i JOIN shops s ON i.cat = s.cat WHERE i.id = 3")
    joined.run()
    assert joined.pushed == {}  # a join's WHERE is not pushed into either table
    projected = SqlSession(world.conn, "SELECT id FROM items WHERE qty > 3")
    projected.run()
    assert projected.needed_columns(projected.snapshot("items")) == ["id", "qty"]


@pytest.mark.parametrize(
    "where",
    [
        "cat IS NOT NULL AND price IS NULL",
        "NOT (price < 30) OR price IS NULL",
        "qty NOT BETWEEN 5 AND 9 AND cat NOT IN ('c1', 'c3')",
        "name <> 'rust compiler' AND -qty < -3",
        "(cat = 'c1' OR cat = 'c4') AND id >= 17",
    ],
)
def test_pushed_conjuncts_mean_what_the_predicate_text_means(world: World, where: str) -> None:
    """The pushdown types the query's own parse of the WHERE (no second parse of printed SQL); it must select
    exactly the rows ``parse_predicate`` selects for the same text."""
    s = SqlSession(world.conn, f"SELECT id FROM items WHERE {where}")
    snap = s.snapshot("items")
    pushed, complete = s._pushdown("items", snap)
    assert pushed is not None and complete
    rows = snap.scan(SCALAR_ITEMS)
    assert pushed.evaluate(rows) == parse_predicate(where, snap.schema).evaluate(rows)


COUNTS = [
    "SELECT count(*) FROM items",
    "SELECT COUNT(*) FROM items WHERE cat = 'c1'",
    "SELECT count(*) AS n FROM items WHERE cat <> 'c2'",
    'SELECT count(*) AS "N" FROM items WHERE NOT (price < 30)',
    "SELECT count(*) FROM items WHERE price IS NULL OR qty > 40",
    "SELECT count(*) FROM items WHERE qty BETWEEN 5 AND 9 AND cat NOT IN ('c1', 'c3')",
    "SELECT count(*) FROM items WHERE id >= 100 AND name = 'rust compiler'",
    "SELECT count(*) FROM items WHERE cat = 'nope'",
]


@pytest.mark.parametrize("query", COUNTS)
def test_plain_counts_are_counted_by_the_snapshot(world: World, query: str) -> None:
    """A count(*) whose WHERE is pushed whole is answered without DataFusion, with DataFusion's column name
    and type, and the same number as DataFusion over the table's rows (and DuckDB over the same rows)."""
    s = SqlSession(world.conn, query)
    got = s.run()
    assert s.counted == "items"
    where = query.split(" WHERE ", 1)[1] if " WHERE " in query else "TRUE"
    projection = query.split(" FROM ")[0]
    want = world.conn.sql(f"{projection} FROM (SELECT * FROM items) AS t WHERE {where}")  # no shortcut
    assert got.schema == want.schema and got.to_pylist() == want.to_pylist()
    assert _rows(got) == _rows(world.duck().sql(query).to_arrow_table())


@pytest.mark.parametrize(
    "query",
    [
        "SELECT count(*) FROM items GROUP BY cat",
        "SELECT count(DISTINCT cat) FROM items",
        "SELECT count(*) FROM items WHERE name LIKE '%rust%'",
        "SELECT count(*) FROM items WHERE id % 2 = 0",
        "SELECT count(*) FROM items LIMIT 0",
        "SELECT count(*), count(cat) FROM items",
        "SELECT count(*) FROM items i JOIN shops s ON i.cat = s.cat",
        "SELECT count(*) FROM ITEMS WHERE cat = 'c1'",
        "SELECT id FROM items",
        "SELECT DISTINCT cat FROM items WHERE qty > 3",
        "SELECT id FROM items WHERE cat = 'c1' ORDER BY id LIMIT 3",
        "SELECT id AS k FROM items WHERE cat = 'c1'",
        "SELECT id + 1 FROM items WHERE cat = 'c1'",
        "SELECT i.id FROM items i WHERE i.cat = 'c1'",
        "SELECT id FROM items WHERE name LIKE '%rust%'",
        "SELECT id FROM ITEMS WHERE cat = 'c1'",
    ],
)
def test_other_counts_and_selects_run_in_datafusion(world: World, query: str) -> None:
    s = SqlSession(world.conn, query)
    got = s.run()
    assert s.counted is None and s.fetched is None
    assert _rows(got) == _rows(world.duck().sql(query).to_arrow_table())


FETCHES = [
    "SELECT id, name FROM items WHERE cat = 'c1'",
    "SELECT name, id FROM items WHERE cat <> 'c2' AND qty > 3",
    'SELECT "price", ID FROM items WHERE NOT (price < 30)',
    "SELECT cat FROM items WHERE price IS NULL OR qty > 40",
    "SELECT qty, cat FROM items WHERE qty BETWEEN 5 AND 9 AND cat NOT IN ('c1', 'c3')",
    "SELECT name FROM items WHERE id >= 100 AND name = 'rust compiler'",
    "SELECT id FROM items WHERE cat = 'nope'",
]


@pytest.mark.parametrize("query", FETCHES)
def test_plain_fetches_are_the_scan_s_rows(world: World, query: str) -> None:
    """Plain columns under a WHERE pushed whole are answered by the scan without DataFusion, with DataFusion's
    column names and types and the same rows as DataFusion over the table's rows (and DuckDB over the same rows)."""
    s = SqlSession(world.conn, query)
    got = s.run()
    assert s.fetched == "items"
    projection, where = query.split(" FROM items WHERE ")
    want = world.conn.sql(f"{projection} FROM (SELECT * FROM items) AS t WHERE {where}")  # no shortcut
    assert got.schema.remove_metadata() == want.schema.remove_metadata()
    assert _rows(got) == _rows(want)
    assert _rows(got) == _rows(world.duck().sql(query).to_arrow_table())


def test_a_plain_fetch_keeps_the_row_limit_and_datafusion_s_errors(world: World) -> None:
    with pytest.raises(SqlError, match="more than 3 rows"):
        world.conn.sql("SELECT id FROM items WHERE qty > 3", max_rows=3)
    with pytest.raises(SqlError, match="unique expression names"):  # DataFusion's words, as without the fetch
        world.conn.sql("SELECT id, id FROM items WHERE cat = 'c1'")
    with pytest.raises(SqlError, match="nope"):
        world.conn.sql("SELECT nope FROM items WHERE cat = 'c1'")


def test_a_finished_query_frees_its_session_and_rows(world: World) -> None:
    """The context holds the table functions from Rust; were they to hold the session strongly, every query's
    session and the rows it registered would stay alive for good (the garbage collector cannot see the cycle)."""
    query = "SELECT count(*), sum(price) FROM items WHERE name LIKE '%rust%'"
    pool = decode_pool()
    before = pool.bytes_allocated()
    session = SqlSession(world.conn, query)
    session.run()
    assert pool.bytes_allocated() > before  # the registered rows
    gone = weakref.ref(session)
    del session
    gc.collect()
    assert gone() is None and pool.bytes_allocated() == before
    for _ in range(3):  # and through the connection, with a table function in the query
        world.conn.sql(query)
        world.conn.sql("SELECT count(*) FROM bm25_search('items', 'name', 'rust', 5) b JOIN items i ON b._id = i._id")
    gc.collect()
    assert pool.bytes_allocated() == before


def test_one_snapshot_per_table_per_query(world: World) -> None:
    s = SqlSession(world.conn, "SELECT 1")
    assert s.snapshot("items") is s.snapshot("items")


# -- table functions ------------------------------------------------------------------------------


def _ids(t: pa.Table) -> list[int]:
    return t.column("_id").to_pylist()


def test_bm25_search_function_matches_method(world: World) -> None:
    got = world.conn.sql("SELECT * FROM bm25_search('items', 'name', 'rust compiler', 10)")
    want = world.items.bm25_search("name", "rust compiler", 10)
    assert got.schema.names == ["_id", *SCALAR_ITEMS, "score"]
    assert _ids(got) == _ids(want)
    assert np.allclose(got.column("score").to_numpy(), want.column("score").to_numpy())
    ordered = world.conn.sql(
        "SELECT _id FROM bm25_search('items', 'name', 'rust compiler', 10) ORDER BY score DESC, _id"
    )
    assert _ids(ordered) == _ids(want)
    only = world.conn.sql("SELECT _id, score FROM bm25_search('items', 'name', 'python', 5, 'all')")
    assert only.schema.names == ["_id", "score"] and only.num_rows == 5


def test_bm25_prefix_token_exact_functions(world: World) -> None:
    got = world.conn.sql("SELECT _id, score FROM bm25_search_prefix('items', 'name', 'comp', 8)")
    want = world.items.bm25_search_prefix("name", "comp", 8)
    assert _ids(got) == _ids(want)
    tm = world.conn.sql("SELECT _id FROM token_match('items', 'name', 'rust vector', 'and') ORDER BY _id")
    assert _ids(tm) == sorted(_ids(world.items.token_match("name", "rust vector", "and")))
    tm_or = world.conn.sql("SELECT count(*) AS n FROM token_match('items', 'name', 'rust vector', 'or')")
    assert tm_or.column("n").to_pylist() == [world.items.token_match("name", "rust vector", "or").num_rows]
    value = world.full_items.column("name")[10].as_py()
    ex = world.conn.sql(f"SELECT _id, name FROM exact_match('items', 'name', '{value}')")
    assert ex.num_rows >= 1 and set(ex.column("name").to_pylist()) == {value}


def test_negation_composes_with_except(world: World) -> None:
    got = world.conn.sql(
        "SELECT _id FROM token_match('items','name','rust','and') "
        "EXCEPT SELECT _id FROM token_match('items','name','compiler','and')"
    )
    rust = set(_ids(world.items.token_match("name", "rust", "and")))
    compiler = set(_ids(world.items.token_match("name", "compiler", "and")))
    assert set(_ids(got)) == rust - compiler and rust - compiler


def test_vector_search_function_and_joins(world: World) -> None:
    q = [0.2, 0.4, 0.6, 0.8]
    got = world.conn.sql("SELECT _id, score FROM vector_search('items', 'emb', [0.2, 0.4, 0.6, 0.8], 7) ORDER BY score")
    want = world.items.vector_search("emb", q, 7)
    assert _ids(got) == _ids(want)
    arr = world.conn.sql("SELECT _id FROM vector_search('items', 'emb', make_array(0.2, 0.4, 0.6, 0.8), 7)")
    assert sorted(_ids(arr)) == sorted(_ids(want))
    # a search relation joined with the table's scalar columns and with another table
    joined = world.conn.sql(
        "SELECT v._id, i.id, s.region FROM vector_search('items', 'emb', [0.2, 0.4, 0.6, 0.8], 7) v "
        "JOIN items i ON v._id = i._id LEFT JOIN shops s ON s.cat = i.cat"
    )
    assert sorted(_ids(joined)) == sorted(_ids(want))
    # two search relations joined with each other
    both = world.conn.sql(
        "SELECT b._id FROM bm25_search('items', 'name', 'rust', 1000) b "
        "JOIN token_match('items', 'name', 'vector', 'and') t ON b._id = t._id"
    )
    expect = set(_ids(world.items.bm25_search("name", "rust", 1000))) & set(
        _ids(world.items.token_match("name", "vector", "and"))
    )
    assert set(_ids(both)) == expect
    filtered = world.conn.sql(
        "SELECT _id, cat FROM bm25_search('items', 'name', 'rust', 1000) WHERE cat = 'c1' AND score > 0"
    )
    assert filtered.num_rows > 0 and set(filtered.column("cat").to_pylist()) == {"c1"}


def test_table_function_errors(world: World) -> None:
    with pytest.raises(SqlError, match="full-text"):
        world.conn.sql("SELECT * FROM bm25_search('items', 'cat', 'x', 3)")
    with pytest.raises(SqlError, match=r"4 values|shape"):
        world.conn.sql("SELECT * FROM vector_search('items', 'emb', [0.1, 0.2], 3)")
    with pytest.raises(SqlError, match="does not exist"):
        world.conn.sql("SELECT * FROM token_match('nope', 'name', 'x', 'and')")
    with pytest.raises(SqlError, match="takes"):
        world.conn.sql("SELECT * FROM exact_match('items', 'name')")
    with pytest.raises(SqlError):
        world.conn.sql("SELECT * FROM items i, bm25_search('items', 'name', i.name, 3)")


def test_rrf_fusion_ranks_shared_rows_first() -> None:
    ids, scores = rrf_fuse([np.array([5, 1, 2], np.uint64), np.array([3, 2, 4], np.uint64)], 10)
    assert ids[0] == 2  # found by both
    assert math.isclose(scores[0], 1 / (RRF_K + 3) + 1 / (RRF_K + 2))
    assert list(ids[1:3]) == [3, 5]  # rank 1 of one list, ties by _id


def test_hybrid_search_function(world: World) -> None:
    got = world.conn.sql(
        "SELECT _id, id, score FROM hybrid_search('items', 'name', 'rust compiler', 'emb', [0.2, 0.4, 0.6, 0.8], 10)"
    )
    assert got.num_rows == 10
    scores = got.column("score").to_pylist()
    assert scores == sorted(scores, reverse=True)
    text = _ids(world.items.bm25_search("name", "rust compiler", 100))
    vec = _ids(world.items.vector_search("emb", [0.2, 0.4, 0.6, 0.8], 100))
    fused, _ = rrf_fuse([np.array(text, np.uint64), np.array(vec, np.uint64)], 10)
    assert _ids(got) == fused.tolist()


def test_supertable_hybrid_search_equals_sql(world: World) -> None:
    q = [0.2, 0.4, 0.6, 0.8]
    world.mutate()  # deleted rows must stay invisible to both retrievers
    got = world.items.hybrid_search("name", "rust compiler", "emb", q, 7, projection=["id", "cat"])
    assert got.column_names == ["_id", "score", "id", "cat"]
    sql = world.conn.sql(
        "SELECT _id, score, id, cat FROM hybrid_search('items', 'name', 'rust compiler', 'emb', "
        "[0.2, 0.4, 0.6, 0.8], 7) ORDER BY score DESC, _id"
    )
    assert got.to_pylist() == sql.to_pylist()
    text = _ids(world.items.bm25_search("name", "rust compiler", 100))
    vec = _ids(world.items.vector_search("emb", q, 100))
    fused, scores = rrf_fuse([np.array(text, np.uint64), np.array(vec, np.uint64)], 7)
    assert _ids(got) == fused.tolist() and got.column("score").to_pylist() == scores.tolist()
    assert "emb" in world.items.hybrid_search("name", "rust", "emb", q).column_names  # default: every column
    with pytest.raises(InvalidInputError):
        world.items.hybrid_search("name", "rust", "emb", q, 0)


def _ndcg10(ranked: list[int], grades: dict[int, int]) -> float:
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(grades.values(), reverse=True)[:10]
    idcg = sum((2**g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def test_hybrid_search_cranfield_ndcg(tmp_path: Path) -> None:
    docs = pq.read_table(CRANFIELD / "docs.parquet")
    queries = pq.read_table(CRANFIELD / "queries.parquet")
    qrels = pq.read_table(CRANFIELD / "qrels.parquet").to_pylist()
    text = pc.binary_join_element_wise(pc.fill_null(docs["title"], ""), pc.fill_null(docs["text"], ""), " ")
    data = pa.table({"id": docs["id"], "body": text, "embedding": docs["embedding"]})
    conn = superfile.connect(f"memory://cranfield-{tmp_path.name}")
    conn.create_table(
        "cran",
        data=data,
        fts_columns=["body"],
        vector_columns={"embedding": {"dim": data.schema.field("embedding").type.list_size, "metric": "cosine"}},
    )
    grades: dict[int, dict[int, int]] = {}
    for r in qrels:
        if r["grade"] > 0:
            grades.setdefault(r["query_id"], {})[r["doc_id"]] = r["grade"]
    total, n = 0.0, 0
    for qid, (qtext, qvec) in enumerate(
        zip(queries["text"].to_pylist(), queries["embedding"].to_pylist(), strict=True), start=1
    ):
        if qid not in grades:
            continue
        safe = qtext.replace("'", "''")
        vec = ", ".join(repr(float(x)) for x in qvec)
        res = conn.sql(
            f"SELECT id FROM hybrid_search('cran', 'body', '{safe}', 'embedding', [{vec}], 10) ORDER BY score DESC"
        )
        total += _ndcg10(res.column("id").to_pylist(), grades[qid])
        n += 1
    ndcg = total / n
    print(f"cranfield hybrid nDCG@10 = {ndcg:.4f} over {n} queries")
    assert ndcg >= 0.40


# -- safety ----------------------------------------------------------------------------------------


def test_statements_that_reach_files_or_write_fail(world: World, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a,b\n1,2\n")
    target = tmp_path / "out.csv"
    before = {n: world.conn.open_table(n).version for n in world.conn.table_names()}
    bad = [
        f"CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '{secret}'",
        f"COPY (SELECT * FROM items) TO '{target}'",
        f"COPY items TO '{target}' STORED AS PARQUET",
        f"SELECT * FROM '{secret}'",
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_parquet('{secret}')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM 'https://example.com/x.parquet'",
        "SELECT * FROM 's3://bucket/x.parquet'",
        "INSERT INTO items (id) VALUES (1)",
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT * FROM items",
        "DROP TABLE items",
        "DELETE FROM items",
        "UPDATE items SET qty = 0",
        "SET datafusion.catalog.information_schema = true",
        "SELECT * FROM information_schema.tables",
        "SELECT 1; SELECT 2",
        "",
    ]
    for q in bad:
        with pytest.raises(SqlError):
            world.conn.sql(q)
    assert not target.exists()
    assert {n: world.conn.open_table(n).version for n in world.conn.table_names()} == before
    assert world.conn.table_names() == ["items", "shops"]


def test_sql_error_is_typed_with_position(world: World) -> None:
    with pytest.raises(SqlError) as info:
        world.conn.sql("SELEC id FROM items")
    assert isinstance(info.value, InvalidInputError) and "Line: 1" in str(info.value)
    with pytest.raises(SqlError, match="nope"):
        world.conn.sql("SELECT nope FROM items")


def test_a_commit_during_the_query_is_not_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan and the table function of one query read the same pinned snapshot even if a commit lands between."""
    import superfile.sql.functions as functions

    conn = superfile.connect("memory://sql-pinned")
    t = conn.create_table("d", data=pa.table({"text": ["rust compiler", "rust"]}), fts_columns=["text"])
    original = functions.FUNCTIONS["token_match"]

    def racing(*args: Any) -> Any:
        t.append(pa.table({"text": ["rust zebra"]}))  # lands after the query pinned its snapshot of d
        return original(*args)

    monkeypatch.setitem(functions.FUNCTIONS, "token_match", racing)
    got = conn.sql("SELECT count(*) AS n FROM d JOIN token_match('d', 'text', 'rust', 'and') m ON d._id = m._id")
    assert got.column("n").to_pylist() == [2]
    monkeypatch.setitem(functions.FUNCTIONS, "token_match", original)
    assert conn.sql("SELECT count(*) AS n FROM token_match('d', 'text', 'zebra', 'and')").column("n").to_pylist() == [1]


def test_conservative_retry_when_the_analysis_misses(world: World) -> None:
    s = SqlSession(world.conn, "SELECT count(*) AS n FROM shops", conservative=True)
    assert s.run().column("n").to_pylist() == [world.rows["shops"].num_rows]


def test_index_bounded_and_full_scans_agree(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushed filters answer the same whether a superfile is read through its indexes (candidates only, or
    whole) or scanned without them, before and after deletes and updates."""
    import superfile.table.snapshot as snapshot

    bounded = snapshot.candidate_rows
    for _ in range(2):
        answers = []
        for fraction, indexes in ((0.0, True), (1.0, True), (1.0, False)):
            monkeypatch.setattr(snapshot, "INDEXED_FRACTION", fraction)
            monkeypatch.setattr(snapshot, "candidate_rows", bounded if indexes else lambda *a: None)
            answers.append([_rows(world.conn.sql(q)) for q in QUERIES])
        assert answers[0] == answers[1] == answers[2]
        world.mutate()
