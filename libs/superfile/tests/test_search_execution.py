"""How a search is executed never changes its answer (issue 20: per-query cost).

A search alone may spread its kernels over the query pool and run hybrid's halves at once; with the cores
busy it runs on its caller's thread, one half after the other. The IVF union picks its rerank pool from a
sampled bound instead of a full partition. These tests hold every search kind, over superfiles with and
without deletion vectors (the union paths and the per-superfile paths), to the same ids, order and scores
whichever way it runs.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from hypothesis import given, settings
from hypothesis import strategies as st
from superfile import pools
from superfile.format.ranking import rrf_scores
from superfile.search.request import HybridSearch
from superfile.table import results
from superfile.table.search import Searcher, _NewestSnapshots, _ranking

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield" / "docs.parquet"
QUERIES = 12
Answer = list[tuple[list[Any], list[Any]]]


@pytest.fixture(scope="module")
def cranfield() -> pa.Table:
    return pq.read_table(CRANFIELD)


@pytest.fixture(scope="module", params=["appends", "deletes"])
def db(request: pytest.FixtureRequest, cranfield: pa.Table) -> superfile.Connection:
    """Cranfield in 7 superfiles; with ``deletes``, 30 rows deleted (no union: every superfile searched alone)."""
    db = superfile.connect(f"memory://execution-{os.urandom(6).hex()}")
    t = db.create_table(
        "docs",
        cranfield.schema,
        fts_columns=["title", "text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
    )
    for a in range(0, cranfield.num_rows, 200):
        t.append(cranfield.slice(a, 200))
    if request.param == "deletes":
        t.delete("id % 47 = 0")
    return db


@pytest.fixture
def table(db: superfile.Connection) -> superfile.Supertable:
    return db.open_table("docs")


def every_kind(t: superfile.Supertable, docs: pa.Table, i: int) -> Answer:
    """One query of every search kind (and SQL's search table functions), as (ids, scores) lists."""
    title = docs["title"][i].as_py()
    vector = np.asarray(docs["embedding"][i].as_py(), np.float32)
    word = max(title.split(), key=len)
    results = [
        t.bm25_search("text", title),
        t.bm25_search("text", title, mode="all"),
        t.bm25_search_prefix("text", word[:3]),
        t.token_match("title", word.lower(), max_rows=2000),
        t.exact_match("title", title),
        t.vector_search("embedding", vector),
        t.vector_search("embedding", vector, nprobe=2, rerank=12),
        t.vector_search("embedding", vector, where="id % 3 = 0"),
        t.vector_search("embedding", vector, filter={"column": "text", "query": word}),
        t.hybrid_search("text", title, "embedding", vector),
    ]
    return [(r.column("_id").to_pylist(), r.column("score").to_pylist()) for r in results]


def answers(t: superfile.Supertable, docs: pa.Table, queries: range) -> list[Answer]:
    return [every_kind(t, docs, i) for i in queries]


def test_concurrent_searches_answer_as_one_at_a_time(table: superfile.Supertable, cranfield: pa.Table) -> None:
    """Alone, a search may spread over the pool; four at once each run on their own thread. Same answers."""
    queries = range(0, 7 * QUERIES, 7)
    alone = answers(table, cranfield, queries)
    assert any(ids for answer in alone for ids, _ in answer[:10])  # the queries find rows
    with ThreadPoolExecutor(4) as ex:
        rounds = [ex.submit(answers, table, cranfield, queries) for _ in range(4)]
        together = [r.result(timeout=300) for r in rounds]
    assert all(t == alone for t in together)


def test_answers_held_keep_their_rows(table: superfile.Supertable, cranfield: pa.Table) -> None:
    """A ranked answer of ``_id`` and ``score`` is a slice of a per-thread arena (``table.results``): answers
    held while two threads go on searching, past several arenas each, keep the rows they were given."""
    queries = list(range(0, 9 * QUERIES, 3))
    kept = ["_id", "score"]

    def held(offset: int) -> list[pa.Table]:
        found = []
        for i in queries[offset::2]:
            title = cranfield["title"][i].as_py()
            vector = np.asarray(cranfield["embedding"][i].as_py(), np.float32)
            found += [
                table.bm25_search("text", title, k=50, projection=kept),
                table.vector_search("embedding", vector, k=50, projection=kept),
                table.hybrid_search("text", title, "embedding", vector, k=50, projection=kept),
            ]
        return found

    with ThreadPoolExecutor(2) as ex:
        answers = [t for half in ex.map(held, [0, 1]) for t in half]
    assert sum(t.num_rows for t in answers) > 4 * results._ROWS  # arenas filled and replaced in both threads
    again = held(0) + held(1)
    assert [t.schema for t in answers] == [t.schema for t in again]
    assert [t.to_pylist() for t in answers] == [t.to_pylist() for t in again]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from([0.0, 0.5, 1.0, float("nan")])),
        max_size=12,
        unique_by=lambda h: h[0],
    ),
    st.booleans(),
    st.booleans(),
    st.integers(1, 13),
)
def test_ranking_is_the_sort_by_score_then_id(
    hits: list[tuple[int, float]], descending: bool, by_id: bool, k: int
) -> None:
    """Hits taken as they came (already ranked) or sorted: either way the sort by score, ties by ``_id``."""
    ids = np.asarray([i for i, _ in hits], np.uint64)
    scores = np.asarray([s for _, s in hits], np.float32)
    order = _ranking(ids, None if by_id else scores, descending, k)
    by_score = np.lexsort((ids, -scores if descending else scores))
    expected = np.argsort(ids, kind="stable")[:k] if by_id else by_score[:k]
    assert ids[order].tolist() == ids[expected].tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), max_size=40, unique=True), max_size=3), st.integers(0, 100))
