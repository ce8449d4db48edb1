"""Fuzzing the text entry points a client controls: the ``where`` predicate language and SQL. Generated input
(random text, and token soup built from the languages' own words) either answers or raises a typed
``SuperfileError``; nothing else escapes, and nothing crashes the process. Bounded example counts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pytest
import superfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from superfile.errors import SuperfileError
from superfile.expressions import parse_predicate

SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string()), ("score_x", pa.float64()), ("day", pa.date32())])
WORDS = [
    *("id", "text", "score_x", "day", "a", "x", "bm25_search", "vector_search", "hybrid_search", "generate_series"),
    *("SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "IN", "IS", "NULL", "LIKE", "BETWEEN", "CAST", "AS", "JOIN"),
    *("GROUP", "BY", "ORDER", "LIMIT", "UNION", "WITH", "RECURSIVE", "CASE", "WHEN", "THEN", "END", "count(*)"),
    *("(", ")", ",", "=", "!=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "||", "'", "''", '"', ";"),
    *("'row'", "'2024-01-01'", "1", "-1", "0.5", "1e308", "9223372036854775808", "TRUE", "FALSE", "DATE"),
    *("read_csv('/etc/passwd')", "COPY", "INSERT", "DROP", "ATTACH", "PRAGMA", "\\x00", "\n", "--", "/*"),
]
soup = st.lists(st.sampled_from(WORDS), min_size=1, max_size=24).map(" ".join)
text = st.one_of(soup, st.text(max_size=200))
FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@given(where=text)
@FUZZ
def test_predicates_answer_or_raise_a_typed_error(where: str) -> None:
    try:
        predicate = parse_predicate(where, SCHEMA)
    except SuperfileError:
        return
    rows = pa.table({"id": [1, 2], "text": ["a", None], "score_x": [0.5, None], "day": pa.array([0, 1], pa.date32())})
    with contextlib.suppress(SuperfileError):
        predicate.evaluate(rows)


@pytest.fixture(scope="module")
def db() -> Iterator[superfile.Connection]:
    conn = superfile.connect("memory://fuzz-sql")
    table = conn.create_table("a", SCHEMA, fts_columns=["text"])
    table.append(
        {"id": [1, 2, 3], "text": ["row one", "row two", None], "score_x": [0.1, 0.2, None], "day": [None] * 3}
    )
    yield conn


@given(query=text)
@FUZZ
def test_sql_answers_or_raises_a_typed_error(db: superfile.Connection, query: str) -> None:
    with contextlib.suppress(SuperfileError):
        db.sql(query)
