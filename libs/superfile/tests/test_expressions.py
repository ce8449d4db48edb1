"""Predicates: parsing and type errors, SQL semantics checked row for row against DuckDB, and pruning.

DuckDB is the reference for evaluation: every predicate here (and every one
Hypothesis generates) must select exactly the rows DuckDB's ``WHERE``
selects. Pruning is checked for soundness (a file holding a matching row is
never skipped) and, on hand-made statistics, for actually skipping files.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from superfile.errors import InvalidPredicateError, UnknownColumnError
from superfile.expressions import ColumnStats, Predicate, parse_predicate, stats_from_table

# --------------------------------------------------------------------------- fixtures

SCHEMA = pa.schema(
    [
        ("_id", pa.uint64()),
        ("i", pa.int64()),
        ("i8", pa.int8()),
        ("u32", pa.uint32()),
        ("f", pa.float64()),
        ("f32", pa.float32()),
        ("s", pa.string()),
        ("ls", pa.large_string()),
        ("b", pa.bool_()),
        ("ts", pa.timestamp("us")),
        ("tstz", pa.timestamp("us", tz="UTC")),
        ("ts_ns", pa.timestamp("ns")),
        ("ts_s", pa.timestamp("s")),
        ("d", pa.date32()),
        ("dec", pa.decimal128(10, 2)),
        ("bin", pa.binary()),
        ("dict", pa.dictionary(pa.int32(), pa.string())),
        ("emb", pa.list_(pa.float32(), 4)),
        ("My Col", pa.int32()),
    ]
)

T0 = dt.datetime(2020, 1, 1)
ROWS = 9


def _ts(hours: float | None) -> dt.datetime | None:
    return None if hours is None else T0 + dt.timedelta(hours=hours)


BASE = pa.table(
    {
        "_id": [0, 1, 2, 3, 2**63, 2**64 - 1, 7, 8, 9],
        "i": [-3, 0, 1, 2, 3, None, 10, -7, 5],
        "i8": [-128, 127, 0, None, 5, -5, 1, 2, 3],
        "u32": [0, 1, 2**32 - 1, None, 5, 6, 7, 8, 9],
        "f": [-1.5, 0.0, 0.5, 1.5, None, 2.25, 100.0, -0.25, 3.0],
        "f32": [0.1, 0.25, None, 1.5, -2.0, 3.0, 0.5, 0.75, 1.0],
        "s": ["cat", "dog", "catfish", None, "", "Cat", "a%b", "a\\b", "éclair"],
        "ls": ["cat", "dog", "x", None, "", "Cat", "a%b", "q", "éclair"],
        "b": [True, False, None, True, False, True, None, False, True],
        "ts": [_ts(h) for h in (0, 12, 24, None, 36, 48, 0.5, 24, 72)],
        "tstz": [_ts(h) for h in (0, 12, 24, None, 36, 48, 0.5, 24, 72)],
        "ts_ns": [_ts(h) for h in (0, 12, 24, None, 36, 48, 0.5, 24, 72)],
        "ts_s": [_ts(h) for h in (0, 12, 24, None, 36, 48, 1, 24, 72)],
        "d": [
            dt.date(2020, 1, 1) + dt.timedelta(days=k) if k is not None else None
            for k in (0, 1, 2, None, 3, 0, 1, 5, 2)
        ],
        "dec": [
            Decimal(x) if x is not None else None
            for x in ("1.25", "1.50", "-3.00", None, "2.00", "0.01", "99.99", "1.26", "3")
        ],
        "bin": [b"ab", b"a", None, b"b", b"", b"abc", b"\x00", b"z", b"ab"],
        "dict": ["cat", "dog", "cat", None, "emu", "dog", "cat", "cat", "emu"],
        "emb": [[0.0, 1.0, 2.0, 3.0]] * ROWS,
        "My Col": [1, 2, 3, 4, None, 6, 7, 8, 9],
    },
    schema=SCHEMA,
)


_DUCK = duckdb.connect()
_DUCK.execute("SET TimeZone = 'UTC'")


def duckdb_mask(table: pa.Table, where: str) -> list[bool]:
    """Reference answer: which rows DuckDB's WHERE selects."""
    indexed = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    _DUCK.register("t", indexed)
    try:
        selected = {r[0] for r in _DUCK.execute(f"SELECT __row FROM t WHERE {where}").fetchall()}
    finally:
        _DUCK.unregister("t")
    return [k in selected for k in range(table.num_rows)]


def selected_rows(mask: pa.BooleanArray) -> list[int]:
    return [k for k, v in enumerate(mask.to_pylist()) if v]


def check_against_duckdb(table: pa.Table, where: str) -> Predicate:
    """evaluate, to_arrow and the normalised text all agree with DuckDB."""
    p = parse_predicate(where, table.schema)
    mask = p.evaluate(table)
    assert isinstance(mask, pa.BooleanArray) and len(mask) == table.num_rows and mask.null_count == 0
    expected = duckdb_mask(table, where)
    assert mask.to_pylist() == expected, f"{where!r} (normalised: {p})"
    # The lazy expression selects the same rows, through Table.filter and through a dataset scan.
    indexed = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    assert indexed.filter(p.to_arrow()).column("__row").to_pylist() == selected_rows(mask)
    # The normalised text means the same thing, to us and to DuckDB.
    again = parse_predicate(str(p), table.schema)
    assert str(again) == str(p)
    assert again.evaluate(table).to_pylist() == expected
    assert duckdb_mask(table, str(p)) == expected, str(p)
    return p


# --------------------------------------------------------------------------- evaluation = DuckDB