def test_rrf_scores_are_the_running_sum_bit_for_bit(rankings: list[list[int]], rrf_k: int) -> None:
    """Each id's fused score is what a running Python sum over the lists, in order, gives, to the last bit."""
    want: dict[int, float] = {}
    for ranked in rankings:
        for rank, i in enumerate(ranked, start=1):
            want[i] = want.get(i, 0.0) + 1.0 / (rrf_k + rank)
    ids, fused = rrf_scores([np.asarray(r, np.uint64) for r in rankings], rrf_k)
    assert ids.tolist() == sorted(want)
    assert fused.tolist() == [want[i] for i in sorted(want)]


def test_newest_snapshots_keep_each_tables_latest_and_drop_the_released() -> None:
    """Per-snapshot search state: loaded once while among a table's ``keep`` latest, loaded again once passed by
    newer ones or released, the most recent one included (it is answered from a dict of its own)."""
    state = _NewestSnapshots(keep=2)
    loads: list[str] = []

    def get(table: str, snapshot: str) -> str:
        return state.get_or_load(table, snapshot, lambda: loads.append(snapshot) or f"{table}@{snapshot}")

    assert [get("file:///a#text", s) for s in ("1", "1", "2", "1", "2", "2")] == [
        "file:///a#text@" + s for s in ("1", "1", "2", "1", "2", "2")
    ]
    assert loads == ["1", "2"]
    get("file:///b#text", "1")  # another table's state is its own
    assert loads == ["1", "2", "1"]
    get("file:///a#text", "3")  # passes 1: two kept
    get("file:///a#text", "1")
    assert loads == ["1", "2", "1", "3", "1"]
    state.release("file:///a", keep=lambda snapshot: snapshot != "1")  # the most recent released
    get("file:///a#text", "1")
    get("file:///b#text", "1")  # released by the other table's name only
    assert loads == ["1", "2", "1", "3", "1", "1"]
    state.clear()
    get("file:///b#text", "1")
    assert loads[-1] == "1" and len(loads) == 7

    def cleared_meanwhile() -> str:  # a segment merged while this load ran: its union is stale
        state.clear()
        return "stale"

    assert state.get_or_load("file:///c#text", "1", cleared_meanwhile) == "stale"
    assert state.get_or_load("file:///c#text", "1", lambda: "merged") == "merged"


def test_hybrid_halves_in_sequence_answer_as_halves_at_once(table: superfile.Supertable, cranfield: pa.Table) -> None:
    snapshot = table.snapshot()
    for i in range(0, 5 * QUERIES, 5):
        request = HybridSearch(
            text_column="text",
            query=cranfield["title"][i].as_py(),
            vector_column="embedding",
            vector=cranfield["embedding"][i].as_py(),
            k=10,
        )
        got = []
        for spread in (True, False):
            searcher = Searcher(snapshot)
            searcher.spread = spread
            found = searcher._search(request)  # the execution under test, without the policy
            got.append((found.column("_id").to_pylist(), found.column("score").to_pylist()))
        assert got[0] == got[1] and got[0][0]


def test_sql_search_functions_answer_alone_and_together(db: superfile.Connection, cranfield: pa.Table) -> None:
    queries = range(0, 3 * QUERIES, 3)

    def run(i: int) -> list[Any]:
        title = cranfield["title"][i].as_py().replace("'", "''")
        vector = "[" + ", ".join(repr(float(x)) for x in cranfield["embedding"][i].as_py()) + "]"
        found = db.sql(
            f"SELECT 'bm25' AS kind, _id, score FROM bm25_search('docs', 'text', '{title}', 10) "
            f"UNION ALL SELECT 'vector', _id, score FROM vector_search('docs', 'embedding', {vector}, 10) "
            f"UNION ALL SELECT 'hybrid', _id, score FROM hybrid_search('docs', 'text', '{title}', 'embedding', "
            f"{vector}, 10) ORDER BY kind, score DESC, _id"
        )
        return found.to_pylist()

    alone = [run(i) for i in queries]
    assert all(len(rows) == 30 for rows in alone)
    with ThreadPoolExecutor(3) as ex:
        together = list(ex.map(run, list(queries) * 3))
    assert together == alone * 3


def test_searching_spreads_only_while_cores_are_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERFILE_QUERY_THREADS", "4")
    seen: list[bool] = []
    inside = threading.Barrier(3, timeout=30)
    leave = threading.Event()

    def search() -> None:
        with pools.searching() as spread:
            seen.append(spread)
            inside.wait()
            leave.wait(30)

    with pools.searching() as alone:
        assert alone  # 1 of 4 threads' worth in flight
    workers = [threading.Thread(target=search) for _ in range(2)]
    for w in workers:
        w.start()
    inside.wait()  # two searches in flight: 2 * 2 <= 4, both may spread; a third may not
    with pools.searching() as third:
        assert not third
    leave.set()
    for w in workers:
        w.join(30)
    assert seen == [True, True]
    with pools.searching() as again:
        assert again
