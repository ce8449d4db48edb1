"""The Connection API, one suite for every side: embedded (file://), remote (a real gateway over HTTP) and
fleet (the distributed read path).

Every test runs three times with identical assertions, typed against the contract both sides implement
(``superfile.api.Catalog`` and ``Table``; mypy checks this file in ``make typecheck``): ``db`` is either
``superfile.connect("file://...")``, or ``superfile.connect("http://...", api_key=...)``
against a uvicorn gateway (embedded mode) serving another file:// root, or the same
against a gateway on an S3 bucket (moto) that writes embedded and forwards every
read to a query service fanning out to three cache nodes (real processes).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from fleet_support import API_KEY, aws_env, running_fleet, s3_bucket
from superfile.api import Catalog, Table
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidPredicateError,
    InvalidTableNameError,
    InvalidVectorError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    QueryLimitError,
    ReadOnlyTableError,
    SchemaChangeError,
    SchemaMismatchError,
    SqlError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
    VectorDimensionError,
    VersionNotFoundError,
)
from superfile_gateway import BackgroundServer, Settings, parse_api_keys
from superfile_suite import Server

DIM = 4
_FIELDS: list[pa.Field] = [pa.field("key", pa.int64()), pa.field("title", pa.string())]
SIMPLE = pa.schema(_FIELDS)
SCHEMA = SIMPLE.append(pa.field("tag", pa.string())).append(pa.field("emb", pa.list_(pa.float32())))
TITLES = [
    "supersonic boundary layer",
    "boundary layer transition",
    "heat transfer in hypersonic flow",
    "supersonic wing flutter",
    "laminar flow over a flat plate",
    "shock wave boundary interaction",
]


def _rows(keys: range) -> list[dict[str, Any]]:
    rows = []
    for k in keys:
        emb = [0.0] * DIM
        emb[k % DIM] = 1.0
        emb[(k + 1) % DIM] = 0.1 * (k % 3)
        rows.append({"key": k, "title": TITLES[k % len(TITLES)], "tag": "even" if k % 2 == 0 else "odd", "emb": emb})
    return rows


@pytest.fixture(scope="module", params=["embedded", "remote", "fleet"])
def db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    if request.param == "fleet":
        # reads through gateway -> query service -> 3 cache nodes on a bucket of moto's; writes embedded at the gateway
        s3: Server = request.getfixturevalue("s3")
        with s3_bucket(s3) as uri, running_fleet(uri, aws_env(s3)) as fleet:
            assert fleet.gateway is not None
            conn = superfile.connect(fleet.gateway.url, api_key=API_KEY)
            yield conn
            conn.close()
            assert all(fleet.stats(n)["leaf_requests"] > 0 for n in fleet.cache), "reads did not reach every node"
        return
    uri = f"file://{tmp_path_factory.mktemp(request.param)}"
    if request.param == "embedded":
        yield superfile.connect(uri)
        return
    # cleanup(older_than=0) as embedded: nothing else writes to this root, so no commit is in flight
    settings = Settings(storage=uri, api_keys=parse_api_keys("api-test-key:*:rw"), cleanup_min_age_s=0)
    with BackgroundServer(settings) as server:
        conn = superfile.connect(server.url, api_key="api-test-key")
        yield conn
        conn.close()


@pytest.fixture
def table(db: Catalog) -> Table:
    """A fresh table with 12 rows: key 0..11, six titles, tag even/odd, a 4-d vector."""
    t = db.create_table(
        f"t_{uuid.uuid4().hex[:8]}", SCHEMA, fts_columns=["title", "tag"], vector_columns={"emb": {"dim": DIM}}
    )
    t.append(_rows(range(12)))
    return t


def _keys(result: pa.Table) -> list[Any]:
    return result.column("key").to_pylist()


def test_catalog(db: Catalog) -> None:
    name = f"c_{uuid.uuid4().hex[:8]}"
    t = db.create_table(name, SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM})
    assert name in db.table_names()
    assert t.version == 1
    assert t.schema.names == ["_id", "key", "title", "tag", "emb"]
    assert t.schema.field("emb").type == pa.list_(pa.float32(), DIM)
    assert dict(t.options.fts_columns) == {"title": "english"}
    assert t.options.vector_columns["emb"].dim == DIM
    with pytest.raises(TableExistsError):
        db.create_table(name, SIMPLE)
    again = db.create_table(name, SCHEMA, vector_columns={"emb": DIM}, exist_ok=True, data=_rows(range(3)))
    assert again.count_rows() == 0  # exist_ok returns the existing table and appends nothing, as embedded does
    opened = db.open_table(name)
    assert opened.schema.equals(t.schema)
    with pytest.raises(TableNotFoundError):
        db.open_table(f"missing_{uuid.uuid4().hex[:6]}")
    with pytest.raises(InvalidTableNameError):
        db.open_table("../escape")
    with pytest.raises(InvalidTableNameError):
        db.create_table("a/b", SIMPLE)
    with pytest.raises(InvalidOptionError):
        db.create_table(f"bad_{uuid.uuid4().hex[:6]}", SIMPLE, fts_columns=["title"], tokenizer="klingon")
    with pytest.raises(UnknownColumnError):
        db.create_table(f"bad_{uuid.uuid4().hex[:6]}", SIMPLE, fts_columns=["nope"])
    with pytest.raises(InvalidOptionError):
        db.create_table(f"bad_{uuid.uuid4().hex[:6]}", SCHEMA)  # a list column that is not a vector column
    with pytest.raises(InvalidOptionError):
        db.create_table(f"bad_{uuid.uuid4().hex[:6]}", SIMPLE, max_rows_per_superfile=0)
    db.drop_table(name)
    assert name not in db.table_names()
    with pytest.raises(TableNotFoundError):
        db.open_table(name)
    with pytest.raises(TableNotFoundError):
        db.drop_table(name)


def test_namespaces(db: Catalog) -> None:
    team = f"ns_{uuid.uuid4().hex[:8]}"
    with pytest.raises(NamespaceNotFoundError):
        db.create_table(f"{team}.docs", SIMPLE)  # the namespace must exist first
    db.create_namespace(team)
    db.create_namespace(f"{team}.search")
    with pytest.raises(NamespaceExistsError):
        db.create_namespace(team)
    db.create_namespace(team, exist_ok=True)
    with pytest.raises(NamespaceNotFoundError):
        db.create_namespace(f"missing_{uuid.uuid4().hex[:6]}.child")
    with pytest.raises(InvalidTableNameError):
        db.create_namespace(f"{team}..x")
    t = db.create_table(f"{team}.docs", SIMPLE, fts_columns=["title"])
    t.append([{"key": 1, "title": "supersonic boundary layer"}])
    assert {team, f"{team}.search"} <= set(db.list_namespaces())
    assert db.list_namespaces(team) == [f"{team}.search"]
    assert db.table_names(team) == [f"{team}.docs"]
    assert f"{team}.docs" in db.table_names()
    assert db.open_table(f"{team}.docs").bm25_search("title", "boundary", k=5).column("key").to_pylist() == [1]
    assert db.sql(f'SELECT count(*) AS n FROM "{team}.docs"').column("n").to_pylist() == [1]
    with pytest.raises(NamespaceNotEmptyError):
        db.drop_namespace(team)
    db.drop_table(f"{team}.docs")
    db.drop_namespace(f"{team}.search")
    db.drop_namespace(team)
    assert team not in db.list_namespaces()
    with pytest.raises(NamespaceNotFoundError):
        db.table_names(team)


def test_create_from_data(db: Catalog) -> None:
    data = pa.table({"key": [1, 2], "title": ["a b", "c d"]})
    t = db.create_table(f"d_{uuid.uuid4().hex[:8]}", data=data, fts_columns=["title"])
    assert t.count_rows() == 2
    assert t.to_arrow(columns=["key", "title"]).equals(data)


def test_append_and_read(table: Table) -> None:
    v = table.version
    assert table.append(pa.Table.from_pylist(_rows(range(12, 15)), schema=SCHEMA)) == v + 1
    assert table.append([]) == v + 1  # nothing to add: same version
    assert table.count_rows() == 15
    assert table.count_rows("tag = 'even'") == 8
    rows = table.to_arrow(columns=["key", "title"], where="key >= 12")
    assert rows.to_pylist() == [{"key": k, "title": TITLES[k % 6]} for k in (12, 13, 14)]
    emb = table.to_arrow(columns=["emb"], where="key = 1").column("emb")[0].as_py()
    assert emb == pytest.approx([0.0, 1.0, 0.1, 0.0])
    ids: list[Any] = table.to_arrow().column("_id").to_pylist()
    assert sorted(ids) == list(range(15))
    ops = [v["operation"] for v in table.versions()]
    assert ops == ["create", "append", "append"]
    assert table.stats()["row_count"] == 15


def test_bm25_and_prefix(table: Table) -> None:
    result = table.bm25_search("title", "supersonic boundary", k=5, projection=["key", "title"])
    assert result.column_names == ["_id", "score", "key", "title"]
    scores: list[Any] = result.column("score").to_pylist()
    assert scores == sorted(scores, reverse=True) and len(result) == 5
    assert set(_keys(result)[:2]) == {0, 6}  # "supersonic boundary layer" has both terms
    every = table.bm25_search("title", "supersonic boundary", k=20, mode="all", projection=["key"])
    assert sorted(_keys(every)) == [0, 6]
    prefix = table.bm25_search_prefix("title", "hyper", k=10, projection=["key"])
    assert sorted(_keys(prefix)) == [2, 8]
    whole = table.bm25_search("title", "flutter", k=3)
    assert whole.column_names == ["_id", "score", "key", "title", "tag", "emb"]
    assert _keys(whole) in ([3, 9], [9, 3])


def test_token_and_exact_match(table: Table) -> None:
    both = table.token_match("title", ["boundary", "layer"], "and", projection=["key"])
    assert sorted(_keys(both)) == [0, 1, 6, 7]
    assert both.column("score").null_count == len(both)
    either = table.token_match("title", "flutter laminar", "or", projection=["key"])
    assert sorted(_keys(either)) == [3, 4, 9, 10]
    exact = table.exact_match("title", "supersonic wing flutter", projection=["key"])
    assert sorted(_keys(exact)) == [3, 9]
    assert len(table.exact_match("title", "supersonic wing")) == 0
    assert len(table.token_match("title", "flutter laminar", "or", max_rows=4)) == 4
    with pytest.raises(QueryLimitError, match="4 rows match"):
        table.token_match("title", "flutter laminar", "or", max_rows=3)
    with pytest.raises(QueryLimitError):
        table.exact_match("title", "supersonic wing flutter", max_rows=1)


def test_vector_search(table: Table) -> None:
    nearest = table.vector_search("emb", np.array([1.0, 0.0, 0.0, 0.0]), k=3, projection=["key"])
    assert nearest.column_names == ["_id", "score", "key"]
    assert _keys(nearest)[0] in (0, 4, 8) and set(_keys(nearest)) == {0, 4, 8}
    distances: list[Any] = nearest.column("score").to_pylist()
    assert distances == sorted(distances)
    filtered = table.vector_search(
        "emb", [1.0, 0.0, 0.0, 0.0], k=3, filter={"column": "title", "query": "flutter"}, projection=["key"]
    )
    assert sorted(_keys(filtered)) == [3, 9]
    where = table.vector_search("emb", [0.0, 1.0, 0.0, 0.0], k=2, where="key > 4", projection=["key", "tag"])
    assert _keys(where) == [9, 5]  # 9 is exactly the query direction, 5 leans towards the third axis
    assert where.column("tag").to_pylist() == ["odd", "odd"]


def test_hybrid_search(db: Catalog, table: Table) -> None:
    """Reciprocal-rank fusion of BM25 and kNN: the row both retrievers find ranks first; the method and the
    SQL function agree."""
    q = [0.0, 0.0, 0.0, 1.0]
    fused = table.hybrid_search("title", "flutter", "emb", q, k=4, projection=["key"])
    assert fused.column_names == ["_id", "score", "key"]
    assert fused.schema.field("score").type == pa.float64()
    scores: list[Any] = fused.column("score").to_pylist()
    assert len(fused) == 4 and scores == sorted(scores, reverse=True)
    assert _keys(fused)[0] == 3 and scores[0] > scores[1]  # key 3: "flutter" and nearest to the query's axis
    sql = db.sql(f"SELECT key, score FROM hybrid_search('{table.name}', 'title', 'flutter', 'emb', {q}, 4)")
    assert sorted(zip(sql.column("key").to_pylist(), sql.column("score").to_pylist(), strict=True)) == sorted(
        zip(_keys(fused), scores, strict=True)
    )
    v = table.version  # a pinned version answers hybrid search too, as it was
    table.append(_rows(range(12, 24)))
    assert table.checkout(v).hybrid_search("title", "flutter", "emb", q, k=4, projection=["key"]).equals(fused)


def test_sql(db: Catalog, table: Table) -> None:
    n = db.sql(f"SELECT count(*) AS n FROM {table.name} WHERE tag = 'odd'")
    assert n.to_pylist() == [{"n": 6}]
    top = db.sql(f"SELECT key FROM bm25_search('{table.name}', 'title', 'flutter', 5) ORDER BY key")
    assert top.column("key").to_pylist() == [3, 9]
    hybrid = db.sql(
        f"SELECT key, score FROM hybrid_search('{table.name}', 'title', 'flutter', 'emb', [0.0, 0.0, 0.0, 1.0], 4)"
        " ORDER BY score DESC, key"
    )
    assert len(hybrid) == 4 and set(hybrid.column("key").to_pylist()[:2]) <= {3, 9, 7, 11}
    with pytest.raises(SqlError):
        db.sql(f"SELECT nope FROM {table.name}")
    with pytest.raises(SqlError):
        db.sql(f"DELETE FROM {table.name}")
    assert len(db.sql(f"SELECT key FROM {table.name} LIMIT 3", max_rows=3)) == 3
    with pytest.raises(QueryLimitError, match="more than 2 rows"):
        db.sql(f"SELECT key FROM {table.name}", max_rows=2)
    with pytest.raises(QueryLimitError, match="memory"):
        db.sql(f"SELECT a.title || b.title AS t FROM {table.name} a, {table.name} b ORDER BY t", memory_limit_bytes=1)


def test_update_delete_checkout(table: Table) -> None:
    v = table.version
    before = table.to_arrow(columns=["_id"], where="key = 3").column("_id").to_pylist()
    assert table.update("key = 3", [{"key": 3, "title": "rewritten title", "tag": "odd", "emb": [0, 0, 0, 1]}]) == v + 1
    after = table.to_arrow(columns=["_id", "title"], where="key = 3")
    assert after.column("_id").to_pylist() == before and after.column("title").to_pylist() == ["rewritten title"]
    assert table.delete("tag = 'even'") == v + 2
    assert table.count_rows() == 6
    assert sorted(_keys(table.token_match("title", ["boundary"], projection=["key"]))) == [1, 5, 7, 11]
    old = table.checkout(v)
    assert old.count_rows() == 12 and old.version == v
    with pytest.raises(ReadOnlyTableError):
        old.append(_rows(range(1)))
    with pytest.raises(VersionNotFoundError):
        table.checkout(999)


def test_bad_input_writes_nothing(table: Table) -> None:
    v, n = table.version, table.count_rows()
    with pytest.raises(SchemaMismatchError):
        table.append([{"key": 1, "nope": "x", "emb": [0, 0, 0, 1]}])
    with pytest.raises(SchemaMismatchError):
        table.append(pa.table({"key": ["not a number"], "emb": [[0.0, 0, 0, 1]]}))
    with pytest.raises(SchemaMismatchError):
        table.append([{"key": 1, "title": "x", "emb": [1.0, 2.0]}])  # rows are checked against the schema first
    with pytest.raises(VectorDimensionError):
        table.append(pa.table({"key": [1], "emb": [[1.0, 2.0]]}))
    with pytest.raises(InvalidVectorError):
        table.append([{"key": 1, "title": "x", "emb": [float("nan"), 0, 0, 1]}])
    with pytest.raises(InvalidPredicateError):
        table.delete("key ===")
    with pytest.raises(UnknownColumnError):
        table.delete("nope = 1")
    with pytest.raises(SchemaMismatchError):
        table.update("key = 1", [{"key": 1, "title": "x", "emb": [0, 0, 0, 1], "extra": 1}])
    assert table.version == v and table.count_rows() == n


def test_bad_queries(table: Table) -> None:
    with pytest.raises(UnknownColumnError):
        table.bm25_search("nope", "x")
    with pytest.raises(UnknownColumnError):
        table.bm25_search("title", "x", projection=["nope"])
    with pytest.raises(InvalidOptionError):
        table.bm25_search("title", "x", k=0)
    with pytest.raises(InvalidOptionError):
        table.bm25_search("title", "x", mode="most")
    with pytest.raises(VectorDimensionError):
        table.vector_search("emb", [1.0, 0.0], k=1)
    with pytest.raises(InvalidVectorError):
        table.vector_search("emb", [float("nan"), 0.0, 0.0, 0.0], k=1)
    with pytest.raises(InvalidVectorError):
        table.vector_search("emb", [0.0, 0.0, 0.0, 0.0], k=1)  # no direction under cosine
    with pytest.raises(UnknownColumnError):
        table.vector_search("emb", [1.0, 0.0, 0.0, 0.0], filter={"column": "nope", "query": "x"})
    with pytest.raises(InvalidPredicateError):
        table.to_arrow(where="key >>> 1")
    with pytest.raises(UnknownColumnError):
        table.to_arrow(columns=["nope"])


def test_idempotent_append(table: Table) -> None:
    v = table.append(_rows(range(20, 22)), idempotency_key="batch-20")
    assert table.append(_rows(range(20, 22)), idempotency_key="batch-20") == v  # the first commit's version
    assert table.count_rows() == 14 and table.version == v
    assert table.append(_rows(range(22, 23)), idempotency_key="batch-22") == v + 1
    with pytest.raises(InvalidInputError):
        table.append(_rows(range(1)), idempotency_key="")
    assert table.count_rows() == 15
    assert table.idempotency_version("batch-20") == v and table.idempotency_version("batch-22") == v + 1
    assert table.idempotency_version("never-used") is None
    assert table.checkout(v).idempotency_version("batch-22") is None  # a past version had not seen it
    with pytest.raises(InvalidInputError):
        table.idempotency_version("")


def test_properties_follow_the_version(db: Catalog) -> None:
    """Commit properties (the builder's log offsets, the idempotency ledger) as of the handle's version."""
    t = db.create_table(f"p_{uuid.uuid4().hex[:8]}", SIMPLE)
    created = t.version
    assert t.properties == {}
    t.append([{"key": 1, "title": "a"}], idempotency_key="first")
    assert t.properties and all(isinstance(k, str) for k in t.properties)  # the key's ledger entry
    assert t.checkout(created).properties == {}


def _small_files(db: Catalog, appends: int = 6) -> Table:
    """A table whose 12 rows arrived in ``appends`` commits (one small superfile each)."""
    t = db.create_table(f"m_{uuid.uuid4().hex[:8]}", SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM})
    per = 12 // appends
    for start in range(0, 12, per):
        t.append(_rows(range(start, start + per)))
    return t


def test_optimize(db: Catalog) -> None:
    t = _small_files(db)
    t.delete("key = 5")
    before = t.to_arrow(columns=["_id", "key", "title"]).sort_by("_id")
    v = t.version
    assert t.stats()["superfile_count"] == 6
    result = t.optimize()
    assert result == {
        "version": v + 1,
        "target_rows": 100_000,
        "superfiles_removed": 6,
        "superfiles_added": 1,
        "rows_rewritten": 11,  # the deleted row is dropped
        "deletes_carried": 0,
    }
    assert t.version == v + 1 and t.versions()[-1]["operation"] == "optimize"
    assert t.stats()["superfile_count"] == 1 and t.stats()["deleted_rows"] == 0
    assert t.to_arrow(columns=["_id", "key", "title"]).sort_by("_id").equals(before)  # rows keep their _id
    assert sorted(_keys(t.bm25_search("title", "flutter", projection=["key"]))) == [3, 9]
    again = t.optimize()
    assert again["superfiles_removed"] == 0 and again["version"] == v + 1  # nothing left to merge
    assert t.changes(v, v + 1).num_rows == 0  # compaction changes no row
    split = _small_files(db).optimize(target_rows=5)
    assert (split["superfiles_removed"], split["superfiles_added"], split["target_rows"]) == (6, 3, 5)
    with pytest.raises(InvalidOptionError):
        t.optimize(target_rows=0)
    with pytest.raises(InvalidOptionError):
        t.optimize(target_rows=10, target_bytes=1000)
    with pytest.raises(ReadOnlyTableError):
        t.checkout(v).optimize()
    assert t.version == v + 1


def test_cleanup(db: Catalog) -> None:
    t = _small_files(db)
    t.optimize()
    v = t.version
    kept = t.cleanup(datetime.timedelta(days=1))
    assert kept["files_removed"] == 0 and kept["bytes_removed"] == 0  # everything is younger than a day
    assert t.checkout(2).count_rows() == 2
    dry = t.cleanup(0, dry_run=True)
    assert dry["dry_run"] is True and dry["oldest_version"] == v and dry["retained_versions"] == 1
    assert dry["removed"]["superfiles"] == 6 and dry["files_removed"] >= 6 + v - 1 and dry["bytes_removed"] > 0
    assert t.checkout(2).count_rows() == 2  # a dry run deletes nothing
    expired = t.cleanup(0, safety_margin=datetime.timedelta(hours=1))  # old versions go, young files stay
    assert expired["files_removed"] == 0 and expired["oldest_version"] == v
    assert [h["version"] for h in t.versions()] == [v]
    with pytest.raises(VersionNotFoundError):
        t.checkout(2)
    done = t.cleanup(0)  # the margin is the window: nothing young is kept
    assert done["removed"] == dry["removed"] and done["files_removed"] == dry["files_removed"]
    assert t.count_rows() == 12 and sorted(_keys(t.to_arrow(columns=["key"]))) == list(range(12))
    assert t.cleanup(0)["files_removed"] == 0
    with pytest.raises(InvalidOptionError):
        t.cleanup(-1)
    with pytest.raises(InvalidOptionError):
        t.cleanup("a week")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        t.cleanup(0, safety_margin=-1)
    with pytest.raises(ReadOnlyTableError):
        t.checkout(v).cleanup(0)


def test_restore(table: Table) -> None:
    v = table.version
    table.delete("tag = 'even'")
    table.append(_rows(range(12, 14)))
    assert table.count_rows() == 8
    assert table.restore(v) == v + 3
    assert table.count_rows() == 12 and sorted(_keys(table.to_arrow(columns=["key"]))) == list(range(12))
    history = table.versions()
    assert history[-1]["operation"] == "restore" and history[-1]["row_count"] == 12
    assert (history[-1]["rows_added"], history[-1]["rows_deleted"]) == (6, 2)
    assert table.restore(v + 3) == v + 3  # the current contents already: no new version
    assert table.restore(v + 2) == v + 4 and table.count_rows() == 8  # restoring is itself undoable
    with pytest.raises(VersionNotFoundError):
        table.restore(999)
    with pytest.raises(ReadOnlyTableError):
        table.checkout(v).restore(v)
    assert table.version == v + 4


def test_changes(table: Table) -> None:
    v = table.version
    table.update("key = 3", [{"key": 3, "title": "rewritten", "tag": "odd", "emb": [0, 0, 0, 1]}])
    table.delete("key = 4")
    table.append(_rows(range(12, 13)))
    old = table.checkout(v).to_arrow(columns=["_id", "key"])
    ids = dict(zip(_keys(old), old.column("_id").to_pylist(), strict=True))
    feed = table.changes(v)
    assert feed.column_names == ["_change", "_id", "key", "title", "tag", "emb"]
    assert feed.schema.field("_change").type == pa.string() and feed.schema.field("_id").type == pa.uint64()
    got = [(r["_change"], r["key"], r["title"]) for r in feed.select(["_change", "key", "title"]).to_pylist()]
    assert got == [
        ("delete", 3, TITLES[3]),
        ("insert", 3, "rewritten"),
        ("delete", 4, TITLES[4]),
        ("insert", 12, TITLES[0]),
    ]
    assert feed.column("_id").to_pylist()[:3] == [ids[3], ids[3], ids[4]]
    assert feed.column("emb")[1].as_py() == [0.0, 0.0, 0.0, 1.0]
    only = table.changes(v, v + 2, columns=["key"])
    assert only.column_names == ["_change", "_id", "key"]
    assert [(r["_change"], r["key"]) for r in only.to_pylist()] == [("delete", 3), ("insert", 3), ("delete", 4)]
    assert table.changes(v + 1, v + 2, columns=[]).column_names == ["_change", "_id"]
    assert table.changes(v, v).num_rows == 0
    assert table.checkout(v + 1).changes(v).num_rows == 2  # a past handle's changes end at its version
    with pytest.raises(InvalidInputError):
        table.changes(v + 1, v)
    with pytest.raises(UnknownColumnError):
        table.changes(v, columns=["nope"])
    with pytest.raises(VersionNotFoundError):
        table.changes(999)


def test_versions_and_as_of(db: Catalog, table: Table) -> None:
    table.delete("key = 0")
    table.append(_rows(range(12, 14)))
    history = table.versions()
    assert [h["operation"] for h in history] == ["create", "append", "delete", "append"]
    assert [h["row_count"] for h in history] == [0, 12, 11, 13]
    assert set(history[0]) == {"version", "timestamp_ms", "operation", "rows_added", "rows_deleted", "row_count"}
    for h in history:
        # the version current at a commit's time: the last one committed by then (two may share a millisecond)
        expected = max(x["version"] for x in history if x["timestamp_ms"] <= h["timestamp_ms"])
        at = db.open_table(table.name, as_of=h["timestamp_ms"])
        assert at.version == expected and at.count_rows() == history[expected - 1]["row_count"]
        when = datetime.datetime.fromtimestamp(h["timestamp_ms"] / 1000, datetime.UTC)
        assert table.checkout(as_of=when).version == expected
        assert table.checkout(as_of=when.replace(tzinfo=None)).version == expected  # naive means UTC
    past = table.checkout(3)
    assert [h["version"] for h in past.versions()] == [1, 2, 3]
    assert past.count_rows() == 11 and past.stats()["row_count"] == 11
    with pytest.raises(ReadOnlyTableError):
        past.append(_rows(range(1)))
    with pytest.raises(VersionNotFoundError):
        db.open_table(table.name, as_of=history[0]["timestamp_ms"] - 1)  # before the table existed
    with pytest.raises(InvalidOptionError):
        db.open_table(table.name, 2, as_of=history[0]["timestamp_ms"])
    assert table.checkout(as_of=np.int64(history[1]["timestamp_ms"])).version >= 2  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        table.checkout()
    with pytest.raises(InvalidInputError):
        table.checkout(as_of="yesterday")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        table.checkout(as_of=float("nan"))
    bads: tuple[Any, ...] = (0, "2", True)
    for bad in bads:
        with pytest.raises(InvalidInputError):
            db.open_table(table.name, bad)
        with pytest.raises(InvalidInputError):
            table.changes(bad)
        with pytest.raises(InvalidInputError):
            table.restore(bad)


def test_bm25_after_delete(table: Table) -> None:
    """Full-text search keeps working once rows are deleted: the deleted rows just stop matching."""
    table.delete("key >= 9")
    result = table.bm25_search("title", "supersonic boundary", k=5, projection=["key"])
    assert set(_keys(result)[:2]) == {0, 6} and max(_keys(result)) < 9
    assert sorted(_keys(table.bm25_search("title", "flutter", k=5, projection=["key"]))) == [3]


# -- schema evolution (docs/schema.md): each change one commit, readable at older versions, on every side ------
def _evolving(db: Catalog) -> Table:
    """12 rows without indexes on ``body`` and ``vec`` (a plain vector column), to index them later."""
    fields: list[pa.Field] = [
        pa.field("key", pa.int32()),
        pa.field("body", pa.string()),
        pa.field("ratio", pa.float32()),
        pa.field("vec", pa.list_(pa.float32(), DIM), nullable=False),
    ]
    t = db.create_table(f"e_{uuid.uuid4().hex[:8]}", pa.schema(fields))
    rng = np.random.default_rng(7)  # distinct vectors: no ties between distances
    rows = [
        {"key": k, "body": TITLES[k % 6] + f" part {k}", "ratio": k / 4, "vec": rng.normal(size=DIM).tolist()}
        for k in range(12)
    ]
    t.append(rows[:6])
    t.append(rows[6:])  # two superfiles
    return t


def test_add_columns(table: Table) -> None:
    v = table.version
    assert table.add_columns([pa.field("note", pa.string())]) == v + 1
    assert table.add_columns(pa.schema([pa.field("rank", pa.int64(), nullable=False)]), defaults={"rank": 7}) == v + 2
    assert table.schema.names == ["_id", "key", "title", "tag", "emb", "note", "rank"]
    assert table.schema.field("rank").type == pa.int64() and not table.schema.field("rank").nullable
    rows = table.to_arrow(columns=["key", "note", "rank"]).sort_by("key")
    assert rows.to_pylist() == [{"key": k, "note": None, "rank": 7} for k in range(12)]  # nothing was rewritten
    table.append([{"key": 12, "title": "new", "tag": "even", "emb": [0, 0, 1, 0], "note": "n"}])  # rank: default
    table.append([{"key": 13, "title": "new", "tag": "odd", "emb": [0, 0, 1, 0], "rank": 1}])
    assert table.count_rows("rank = 7") == 13 and table.count_rows("note IS NULL") == 13
    assert table.to_arrow(columns=["note", "rank"], where="key >= 12").to_pylist() == [
        {"note": "n", "rank": 7},
        {"note": None, "rank": 1},
    ]
    hit = table.bm25_search("title", "flutter", k=2, projection=["key", "rank"])
    assert sorted(hit.to_pylist(), key=lambda r: r["key"])[0]["rank"] == 7
    old = table.checkout(v)  # the version before reads its own schema
    assert old.schema.names == ["_id", "key", "title", "tag", "emb"] and old.to_arrow().num_rows == 12
    assert [h["operation"] for h in table.versions()][-4:-2] == ["add_columns", "add_columns"]
    with pytest.raises(SchemaChangeError):
        table.add_columns([pa.field("note", pa.string())])  # taken
    with pytest.raises(SchemaChangeError):
        table.add_columns([pa.field("strict", pa.int64(), nullable=False)])  # not null needs a default
    with pytest.raises(SchemaMismatchError):
        table.add_columns([pa.field("n", pa.int64())], defaults={"n": "seven"})
    with pytest.raises(UnknownColumnError):
        table.add_columns([pa.field("n", pa.int64())], defaults={"other": 1})
    with pytest.raises(InvalidOptionError):
        table.add_columns([pa.field("_hidden", pa.int64())])
    with pytest.raises(ReadOnlyTableError):
        old.add_columns([pa.field("n", pa.int64())])
    assert table.schema.names[-2:] == ["note", "rank"]


def test_rename_and_drop_columns(db: Catalog, table: Table) -> None:
    v = table.version
    table.rename_column("title", "headline")
    assert "headline" in table.schema.names and "title" not in table.schema.names
    assert dict(table.options.fts_columns) == {"headline": "english", "tag": "english"}  # the index follows
    found = table.bm25_search("headline", "flutter", k=5, projection=["key", "headline"])
    assert sorted(_keys(found)) == [3, 9] and found.column_names == ["_id", "score", "key", "headline"]
    assert table.count_rows("headline = 'supersonic wing flutter'") == 2
    assert db.sql(f"SELECT count(*) AS n FROM {table.name} WHERE headline LIKE '%layer%'").to_pylist() == [{"n": 4}]
    renamed = table.version
    table.drop_columns("tag")
    assert table.schema.names == ["_id", "key", "headline", "emb"] and "tag" not in table.options.fts_columns
    with pytest.raises(UnknownColumnError):
        table.bm25_search("tag", "even")
    with pytest.raises(UnknownColumnError):
        table.to_arrow(columns=["tag"])
    table.add_columns([pa.field("tag", pa.int64())])  # the name again: a new column, not the old values
    assert table.to_arrow(columns=["tag"]).column("tag").null_count == 12
    old = table.checkout(v)  # older versions keep their names, values and indexes
    assert old.schema.names == ["_id", "key", "title", "tag", "emb"]
    assert sorted(_keys(old.bm25_search("title", "flutter", k=5, projection=["key"]))) == [3, 9]
    assert old.count_rows("tag = 'even'") == 6
    assert table.checkout(renamed).to_arrow(columns=["tag"]).column("tag").to_pylist()[:2] == ["even", "odd"]
    with pytest.raises(SchemaChangeError):
        table.rename_column("headline", "key")
    with pytest.raises(SchemaChangeError):
        table.drop_columns("_id")
    with pytest.raises(UnknownColumnError):
        table.drop_columns(["nope"])
    with pytest.raises(UnknownColumnError):
        table.rename_column("nope", "other")


def test_alter_column_type(db: Catalog) -> None:
    t = _evolving(db)
    v = t.version
    t.alter_column_type("key", pa.int64())
    t.alter_column_type("ratio", pa.float64())
    t.alter_column_type("body", pa.large_string())
    assert [t.schema.field(c).type for c in ("key", "ratio", "body")] == [pa.int64(), pa.float64(), pa.large_string()]
    rows = t.to_arrow(columns=["key", "ratio", "body"], where="key >= 10")
    assert rows.schema.field("key").type == pa.int64() and rows.schema.field("body").type == pa.large_string()
    assert rows.to_pylist() == [
        {"key": 10, "ratio": 2.5, "body": TITLES[4] + " part 10"},
        {"key": 11, "ratio": 2.75, "body": TITLES[5] + " part 11"},
    ]
    t.append([{"key": 2**40, "body": "wide", "ratio": 0.1, "vec": [1, 0, 0, 0]}])  # fits int64 only
    assert t.count_rows(f"key = {2**40}") == 1 and t.count_rows("key < 5") == 5
    assert t.checkout(v).schema.field("key").type == pa.int32()  # the older version keeps its type
    for column, bad in (("key", pa.int32()), ("key", pa.float64()), ("body", pa.int64()), ("vec", pa.string())):
        with pytest.raises(SchemaChangeError):
            t.alter_column_type(column, bad)


def test_create_and_drop_indexes(db: Catalog) -> None:
    t = _evolving(db)
    before = t.version
    with pytest.raises(UnknownColumnError):
        t.bm25_search("body", "flutter")
    t.create_fts_index("body", tokenizer="english")
    t.create_vector_index("vec", metric="l2")
    assert dict(t.options.fts_columns) == {"body": "english"} and t.options.vector_columns["vec"].metric == "l2"
    q = [0.3, -0.2, 0.9, 0.1]

    def searches() -> list[Any]:
        bm25 = t.bm25_search("body", "boundary layer", k=20, projection=["key"])
        return [
            list(zip(_keys(bm25), bm25.column("score").to_pylist(), strict=True)),
            sorted(_keys(t.token_match("body", ["boundary", "layer"], projection=["key"]))),
            sorted(_keys(t.exact_match("body", TITLES[3] + " part 9", projection=["key"]))),
            sorted(_keys(t.bm25_search_prefix("body", "hyper", projection=["key"]))),
            _keys(t.vector_search("vec", q, k=4, projection=["key"])),
            _keys(t.vector_search("vec", q, k=3, where="key >= 6", projection=["key"])),
        ]

    # usable at once: superfiles written before the index are searched exactly (or already rewritten with it)
    first = searches()
    assert sorted(k for k, _ in first[0]) == [0, 1, 5, 6, 7, 11]
    assert first[1] == [0, 1, 6, 7] and first[2] == [9] and first[3] == [2, 8]
    t.optimize()  # the superfiles are rewritten with the indexes (the background rewrite does it too)
    assert t.stats()["unindexed_superfiles"] == 0
    second = searches()
    assert [k for k, _ in second[0]] == [k for k, _ in first[0]]
    assert [s for _, s in second[0]] == pytest.approx([s for _, s in first[0]], rel=1e-5)
    assert second[1:] == first[1:]
    with pytest.raises(UnknownColumnError):
        t.checkout(before).bm25_search("body", "flutter")  # the version before the index has none
    indexed = t.version
    t.drop_index("body")
    t.drop_index("vec")
    assert not t.options.fts_columns and not t.options.vector_columns
    with pytest.raises(UnknownColumnError):
        t.bm25_search("body", "flutter")
    with pytest.raises(UnknownColumnError):
        t.vector_search("vec", q)
    t.append([{"key": 12, "body": "after", "ratio": 0.0, "vec": [0, 0, 0, 1]}])
    vectors = t.to_arrow(columns=["key", "vec"]).sort_by("key")  # from the index blobs and, since, from Parquet
    assert vectors.column("vec")[12].as_py() == [0, 0, 0, 1] and vectors.column("vec").null_count == 0
    assert t.checkout(indexed).bm25_search("body", "flutter", projection=["key"]).num_rows == 2
    with pytest.raises(InvalidOptionError):
        t.create_fts_index("key")  # not a string column
    with pytest.raises(UnknownColumnError):
        t.drop_index("ratio")
    with pytest.raises(UnknownColumnError):
        t.create_fts_index("nope")
    t.add_columns([pa.field("maybe", pa.list_(pa.float32(), DIM))])
    with pytest.raises(SchemaChangeError):
        t.create_vector_index("maybe")  # nullable: a vector index needs a vector in every row
