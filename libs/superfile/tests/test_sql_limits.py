"""SQL limits: query text (length, depth, size after OR chains become IN lists), memory and result rows."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
import superfile
from superfile.errors import InvalidOptionError, QueryLimitError, SqlError
from superfile.sql.limits import SqlLimits, check_text


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> superfile.Connection:
    conn = superfile.connect(f"file://{tmp_path_factory.mktemp('limits')}")
    text = [f"word {i} " * 20 for i in range(1_400)]
    conn.create_table("a", data=pa.table({"id": pa.array(range(1_400), pa.int64()), "text": text}))
    return conn


def test_ten_thousand_ors_answer_as_an_in_list(db: superfile.Connection) -> None:
    ids = [i * 7 for i in range(10_000)]
    query = "SELECT count(*) AS n FROM a WHERE " + " OR ".join(f"id = {i}" for i in ids)
    assert db.sql(query).column("n").to_pylist() == [len([i for i in ids if i < 1_400])]


def test_or_chain_rewrite_keeps_other_shapes() -> None:
    limits = SqlLimits()
    mixed = "SELECT 1 FROM a WHERE " + " OR ".join(f"id = {i}" if i % 2 else f"x = {i}" for i in range(40))
    assert check_text(mixed, limits) == mixed  # two columns: not one IN list
    short = "SELECT 1 FROM a WHERE id = 1 OR id = 2"
    assert check_text(short, limits) == short
    long = "SELECT 1 FROM a WHERE " + " OR ".join(f"id = {i}" for i in range(20))
    assert "IN (0, 1, 2" in check_text(long, limits)


@pytest.mark.parametrize("depth", [300, 5_000])
def test_deep_nesting_is_refused_before_planning(db: superfile.Connection, depth: int) -> None:
    query = "SELECT count(*) FROM a WHERE " + "(" * depth + "id = 1" + ")" * depth
    with pytest.raises(QueryLimitError, match="nests"):
        db.sql(query)


def test_too_many_nodes_and_too_long_text_are_refused(db: superfile.Connection) -> None:
    many = "SELECT count(*) FROM a WHERE " + " OR ".join(f"(id = {i} AND text = 'x')" for i in range(5_000))
    with pytest.raises(QueryLimitError, match="expression nodes"):
        db.sql(many)
    with pytest.raises(QueryLimitError, match="characters"):
        db.sql("SELECT 1 -- " + "x" * 1_000_001)


def test_memory_limit_stops_a_cross_join_sort_with_a_typed_error(db: superfile.Connection) -> None:
    query = "SELECT a1.text || a2.text AS t FROM a a1, a a2 ORDER BY t DESC LIMIT 100000000"
    started = time.monotonic()
    with pytest.raises(QueryLimitError, match="268435456 bytes"):
        db.sql(query, memory_limit_bytes=256 << 20)
    assert time.monotonic() - started < 30
    assert isinstance(QueryLimitError("x"), SqlError)  # callers that catch SqlError keep working


def test_memory_limit_spills_a_sort_that_can(db: superfile.Connection) -> None:
    query = "SELECT a1.id * 1400 + a2.id AS k FROM a a1, a a2 ORDER BY (a1.id * 7919 + a2.id * 104729) % 1000003, k"
    rows = db.sql(query, memory_limit_bytes=32 << 20)  # unspilled this sort needs > 64 MB
    assert rows.num_rows == 1_400 * 1_400
    assert sorted(rows.column("k").to_pylist()) == list(range(1_400 * 1_400))


def test_max_rows(db: superfile.Connection) -> None:
    with pytest.raises(QueryLimitError, match="more than 100 rows"):
        db.sql("SELECT * FROM a", max_rows=100)
    assert db.sql("SELECT id FROM a ORDER BY id LIMIT 100", max_rows=100).num_rows == 100


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_limit_arguments_are_checked(db: superfile.Connection, bad: object) -> None:
    with pytest.raises(InvalidOptionError):
        db.sql("SELECT 1", max_rows=bad)  # type: ignore[arg-type]