PREDICATES = [
    # integers, literal coercion, arithmetic
    "i < 2",
    "i = -3",
    "i <> 0",
    "i != 0",
    "2 > i",
    "i >= 0 AND i <= 5",
    "i BETWEEN -1 AND 3",
    "i NOT BETWEEN -1 AND 3",
    "i IN (1, 2, 3)",
    "i NOT IN (1, 2)",
    "i IN (1, NULL)",
    "i NOT IN (1, NULL)",
    "i IN (1.5, 2.0)",
    "i IS NULL",
    "i IS NOT NULL",
    "i < 2.5",
    "i <= 2.5",
    "i > -2.5",
    "i >= -2.5",
    "i = 2.0",
    "i = 2.5",
    "i <> 2.5",
    "i < 1e3",
    "i + 1 > 3",
    "i * 2 = i + i",
    "i % 3 = 1",
    "i % -3 = -1",
    "-i < 0",
    "-(-i) = i",
    "i / 2 > 1",
    "i / 4 = 0.25",
    "abs(i) = 3",
    "i - 1 - 1 = i - (1 + 1)",
    "i * (2 + 3) = 5 * i",
    "i8 > -200",
    "i8 < 200",
    "i8 = 127",
    "i8 <> 300",
    "i8 + 1 > 127",
    "i = i8",
    "i < f",
    "u32 > 4294967294",
    "u32 + 1 > 5",
    '"My Col" >= 4',
    '"my col" = 3',
    "I < 2",
    # uint64 _id
    "_id > -1",
    "_id >= 0",
    "_id < -1",
    "_id = 18446744073709551615",
    "_id >= 9223372036854775808",
    "_id < 18446744073709551616",
    "_id = 18446744073709551616",
    "_id IN (0, 18446744073709551615, -5)",
    "_id BETWEEN 1 AND 9223372036854775808",
    "_id = i",
    "_id > i",
    "_id % 2 = 0",
    "_id * 1 = _id",
    # floats
    "f > 0.5",
    "f = 1.5",
    "f <> 1.5",
    "f BETWEEN 0 AND 1",
    "f IN (0.5, 1.5, 7)",
    "f NOT IN (0.5, 1.5)",
    "f * 2 > 3",
    "f / 2 < 1",
    "f + i > 1",
    "abs(f) > 1",
    "-f >= 0.25",
    "f = 0",
    "f > CAST('-inf' AS DOUBLE)",
    "f < CAST('inf' AS DOUBLE)",
    "f = CAST('nan' AS DOUBLE)",
    "f32 = 0.1",
    "f32 > 0.25",
    "f32 < f",
    # strings
    "s = 'cat'",
    "s <> 'cat'",
    "s < 'd'",
    "s >= 'cat'",
    "'cat' <= s",
    "s = ''",
    "s IN ('cat', 'dog', NULL)",
    "s LIKE 'ca%'",
    "s LIKE '%t'",
    "s LIKE '_og'",
    "s LIKE '%'",
    "s LIKE 'cat'",
    "s NOT LIKE 'c%'",
    "s LIKE 'a%b'",
    "s LIKE 'a\\b'",
    "s LIKE 'a!%b' ESCAPE '!'",
    "s LIKE '%!%%' ESCAPE '!'",
    "s LIKE '_clair'",
    "s ILIKE 'CA%'",
    "s ILIKE 'ÉCLAIR'",
    "s NOT ILIKE 'c%'",
    "lower(s) = 'cat'",
    "upper(s) = 'CAT'",
    "upper(s) = 'ÉCLAIR'",
    "length(s) = 3",
    "length(s) > 3 AND s LIKE 'c%'",
    "s BETWEEN 'b' AND 'd'",
    "ls = s",
    "ls < s",
    "ls LIKE 'c%'",
    "dict = 'cat'",
    "dict LIKE 'e%'",
    "dict IN ('dog', 'emu')",
    "dict = s",
    "s = 'it''s'",
    # booleans and three-valued logic
    "b",
    "NOT b",
    "b = TRUE",
    "b <> FALSE",
    "b < TRUE",
    "b IS NULL",
    "b IS NOT NULL",
    "b AND i > 1",
    "b OR i > 1",
    "NOT (b OR i > 1)",
    "NOT (b AND i > 1)",
    "(i > 1) = b",
    "b IN (TRUE)",
    "NOT NOT b",
    "TRUE",
    "FALSE",
    "NULL",
    "NOT NULL",
    "NULL AND i > 1",
    "NULL OR i > 1",
    "i = NULL",
    "i <> NULL",
    "NULL IS NULL",
    "i + NULL > 1",
    "i IN (NULL)",
    "1 = 1",
    "1 < 0",
    "'a' < 'b'",
    "1 IN (1, NULL)",
    "2 IN (1, NULL)",
    "1 + 1 = 2 AND i > 0",
    "3 % 2 = 1",
    "i > 1 AND (s LIKE 'c%' OR f < 0)",
    "i > 1 OR s LIKE 'c%' AND f < 0",
    # timestamps and dates
    "ts > TIMESTAMP '2020-01-01 12:00:00'",
    "ts >= '2020-01-02'",
    "ts < DATE '2020-01-02'",
    "ts = '2020-01-01 00:30:00'",
    "ts BETWEEN '2020-01-01' AND '2020-01-02 12:00'",
    "ts IN (TIMESTAMP '2020-01-01 00:00:00', '2020-01-02 00:00:00')",
    "ts IS NULL",
    "tstz > TIMESTAMP '2020-01-01 12:00:00'",
    "tstz > TIMESTAMPTZ '2020-01-01 12:00:00+02:00'",
    "tstz = '2020-01-02 00:00:00+00:00'",
    "ts_ns > TIMESTAMP '2020-01-01 00:30:00.000001'",
    "ts_ns = TIMESTAMP '2020-01-01 00:30:00'",
    "ts_s < TIMESTAMP '2020-01-01 00:00:01.5'",
    "ts_s > TIMESTAMP '2020-01-01 00:00:00.5'",
    "ts_s = TIMESTAMP '2020-01-01 00:00:00.5'",
    "ts = tstz",
    "ts_ns = ts",
    "ts_s <= ts",
    "d = DATE '2020-01-02'",
    "d > '2020-01-01'",
    "d < TIMESTAMP '2020-01-02 10:00:00'",
    "d <= TIMESTAMP '2020-01-02 10:00:00'",
    "d = TIMESTAMP '2020-01-02 00:00:00'",
    "d > TIMESTAMP '2020-01-02 10:00:00'",
    "d = ts",
    "d < ts",
    "d IN (DATE '2020-01-01', DATE '2020-01-03')",
    "d BETWEEN DATE '2020-01-02' AND '2020-01-04'",
    "DATE '2020-01-02' = CAST('2020-01-02' AS DATE)",
    # decimals
    "dec > 1.5",
    "dec = 1.25",
    "dec = 1.255",
    "dec < 1.255",
    "dec >= 1.255",
    "dec < 2",
    "dec IN (1.25, 3, 1.255)",
    "dec > i",
    "dec = f",
    "dec > CAST('1.3' AS DOUBLE)",
    "dec = CAST(1.254 AS DECIMAL(10, 2))",
    "abs(dec) > 2",
    "dec * 2 > 3",
    # binary
    "bin = 'ab'",
    "bin > 'a'",
    "bin IN ('ab', 'z')",
    # casts and comments
    "i = CAST('3' AS INTEGER)",
    "i < CAST(2.5 AS INTEGER)",
    "_id = CAST('18446744073709551615' AS UBIGINT)",
    "s = CAST(5 AS VARCHAR) OR s = 'cat'",
    "b = CAST('true' AS BOOLEAN)",
    "i > 1 -- trailing comment",
    "i /* inline */ > 1",
    "i>1AND s='cat'",
]


