"""``superfile.connect_async``: the shared API suite's important subset, awaited, on both sides: embedded
(``file://``, the sync engine in worker threads) and remote (the httpx SDK against a real gateway, the
same kind test_api.py's remote side runs). Each test is one ``asyncio.run``; the scenarios are typed
against ``superfile.api.AsyncCatalog``/``AsyncTable``, the protocol both async classes subclass.

Then what only the remote side has: concurrent searches over one connection really overlap, a lost answer to
a write is retried once and committed once, and a missing API key's error names ``SUPERFILE_API_KEY``.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.api import AsyncCatalog, AsyncTable
from superfile.errors import (
    InvalidOptionError,
    InvalidTableNameError,
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
from superfile.remote import AsyncRemoteConnection, AuthenticationError, GatewayUnavailableError
from superfile.threaded import ThreadedCatalog
from superfile_gateway import BackgroundServer, Settings, parse_api_keys
from superfile_suite.faults import Faults, FaultyHttpProxy, first_try_of_each_write
from test_api import DIM, SCHEMA, SIMPLE, TITLES, _keys, _rows

KEY = "async-test-key"


@dataclass
class Side:
    """Where ``connect_async`` goes, with its options; ``storage``: the same root opened by the sync engine."""

    uri: str
    storage: str
    options: dict[str, Any] = field(default_factory=dict)

    def run(self, scenario: Callable[[AsyncCatalog], Awaitable[None]]) -> None:
        """``scenario`` on a fresh async connection, in its own event loop."""

        async def main() -> None:
            async with await superfile.connect_async(self.uri, **self.options) as db:
                await scenario(db)

        asyncio.run(main())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    storage = f"file://{tmp_path_factory.mktemp('async-remote')}"
    settings = Settings(storage=storage, api_keys=parse_api_keys(f"{KEY}:*:rw"), cleanup_min_age_s=0)
    with BackgroundServer(settings) as server:
        yield Side(server.url, storage, {"api_key": KEY})


@pytest.fixture(scope="module", params=["embedded", "remote"])
def side(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Side:
    if request.param == "remote":
        gateway: Side = request.getfixturevalue("gateway")
        return gateway
    storage = f"file://{tmp_path_factory.mktemp('async-embedded')}"
    return Side(storage, storage)


async def _table(db: AsyncCatalog) -> AsyncTable:
    """A fresh table with 12 rows, as test_api.py's ``table`` fixture."""
    t = await db.create_table(
        f"t_{uuid.uuid4().hex[:8]}", SCHEMA, fts_columns=["title", "tag"], vector_columns={"emb": {"dim": DIM}}
    )
    await t.append(_rows(range(12)))
    return t