@pytest.mark.parametrize("where", PREDICATES)
def test_matches_duckdb(where: str) -> None:
    check_against_duckdb(BASE, where)


@pytest.mark.parametrize("where", ["i > 1 AND s LIKE 'c%'", "ts >= '2020-01-02'", "_id > 5 OR b"])
def test_record_batch_and_chunked_table(where: str) -> None:
    p = parse_predicate(where, SCHEMA)
    expected = p.evaluate(BASE).to_pylist()
    assert p.evaluate(BASE.to_batches()[0]).to_pylist() == expected
    chunked = pa.concat_tables([BASE.slice(0, 4), BASE.slice(4)])
    assert p.evaluate(chunked).to_pylist() == expected
    assert p.evaluate(BASE.slice(0, 0)).to_pylist() == []


def test_to_arrow_in_dataset_scan() -> None:
    p = parse_predicate("i > 0 AND s IS NOT NULL", SCHEMA)
    got = ds.dataset(BASE).to_table(filter=p.to_arrow(), columns=["_id"])
    assert got.column("_id").to_pylist() == [2, 2**63, 7, 9]
    assert isinstance(p.to_arrow(), pc.Expression)


def test_data_stored_as_other_encodings() -> None:
    """A batch whose column is stored differently from the schema (dictionary, large, view) still works."""
    p = parse_predicate("s LIKE 'c%' AND s <> 'cat'", SCHEMA)
    values = ["cat", "catfish", None, "cow"]
    for arr in (
        pa.array(values).dictionary_encode(),
        pa.array(values, pa.large_string()),
        pa.array(values, pa.string_view()),
    ):
        assert p.evaluate(pa.table({"s": arr})).to_pylist() == [False, True, False, True]
    views = pa.schema([("v", pa.string_view()), ("fb", pa.binary(2))])
    table = pa.table(
        {"v": pa.array(["ab", "b", None], pa.string_view()), "fb": pa.array([b"ab", b"zz", None], pa.binary(2))}
    )
    q = parse_predicate("v LIKE 'a%' OR fb = 'zz'", views)
    assert q.evaluate(table).to_pylist() == [True, True, False]
    assert stats_from_table(table)["v"] == ColumnStats("ab", "b", 1, 3)


def test_missing_column_in_data() -> None:
    p = parse_predicate("i > 1", SCHEMA)
    with pytest.raises(UnknownColumnError, match='"i"'):
        p.evaluate(pa.table({"j": [1]}))


def test_overflow_is_a_typed_error() -> None:
    p = parse_predicate("_id + 1 > 0", SCHEMA)
    with pytest.raises(InvalidPredicateError, match="overflow"):
        p.evaluate(BASE)


def test_modulo_by_zero_is_null() -> None:
    """DuckDB raises on x % 0; we give NULL (the row is not selected) rather than failing a scan."""
    p = parse_predicate("i % 0 = 0 OR i % 0 IS NULL", SCHEMA)
    assert p.evaluate(BASE).to_pylist() == [True] * ROWS


def test_nan_follows_ieee() -> None:
    """NaN equals nothing and orders with nothing (DuckDB instead sorts NaN above +inf)."""
    table = pa.table({"f": [float("nan"), 1.0, None]})
    mask = {
        w: parse_predicate(w, table.schema).evaluate(table).to_pylist()
        for w in (
            "f = CAST('nan' AS DOUBLE)",
            "f > 0",
            "f <> 1",
            "f IN (CAST('nan' AS DOUBLE), 1)",
            "NOT (f < 0)",
            "f IS NULL",
        )
    }
    assert mask == {
        "f = CAST('nan' AS DOUBLE)": [False, False, False],
        "f > 0": [False, True, False],
        "f <> 1": [True, False, False],
        "f IN (CAST('nan' AS DOUBLE), 1)": [False, True, False],
        "NOT (f < 0)": [True, True, False],
        "f IS NULL": [False, False, True],
    }


# --------------------------------------------------------------------------- parsing and normal form


@pytest.mark.parametrize(
    ("where", "normal"),
    [
        ("id<10", '"id" < 10'),
        ("ID != 3", '"id" <> 3'),
        ("NOT id = 1", 'NOT ("id" = 1)'),
        ("id NOT IN (1,2)", '"id" NOT IN (1, 2)'),
        ("NOT (id IN (1,2))", '"id" NOT IN (1, 2)'),
        ("label NOT LIKE 'a%'", "\"label\" NOT LIKE 'a%'"),
        ("id IS NOT NULL", '"id" IS NOT NULL'),
        ("(a OR b) AND c", '("a" OR "b") AND "c"'),
        ("a OR b AND c", '"a" OR "b" AND "c"'),
        ("id - (1 - id) > 0", '"id" - (1 - "id") > 0'),
        ("id * (2 + id) > -5", '"id" * (2 + "id") > -5'),
        ("id - -5 > 0", '"id" - -5 > 0'),
        ("-(-id) > 0", '-(-"id") > 0'),
        ("id > 1 + 2 * 3", '"id" > 7'),
        ("id > CAST('7' AS BIGINT)", '"id" > 7'),
        ("score > 1.50", '"score" > 1.50'),
        ("score > CAST(0.1 AS DOUBLE)", "\"score\" > CAST('0.1' AS DOUBLE)"),
        ("label = 'it''s'", "\"label\" = 'it''s'"),
        ("ts > DATE '2020-01-02'", "\"ts\" > DATE '2020-01-02'"),
        ("ts > TIMESTAMP '2020-01-02 03:04:05'", "\"ts\" > TIMESTAMP '2020-01-02 03:04:05'"),
        ("ts > TIMESTAMPTZ '2020-01-02 03:04:05+01:00'", "\"ts\" > TIMESTAMPTZ '2020-01-02 02:04:05+00:00'"),
        ('"we""ird" = 1', '"we""ird" = 1'),
        ("lower(label) LIKE 'a!%' ESCAPE '!'", "lower(\"label\") LIKE 'a!%' ESCAPE '!'"),
        ("id BETWEEN 1 AND 2", '"id" BETWEEN 1 AND 2'),
    ],
)
def test_normalised_text(where: str, normal: str) -> None:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("label", pa.string()),
            ("a", pa.bool_()),
            ("b", pa.bool_()),
            ("c", pa.bool_()),
            ("score", pa.float64()),
            ("ts", pa.timestamp("us")),
            ('we"ird', pa.int32()),
        ]
    )
    p = parse_predicate(where, schema)
    assert str(p) == normal
    assert str(parse_predicate(normal, schema)) == normal
    assert repr(p) == f"Predicate({normal!r})"


def test_columns() -> None:
    p = parse_predicate("i > 1 AND (s LIKE 'c%' OR lower(ls) = 'x') AND NOT b AND _id IN (1, 2)", SCHEMA)
    assert p.columns == frozenset({"i", "s", "ls", "b", "_id"})
    assert parse_predicate("TRUE", SCHEMA).columns == frozenset()
    assert parse_predicate('"my col" = 1', SCHEMA).columns == frozenset({"My Col"})