def test_connect_async_picks_the_side(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        remote = side.uri.startswith("http")
        assert isinstance(db, AsyncRemoteConnection if remote else ThreadedCatalog)
        assert db.uri == side.uri

    side.run(scenario)


def test_catalog(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        name = f"c_{uuid.uuid4().hex[:8]}"
        t = await db.create_table(name, SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM})
        assert name in await db.table_names()
        assert await t.version() == 1
        assert t.schema.names == ["_id", "key", "title", "tag", "emb"]
        assert dict(t.options.fts_columns) == {"title": "english"}
        with pytest.raises(TableExistsError):
            await db.create_table(name, SIMPLE)
        again = await db.create_table(name, SCHEMA, vector_columns={"emb": DIM}, exist_ok=True, data=_rows(range(3)))
        assert await again.count_rows() == 0
        assert (await db.open_table(name)).schema.equals(t.schema)
        with pytest.raises(TableNotFoundError):
            await db.open_table(f"missing_{uuid.uuid4().hex[:6]}")
        with pytest.raises(InvalidTableNameError):
            await db.open_table("../escape")
        with pytest.raises(UnknownColumnError):
            await db.create_table(f"bad_{uuid.uuid4().hex[:6]}", SIMPLE, fts_columns=["nope"])
        data = pa.table({"key": [1, 2], "title": ["a b", "c d"]})
        made = await db.create_table(f"d_{uuid.uuid4().hex[:8]}", data=data, fts_columns=["title"])
        assert (await made.to_arrow(columns=["key", "title"])).equals(data)
        await db.drop_table(name)
        assert name not in await db.table_names()
        with pytest.raises(TableNotFoundError):
            await db.drop_table(name)

    side.run(scenario)


def test_append_and_read(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        v = await table.version()
        assert await table.append(pa.Table.from_pylist(_rows(range(12, 15)), schema=SCHEMA)) == v + 1
        assert await table.count_rows() == 15
        assert await table.count_rows("tag = 'even'") == 8
        rows = await table.to_arrow(columns=["key", "title"], where="key >= 12")
        assert rows.to_pylist() == [{"key": k, "title": TITLES[k % 6]} for k in (12, 13, 14)]
        assert [h["operation"] for h in await table.versions()] == ["create", "append", "append"]
        assert (await table.stats())["row_count"] == 15
        with pytest.raises(SchemaMismatchError):
            await table.append([{"key": 1, "nope": "x", "emb": [0, 0, 0, 1]}])
        assert await table.version() == v + 1

    side.run(scenario)


def test_every_search_kind(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        bm25 = await table.bm25_search("title", "supersonic boundary", k=5, projection=["key", "title"])
        assert bm25.column_names == ["_id", "score", "key", "title"] and set(_keys(bm25)[:2]) == {0, 6}
        assert sorted(_keys(await table.bm25_search_prefix("title", "hyper", projection=["key"]))) == [2, 8]
        both = await table.token_match("title", ["boundary", "layer"], "and", projection=["key"])
        assert sorted(_keys(both)) == [0, 1, 6, 7]
        exact = await table.exact_match("title", "supersonic wing flutter", projection=["key"])
        assert sorted(_keys(exact)) == [3, 9]
        nearest = await table.vector_search("emb", np.array([1.0, 0.0, 0.0, 0.0]), k=3, projection=["key"])
        assert set(_keys(nearest)) == {0, 4, 8}
        where = await table.vector_search("emb", [0.0, 1.0, 0.0, 0.0], k=2, where="key > 4", projection=["key"])
        assert _keys(where) == [9, 5]
        fused = await table.hybrid_search("title", "flutter", "emb", [0.0, 0.0, 0.0, 1.0], k=4, projection=["key"])
        assert len(fused) == 4 and _keys(fused)[0] == 3
        request = superfile.Bm25Search(column="title", query="flutter", k=3, projection=["key"])
        assert (await table.search(request)).equals(await table.bm25_search("title", "flutter", 3, projection=["key"]))
        with pytest.raises(UnknownColumnError):
            await table.bm25_search("nope", "x")
        with pytest.raises(InvalidOptionError):
            await table.bm25_search("title", "x", k=0)
        with pytest.raises(VectorDimensionError):
            await table.vector_search("emb", [1.0, 0.0], k=1)
        with pytest.raises(QueryLimitError, match="4 rows match"):
            await table.token_match("title", "flutter laminar", "or", max_rows=3)

    side.run(scenario)


def test_sql(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        assert (await db.sql(f"SELECT count(*) AS n FROM {table.name} WHERE tag = 'odd'")).to_pylist() == [{"n": 6}]
        top = await db.sql(f"SELECT key FROM bm25_search('{table.name}', 'title', 'flutter', 5) ORDER BY key")
        assert top.column("key").to_pylist() == [3, 9]
        with pytest.raises(SqlError):
            await db.sql(f"SELECT nope FROM {table.name}")
        with pytest.raises(QueryLimitError, match="more than 2 rows"):
            await db.sql(f"SELECT key FROM {table.name}", max_rows=2)

    side.run(scenario)


def test_update_delete_checkout(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        v = await table.version()
        row = [{"key": 3, "title": "rewritten title", "tag": "odd", "emb": [0, 0, 0, 1]}]
        assert await table.update("key = 3", row) == v + 1
        assert (await table.to_arrow(columns=["title"], where="key = 3")).column("title").to_pylist() == [
            row[0]["title"]
        ]
        assert await table.delete("tag = 'even'") == v + 2
        assert await table.count_rows() == 6
        old = await table.checkout(v)
        assert await old.count_rows() == 12 and await old.version() == v
        with pytest.raises(ReadOnlyTableError):
            await old.append(_rows(range(1)))
        with pytest.raises(VersionNotFoundError):
            await table.checkout(999)

    side.run(scenario)


def test_idempotent_append_and_properties(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        assert await (await table.checkout(1)).properties() == {}  # as created (a remote append keys itself)
        v = await table.append(_rows(range(20, 22)), idempotency_key="batch-20")
        assert await table.append(_rows(range(20, 22)), idempotency_key="batch-20") == v
        assert await table.count_rows() == 14 and await table.version() == v
        assert await table.idempotency_version("batch-20") == v
        assert await table.idempotency_version("never-used") is None
        assert await table.properties()

    side.run(scenario)


def test_restore_and_changes(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        v = await table.version()
        await table.update("key = 3", [{"key": 3, "title": "rewritten", "tag": "odd", "emb": [0, 0, 0, 1]}])
        await table.delete("key = 4")
        feed = await table.changes(v, columns=["key"])
        assert [(r["_change"], r["key"]) for r in feed.to_pylist()] == [("delete", 3), ("insert", 3), ("delete", 4)]
        assert (await (await table.checkout(v + 1)).changes(v)).num_rows == 2
        assert await table.restore(v) == v + 3
        assert await table.count_rows() == 12
        assert (await table.versions())[-1]["operation"] == "restore"

    side.run(scenario)


def test_versions_and_as_of(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        await table.delete("key = 0")
        history = await table.versions()
        last = history[-1]
        at = await db.open_table(table.name, as_of=last["timestamp_ms"])
        assert await at.version() == last["version"] and await at.count_rows() == 11
        when = datetime.datetime.fromtimestamp(history[1]["timestamp_ms"] / 1000, datetime.UTC)
        assert await (await table.checkout(as_of=when)).version() >= 2
        with pytest.raises(VersionNotFoundError):
            await db.open_table(table.name, as_of=history[0]["timestamp_ms"] - 1)
        with pytest.raises(InvalidOptionError):
            await table.checkout()

    side.run(scenario)


def test_optimize_and_cleanup(side: Side) -> None:
    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        await table.append(_rows(range(12, 14)))
        result = await table.optimize()
        assert (result["superfiles_removed"], result["superfiles_added"]) == (2, 1)
        dry = await table.cleanup(0, dry_run=True)
        assert dry["dry_run"] is True and dry["files_removed"] > 0
        assert await table.count_rows() == 14

    side.run(scenario)


def test_schema_evolution(side: Side) -> None:
    """Every schema change awaited, each one commit; the handle takes the new schema and options."""

    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        v = await table.version()
        assert await table.add_columns([pa.field("rank", pa.int32(), nullable=False)], defaults={"rank": 2}) == v + 1
        assert await table.rename_column("title", "headline") == v + 2
        assert await table.alter_column_type("rank", pa.float64()) == v + 3
        assert await table.drop_columns(["tag"]) == v + 4
        assert table.schema.names == ["_id", "key", "headline", "emb", "rank"]
        assert table.schema.field("rank").type == pa.float64() and "headline" in table.options.fts_columns
        assert (await table.to_arrow(columns=["rank"])).column("rank").to_pylist() == [2.0] * 12
        assert await table.drop_index("headline") == v + 5 and not table.options.fts_columns
        await table.create_fts_index("headline", tokenizer="simple")
        await table.drop_index("emb")
        await table.create_vector_index("emb", metric="l2")
        assert dict(table.options.fts_columns) == {"headline": "simple"}
        assert table.options.vector_columns["emb"].metric == "l2"
        found = await table.bm25_search("headline", "flutter", k=5, projection=["key"])
        assert sorted(_keys(found)) == [3, 9]
        assert _keys(await table.vector_search("emb", [0.0, 0.0, 0.0, 1.0], k=1, projection=["key"])) == [3]
        old = await table.checkout(v)
        assert old.schema.names == ["_id", "key", "title", "tag", "emb"]
        with pytest.raises(SchemaChangeError):
            await table.alter_column_type("key", pa.int32())

    side.run(scenario)


def test_concurrent_searches_match_the_sync_ones(side: Side) -> None:
    """Eight searches gathered on one async connection give what the sync SDK gives, one by one."""
    queries = ["supersonic", "boundary layer", "flutter", "heat", "laminar flow", "shock", "wing", "transfer"]

    async def scenario(db: AsyncCatalog) -> None:
        table = await _table(db)
        results = await asyncio.gather(*(table.bm25_search("title", q, k=4, projection=["key"]) for q in queries))
        with superfile.connect(side.uri, **side.options) as sync:
            same = sync.open_table(table.name)
            assert [r.to_pylist() for r in results] == [
                same.bm25_search("title", q, k=4, projection=["key"]).to_pylist() for q in queries
            ]

    side.run(scenario)


# -- what only the remote side has -----------------------------------------------------------------------------
def test_searches_from_one_connection_overlap(gateway: Side) -> None:
    """Every search is held 0.5 s by a proxy: eight gathered ones finish in far less than eight times that."""
    searches = Faults(delay=1.0, delay_s=0.5, match=lambda r: "/search/" in r.path)
    with FaultyHttpProxy(gateway.uri, searches) as proxy:
        through = Side(proxy.endpoint, gateway.storage, gateway.options)

        async def scenario(db: AsyncCatalog) -> None:
            table = await _table(db)
            started = time.monotonic()
            results = await asyncio.gather(*(table.bm25_search("title", "flutter", k=2) for _ in range(8)))
            took = time.monotonic() - started
            assert all(_keys(r) in ([3, 9], [9, 3]) for r in results)
            assert took < 2.0, f"8 searches delayed 0.5 s each took {took:.2f} s: they did not run concurrently"

        through.run(scenario)
        assert proxy.faults.counts["delay"] == 8


def test_a_lost_answer_to_a_write_is_retried_and_committed_once(gateway: Side) -> None:
    """The first answer to every write is lost after the gateway carried it out; the async SDK repeats each
    write once with the request key it made, and each commits once."""
    name = f"lost_{uuid.uuid4().hex[:8]}"
    superfile.connect(gateway.storage).create_table(name, SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM})
    with FaultyHttpProxy(gateway.uri, Faults(lose=1.0, match=first_try_of_each_write())) as proxy:

        async def scenario(db: AsyncCatalog) -> None:
            table = await db.open_table(name)
            versions = [await table.append(_rows(range(n, n + 1))) for n in range(5)]
            assert versions == [2, 3, 4, 5, 6]
            assert await table.delete("key = 0") == 7
            assert await table.restore(6) == 8

        Side(proxy.endpoint, gateway.storage, gateway.options).run(scenario)
        assert proxy.faults.counts["lose"] == 7
    engine = superfile.connect(gateway.storage).open_table(name)
    assert engine.version == 8 and sorted(_keys(engine.to_arrow(columns=["key"]))) == [0, 1, 2, 3, 4]
    assert [v["operation"] for v in engine.versions()] == ["create", *["append"] * 5, "delete", "restore"]


def test_no_retry_past_max_retries(gateway: Side) -> None:
    """With ``max_retries=0`` the lost answer is the caller's to handle: a typed error, not a hang."""
    with FaultyHttpProxy(gateway.uri, Faults(lose=1.0, match=lambda r: r.path.startswith("/tables"))) as proxy:

        async def scenario(db: AsyncCatalog) -> None:
            with pytest.raises(GatewayUnavailableError):
                await db.table_names()

        Side(proxy.endpoint, gateway.storage, {**gateway.options, "max_retries": 0}).run(scenario)
        assert proxy.faults.counts["lose"] == 1


def test_a_missing_key_names_the_variable(gateway: Side, monkeypatch: pytest.MonkeyPatch) -> None:
    """As connect(): no key is a 401 that says how to give one; connect_async reads SUPERFILE_API_KEY."""

    async def names(db: AsyncCatalog) -> None:
        await db.table_names()

    monkeypatch.delenv("SUPERFILE_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match=r"api_key=\.\.\. .*SUPERFILE_API_KEY"):
        Side(gateway.uri, gateway.storage).run(names)
    monkeypatch.setenv("SUPERFILE_API_KEY", KEY)
    Side(gateway.uri, gateway.storage).run(names)