@pytest.mark.parametrize(
    ("where", "error", "fragment"),
    [
        ("", InvalidPredicateError, "empty"),
        ("   ", InvalidPredicateError, "empty"),
        ("nope = 1", UnknownColumnError, '"nope"'),
        ("i = 1 AND nope IS NULL", UnknownColumnError, '"nope"'),
        ("emb = 1", InvalidPredicateError, 'column "emb" is a vector'),
        ("emb IS NULL", InvalidPredicateError, "vector"),
        ("i", InvalidPredicateError, "boolean expression"),
        ("1 + 1", InvalidPredicateError, "boolean expression"),
        ("s", InvalidPredicateError, "boolean expression"),
        ("s = 5", InvalidPredicateError, 'column "s" (string) with 5 (integer literal)'),
        ("5 = s", InvalidPredicateError, '5 (integer literal) with column "s" (string)'),
        ("b = 'x'", InvalidPredicateError, 'column "b" (bool)'),
        ("b = 1", InvalidPredicateError, "integer literal"),
        ("i = 'x'", InvalidPredicateError, "string literal"),
        ("i = s", InvalidPredicateError, 'column "i" (int64) with column "s" (string)'),
        ("ts = 5", InvalidPredicateError, "timestamp[us]"),
        ("ts > 'yesterday'", InvalidPredicateError, "not an ISO date"),
        ("s = DATE '2020-01-01'", InvalidPredicateError, "date literal"),
        ("i IN (1, 'a')", InvalidPredicateError, "string literal"),
        ("i IN (s)", InvalidPredicateError, "must be literals"),
        ("i IN ()", InvalidPredicateError, "IN list is empty"),
        ("i = 1; DROP TABLE t", InvalidPredicateError, "';'"),
        ("i = 1;", InvalidPredicateError, "';'"),
        ("i IN (SELECT 1)", InvalidPredicateError, "subqueries"),
        ("EXISTS (SELECT 1)", InvalidPredicateError, "subqueries"),
        ("(SELECT 1) = 1", InvalidPredicateError, "subqueries"),
        ("count(*) > 1", InvalidPredicateError, "aggregate"),
        ("sum(i) > 1", InvalidPredicateError, "aggregate"),
        ("row_number() OVER () = 1", InvalidPredicateError, "window"),
        ("i = ?", InvalidPredicateError, "parameters"),
        ("i = $1", InvalidPredicateError, "parameters"),
        ("read_csv('x') = 1", InvalidPredicateError, "function read_csv()"),
        ("concat(s, s) = 'a'", InvalidPredicateError, "allowed: abs, length, lower, upper"),
        ("CASE WHEN b THEN 1 END = 1", InvalidPredicateError, "CASE"),
        ("i = 1 trailing", InvalidPredicateError, "unexpected 'trailing'"),
        ("i = 1 AND", InvalidPredicateError, "cannot parse"),
        ("i >", InvalidPredicateError, "cannot parse"),
        ("'unterminated", InvalidPredicateError, "cannot parse"),
        ("t.i = 1", InvalidPredicateError, "qualified"),
        ("s LIKE s", InvalidPredicateError, "pattern must be a string literal"),
        ("i LIKE '1%'", InvalidPredicateError, 'LIKE needs a string operand, got column "i" (int64)'),
        ("s LIKE 'a!' ESCAPE '!'", InvalidPredicateError, "ends with its escape"),
        ("s LIKE 'a' ESCAPE '!!'", InvalidPredicateError, "exactly one character"),
        ("CAST(i AS DOUBLE) > 1", InvalidPredicateError, "CAST is only supported on literals"),
        ("TRY_CAST('1' AS INT) = i", InvalidPredicateError, "TRY_CAST"),
        ("i = CAST('abc' AS INTEGER)", InvalidPredicateError, "CAST 'abc' AS INT"),
        ("i = CAST(300 AS TINYINT)", InvalidPredicateError, "out of range"),
        ("d = CAST('2020-13-01' AS DATE)", InvalidPredicateError, "2020-13-01"),
        ("i = CAST(1 AS INTERVAL)", InvalidPredicateError, "INTERVAL"),
        ("f % 2 = 1", InvalidPredicateError, "% needs integer operands"),
        ("s + 1 = 2", InvalidPredicateError, "+ needs numeric operands"),
        ("-s = 'a'", InvalidPredicateError, "unary minus"),
        ("NOT i", InvalidPredicateError, 'NOT needs boolean operands, got column "i"'),
        ("i AND b", InvalidPredicateError, "AND needs boolean operands"),
        ("lower(i) = 'a'", InvalidPredicateError, "lower() needs a string argument"),
        ("abs(s) = 1", InvalidPredicateError, "abs() needs a numeric argument"),
        ("i IS TRUE", InvalidPredicateError, "IS NULL"),
        ("i || 'a' = 'b'", InvalidPredicateError, "DPIPE"),
        ("i // 2 = 1", InvalidPredicateError, "INTDIV"),
        ("i IS NOT DISTINCT FROM 1", InvalidPredicateError, "unsupported"),
        ("_id + 18446744073709551616 > 0", InvalidPredicateError, "out of range for uint64"),
        ("i + 9223372036854775808 > 0", InvalidPredicateError, "out of range for int64"),
        ("*", InvalidPredicateError, "unsupported"),
    ],
)
def test_errors(where: str, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as info:
        parse_predicate(where, SCHEMA)
    assert type(info.value) is error
    assert fragment in str(info.value)


def test_unsupported_column_type_and_ambiguity() -> None:
    schema = pa.schema(
        [("t", pa.time64("us")), ("x", pa.int8()), ("X", pa.int8()), ("Ab", pa.int8()), ("aB", pa.int8())]
    )
    with pytest.raises(InvalidPredicateError, match=r'column "t" has type time64\[us\]'):
        parse_predicate("t IS NULL", schema)
    assert parse_predicate("X = 1", schema).columns == {"X"}  # an exact match wins
    with pytest.raises(InvalidPredicateError, match="ambiguous"):
        parse_predicate("ab = 1", schema)


def test_non_string_input() -> None:
    with pytest.raises(InvalidPredicateError, match="must be a string"):
        parse_predicate(None, SCHEMA)  # type: ignore[arg-type]


def test_deep_nesting_is_rejected_cleanly() -> None:
    where = "(" * 3000 + "i > 1" + ")" * 3000
    with pytest.raises(InvalidPredicateError):
        parse_predicate(where, SCHEMA)


# --------------------------------------------------------------------------- pruning


def S(lo: object, hi: object, nulls: int | None = 0, rows: int = 100) -> ColumnStats:
    return ColumnStats(lo, hi, nulls, rows)


PRUNE_SCHEMA = pa.schema(
    [
        ("x", pa.int64()),
        ("y", pa.int64()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("b", pa.bool_()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("d", pa.date32()),
        ("_id", pa.uint64()),
        ("dec", pa.decimal128(6, 2)),
    ]
)


@pytest.mark.parametrize(
    ("where", "stats", "expected"),
    [
        ("x = 5", {"x": S(10, 20)}, False),
        ("x = 15", {"x": S(10, 20)}, True),
        ("x = 10", {"x": S(10, 20)}, True),
        ("x < 10", {"x": S(10, 20)}, False),
        ("x <= 10", {"x": S(10, 20)}, True),
        ("x > 20", {"x": S(10, 20)}, False),
        ("x >= 20", {"x": S(10, 20)}, True),
        ("5 > x", {"x": S(10, 20)}, False),
        ("x < 10.5", {"x": S(11, 20)}, False),
        ("x = 10.5", {"x": S(0, 20)}, False),
        ("x <> 10", {"x": S(10, 10)}, False),
        ("x <> 10", {"x": S(10, 11)}, True),
        ("f <> 10", {"f": S(10.0, 10.0)}, True),  # NaN rows are not in the statistics
        ("f = 5", {"f": S(10.0, 20.0)}, False),
        ("f > 25", {"f": S(10.0, 20.0)}, False),
        ("f > 25", {"f": S(10.0, float("nan"))}, True),
        ("NOT (f < 25)", {"f": S(10.0, 20.0)}, True),  # NaN satisfies it
        ("NOT (x < 25)", {"x": S(10, 20)}, False),
        ("NOT (x < 15)", {"x": S(10, 20)}, True),
        ("NOT (x = 10)", {"x": S(10, 10)}, False),
        ("NOT NOT (x = 5)", {"x": S(10, 20)}, False),
        ("x BETWEEN 21 AND 30", {"x": S(10, 20)}, False),
        ("x BETWEEN 15 AND 30", {"x": S(10, 20)}, True),
        ("x NOT BETWEEN 0 AND 30", {"x": S(10, 20)}, False),
        ("x NOT BETWEEN 12 AND 30", {"x": S(10, 20)}, True),
        ("x IN (1, 2, 30)", {"x": S(10, 20)}, False),
        ("x IN (1, 15)", {"x": S(10, 20)}, True),
        ("x IN (10.5, 11.5)", {"x": S(10, 11)}, False),
        ("x NOT IN (10)", {"x": S(10, 10)}, False),
        ("x NOT IN (10, 11)", {"x": S(10, 11)}, True),
        ("x NOT IN (1, NULL)", {"x": S(10, 20)}, False),  # never TRUE
        ("x IN (NULL)", {"x": S(10, 20)}, False),
        ("x IS NULL", {"x": S(10, 20, nulls=0)}, False),
        ("x IS NULL", {"x": S(10, 20, nulls=3)}, True),
        ("x IS NULL", {"x": S(10, 20, nulls=None)}, True),
        ("x IS NOT NULL", {"x": S(None, None, nulls=100)}, False),
        ("x IS NOT NULL", {"x": S(None, None, nulls=None)}, True),
        ("x = 5", {"x": S(None, None, nulls=100)}, False),
        ("NOT (x = 5)", {"x": S(None, None, nulls=100)}, False),
        ("x IS NULL", {"x": S(None, None, nulls=100)}, True),
        ("x + 1 > 5", {"x": S(None, None, nulls=100)}, False),
        ("x + 1 > 5", {"x": S(10, 20)}, True),
        ("x > y", {"x": S(10, 20), "y": S(None, None, nulls=100)}, False),
        ("x > y", {"x": S(1, 2), "y": S(5, 6)}, True),  # column-vs-column is not analysed
        ("x = 5", {}, True),
        ("x = 5", {"y": S(0, 1)}, True),
        ("x = 5", {"x": S(None, None, nulls=None)}, True),
        ("x = 5", {"x": S(10, None)}, False),
        ("x = 25", {"x": S(10, None)}, True),
        ("x = 5", {"x": S("a", "b")}, True),  # nonsense statistics: keep the file
        ("x = 5", {"x": S(10, 20, rows=0)}, False),
        ("x = 5 OR y = 1", {"x": S(10, 20), "y": S(0, 3)}, True),
        ("x = 5 OR y = 9", {"x": S(10, 20), "y": S(0, 3)}, False),
        ("x = 15 AND y = 9", {"x": S(10, 20), "y": S(0, 3)}, False),
        ("x = 15 AND y = 2", {"x": S(10, 20), "y": S(0, 3)}, True),
        ("x = 5 OR x = 25", {"x": S(10, 20)}, False),
        ("(x > 12 AND x < 18) OR y IS NULL", {"x": S(10, 20), "y": S(0, 3)}, True),
        ("s = 'm'", {"s": S("a", "k")}, False),
        ("s LIKE 'abc%'", {"s": S("abd", "b")}, False),
        ("s LIKE 'abc%'", {"s": S("abcz", "b")}, True),
        ("s LIKE 'abc%'", {"s": S("ab", "abz")}, True),
        ("s LIKE 'x%'", {"s": S("a", "c")}, False),
        ("s LIKE 'a%'", {"s": S("b", "c")}, False),
        ("s LIKE '%abc'", {"s": S("x", "y")}, True),
        ("s LIKE 'a_c'", {"s": S("b", "c")}, False),
        ("s NOT LIKE 'ab%'", {"s": S("aba", "abz")}, False),
        ("s NOT LIKE 'ab%'", {"s": S("aba", "ac")}, True),
        ("s NOT LIKE 'ab_%'", {"s": S("aba", "abz")}, True),
        ("s ILIKE 'x%'", {"s": S("a", "c")}, True),
        ("lower(s) = 'x'", {"s": S("a", "c")}, True),
        ("b", {"b": S(False, False)}, False),
        ("b", {"b": S(False, True)}, True),
        ("NOT b", {"b": S(True, True)}, False),
        ("b = TRUE", {"b": S(False, False)}, False),
        (
            "ts > TIMESTAMP '2021-01-01 00:00:00'",
            {"ts": S(dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2020, 12, 31, tzinfo=dt.UTC))},
            False,
        ),
        (
            "ts > '2020-06-01'",
            {"ts": S(dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2020, 12, 31, tzinfo=dt.UTC))},
            True,
        ),
        (
            "ts < TIMESTAMPTZ '2020-01-01 01:00:00+02:00'",
            {"ts": S(dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2020, 1, 2, tzinfo=dt.UTC))},
            False,
        ),
        (
            "ts < DATE '2020-01-01'",
            {"ts": S(dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 2))},
            False,
        ),  # naive stats read as UTC
        ("d = DATE '2020-02-01'", {"d": S(dt.date(2020, 1, 1), dt.date(2020, 1, 31))}, False),
        ("d >= TIMESTAMP '2020-01-31 00:00:01'", {"d": S(dt.date(2020, 1, 1), dt.date(2020, 1, 31))}, False),
        ("_id = 18446744073709551615", {"_id": S(0, 2**63)}, False),
        ("_id > -1", {"_id": S(0, 5)}, True),
        ("_id < 0", {"_id": S(0, 5)}, False),
        ("_id IN (18446744073709551615)", {"_id": S(2**64 - 1, 2**64 - 1)}, True),
        ("dec > 10.5", {"dec": S(Decimal("1.00"), Decimal("10.50"))}, False),
        ("dec >= 10.5", {"dec": S(Decimal("1.00"), Decimal("10.50"))}, True),
        ("TRUE", {"x": S(10, 20)}, True),
        ("FALSE", {"x": S(10, 20)}, False),
        ("NULL", {"x": S(10, 20)}, False),
        ("x = NULL", {"x": S(10, 20)}, False),
    ],
)
def test_pruning_cases(where: str, stats: dict[str, ColumnStats], expected: bool) -> None:
    assert parse_predicate(where, PRUNE_SCHEMA).might_match(stats) is expected


def test_stats_from_table() -> None:
    stats = stats_from_table(BASE)
    assert stats["i"] == ColumnStats(-7, 10, 1, ROWS)
    assert stats["_id"] == ColumnStats(0, 2**64 - 1, 0, ROWS)
    assert stats["s"] == ColumnStats("", "éclair", 1, ROWS)
    assert stats["b"] == ColumnStats(False, True, 2, ROWS)
    assert stats["dict"] == ColumnStats("cat", "emu", 1, ROWS)
    assert stats["dec"] == ColumnStats(Decimal("-3.00"), Decimal("99.99"), 1, ROWS)
    assert stats["ts"] == ColumnStats(T0, T0 + dt.timedelta(hours=72), 1, ROWS)
    assert stats["tstz"].min == T0.replace(tzinfo=dt.UTC)
    assert stats["emb"] == ColumnStats(None, None, 0, ROWS)
    nan = stats_from_table(pa.table({"f": [float("nan"), 2.0, float("nan")], "g": [float("nan")] * 3}))
    assert nan["f"] == ColumnStats(2.0, 2.0, 0, 3)
    assert nan["g"] == ColumnStats(None, None, 0, 3)
    empty = stats_from_table(pa.table({"x": pa.array([None, None], pa.int64())}))
    assert empty["x"] == ColumnStats(None, None, 2, 2)
    batch = stats_from_table(BASE.to_batches()[0])
    assert batch["i"] == stats["i"]


def test_stats_round_nanoseconds_outward() -> None:
    ns = pa.array([-1_500, 2_500], pa.timestamp("ns"))
    stats = stats_from_table(pa.table({"t": ns}))["t"]
    epoch = dt.datetime(1970, 1, 1)
    assert stats.min == epoch - dt.timedelta(microseconds=2)
    assert stats.max == epoch + dt.timedelta(microseconds=3)
    p = parse_predicate("t >= TIMESTAMP '1970-01-01 00:00:00.000002'", pa.schema([("t", pa.timestamp("ns"))]))
    assert p.might_match({"t": stats})


# --------------------------------------------------------------------------- property tests

ALPHABET = ["a", "b", "B", "é", "É", "%", "_", "\\", "'", " "]
WORDS = st.text(alphabet=st.sampled_from(ALPHABET), max_size=3)
DAY0 = dt.datetime(2020, 1, 1)
TIMESTAMPS = st.integers(0, 4 * 24 * 4).map(lambda q: DAY0 + dt.timedelta(minutes=15 * q))
DATES = st.integers(-2, 6).map(lambda k: DAY0.date() + dt.timedelta(days=k))
UINTS = st.sampled_from([0, 1, 2, 3, 7, 2**63, 2**64 - 1])

GEN_SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("u", pa.uint64()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("b", pa.bool_()),
        ("ts", pa.timestamp("us")),
        ("d", pa.date32()),
    ]
)


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(0, 12))

    def column(values: st.SearchStrategy[object]) -> list[object]:
        return draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))

    return pa.table(
        {
            "i": column(st.integers(-20, 20)),
            "u": column(UINTS),
            "f": column(st.sampled_from([-0.0, 0.0, 0.5, -2.25, 1.0, 3.0, 10.5]) | st.floats(-50, 50, width=32)),
            "s": column(WORDS),
            "b": column(st.booleans()),
            "ts": column(TIMESTAMPS),
            "d": column(DATES),
        },
        schema=GEN_SCHEMA,
    )


def sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


INT_LIT = st.integers(-10, 10).map(str)
NONZERO = st.integers(-5, 5).filter(bool).map(str)
NUM_LIT = st.one_of(INT_LIT, st.sampled_from(["0.5", "-2.25", "1.0", "2.5", "1e1", "-0.0", "3.00"]))
CMP = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="])


@st.composite
def int_expr(draw: st.DrawFn, depth: int = 2) -> str:
    leaves = [st.just("i"), INT_LIT]
    if depth <= 0:
        return draw(st.one_of(leaves))
    sub = int_expr(depth - 1)
    return draw(
        st.one_of(
            *leaves,
            st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(sub, NONZERO).map(lambda t: f"({t[0]} % {t[1]})"),
            sub.map(lambda e: f"abs({e})"),
            sub.map(lambda e: f"-({e})"),
        )
    )


@st.composite
def num_expr(draw: st.DrawFn) -> str:
    """Numeric expressions: integer arithmetic, float columns, float division by non-zero literals."""
    return draw(
        st.one_of(
            int_expr(),
            st.just("f"),
            st.tuples(
                st.sampled_from(["f", "i"]), st.sampled_from(["+", "-", "*"]), st.sampled_from(["f", "i", "2", "-3"])
            ).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(["f", "i", "(i + f)"]), NONZERO).map(lambda t: f"({t[0]} / {t[1]})"),
            st.just("abs(f)"),
        )
    )


def _lit_list(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(items, st.just("NULL")), min_size=1, max_size=4).map(", ".join)


TS_LIT = TIMESTAMPS.map(lambda t: f"TIMESTAMP '{t.isoformat(sep=' ')}'")
TS_STR = TIMESTAMPS.map(lambda t: sql_string(t.isoformat(sep=" ")))
DATE_LIT = DATES.map(lambda d: f"DATE '{d.isoformat()}'")
U_LIT = st.sampled_from(
    ["0", "1", "3", "-1", "9223372036854775808", "18446744073709551615", "18446744073709551616", "2.5"]
)


@st.composite
def atoms(draw: st.DrawFn) -> str:
    column = st.sampled_from(["i", "u", "f", "s", "b", "ts", "d"])
    pattern = st.lists(st.sampled_from([*ALPHABET, "%", "%", "_"]), max_size=4).map("".join)
    return draw(
        st.one_of(
            st.tuples(num_expr(), CMP, st.one_of(NUM_LIT, num_expr())).map(" ".join),
            st.tuples(st.just("i"), st.sampled_from(["IN", "NOT IN"]), _lit_list(NUM_LIT)).map(
                lambda t: f"{t[0]} {t[1]} ({t[2]})"
            ),
            st.tuples(num_expr(), st.sampled_from(["BETWEEN", "NOT BETWEEN"]), NUM_LIT, NUM_LIT).map(
                lambda t: f"{t[0]} {t[1]} {t[2]} AND {t[3]}"
            ),
            st.tuples(st.just("u"), CMP, st.one_of(U_LIT, st.sampled_from(["i", "u"]))).map(" ".join),
            st.tuples(st.just("u"), st.sampled_from(["IN", "NOT IN"]), _lit_list(U_LIT)).map(
                lambda t: f"{t[0]} {t[1]} ({t[2]})"
            ),
            st.tuples(st.sampled_from(["s", "lower(s)", "upper(s)"]), CMP, WORDS.map(sql_string)).map(" ".join),
            st.tuples(st.sampled_from(["s IN", "s NOT IN"]), _lit_list(WORDS.map(sql_string))).map(
                lambda t: f"{t[0]} ({t[1]})"
            ),
            st.tuples(
                st.sampled_from(["s", "lower(s)"]), st.sampled_from(["LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"]), pattern
            ).map(lambda t: f"{t[0]} {t[1]} {sql_string(t[2])}"),
            st.tuples(st.just("length(s)"), CMP, st.integers(0, 4).map(str)).map(" ".join),
            st.sampled_from(
                ["b", "b = TRUE", "b <> FALSE", "b = (i > 0)", "TRUE", "FALSE", "NULL", "i = NULL", "NULL IS NULL"]
            ),
            st.tuples(st.just("ts"), CMP, st.one_of(TS_LIT, TS_STR, DATE_LIT, st.sampled_from(["ts", "d"]))).map(
                " ".join
            ),
            st.tuples(st.just("d"), CMP, st.one_of(DATE_LIT, TS_LIT)).map(" ".join),
            st.tuples(st.just("ts BETWEEN"), TS_LIT, TS_STR).map(lambda t: f"{t[0]} {t[1]} AND {t[2]}"),
            st.tuples(st.sampled_from(["ts IN", "d NOT IN"]), _lit_list(st.one_of(TS_LIT, DATE_LIT))).map(
                lambda t: f"{t[0]} ({t[1]})"
            ),
            st.tuples(column, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
        )
    )


def predicates() -> st.SearchStrategy[str]:
    return st.recursive(
        atoms(),
        lambda sub: st.one_of(
            st.tuples(sub, st.sampled_from(["AND", "OR"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            sub.map(lambda p: f"NOT ({p})"),
        ),
        max_leaves=5,
    )


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(table=tables(), where=predicates())
def test_random_predicates_match_duckdb(table: pa.Table, where: str) -> None:
    check_against_duckdb(table, where)


def _loosen(stats: ColumnStats, how: int) -> ColumnStats:
    """Weaker but still true statistics: unknown bounds or null counts."""
    if how == 1:
        return ColumnStats(None, stats.max, stats.null_count, stats.row_count)
    if how == 2:
        return ColumnStats(stats.min, None, None, stats.row_count)
    return stats


@PROPERTY_SETTINGS
@given(table=tables(), where=predicates(), cuts=st.lists(st.integers(0, 12), max_size=3), loosen=st.data())
def test_pruning_is_sound(table: pa.Table, where: str, cuts: list[int], loosen: st.DataObject) -> None:
    """A file (here: any slice of the table) that holds a matching row is never pruned."""
    p = parse_predicate(where, table.schema)
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c <= table.num_rows)})
    for start, stop in itertools.pairwise(bounds):
        part = table.slice(start, stop - start)
        if not any(p.evaluate(part).to_pylist()):
            continue
        stats = stats_from_table(part)
        assert p.might_match(stats), f"{p} pruned a file holding a match: {stats}"
        weaker = {
            name: _loosen(s, loosen.draw(st.integers(0, 2))) for name, s in stats.items() if loosen.draw(st.booleans())
        }
        assert p.might_match(weaker), f"{p} pruned with weaker stats {weaker}"


def test_pruning_skips_files_in_practice() -> None:
    """On a sorted table split into files, selective predicates skip most files."""
    table = pa.table({"x": list(range(1000)), "s": [f"k{v:04d}" for v in range(1000)]})
    files = [stats_from_table(table.slice(k, 100)) for k in range(0, 1000, 100)]
    kept: Callable[[str], int] = lambda w: sum(parse_predicate(w, table.schema).might_match(f) for f in files)  # noqa: E731
    assert kept("x = 250") == 1
    assert kept("x BETWEEN 150 AND 349") == 3
    assert kept("x IN (5, 999)") == 2
    assert kept("s LIKE 'k05%'") == 1
    assert kept("x < 0 OR x > 1000") == 0
    assert kept("NOT (x >= 100)") == 1
    assert kept("x + 1 = 5") == 10
