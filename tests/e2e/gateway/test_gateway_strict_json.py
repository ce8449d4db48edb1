"""Strict JSON both ways (issue 19 item 3): a NaN or infinite number leaves as null, a request body that holds a
NaN, Infinity or -Infinity token is a typed 400 that writes nothing, on every route that reads a JSON body.

Python's ``json`` writes and reads those tokens by default, and strict parsers (browsers' ``JSON.parse``, Go,
Rust's serde, jq) reject them: every response here is read with a parser that refuses them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pyarrow as pa
import pytest
import superfile
from gateway_helpers import error_of, state
from superfile.errors import InvalidOptionError
from superfile_gateway import BackgroundServer

ADMIN = {"Authorization": "Bearer admin-key"}
JSON_TYPE = {**ADMIN, "content-type": "application/json"}
TOKENS = ("NaN", "Infinity", "-Infinity", "1e999", "-1.5E+400")  # the last two: beyond a double's range


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def strict(response: httpx.Response) -> Any:
    """The response's JSON read as a strict parser reads it (no NaN, Infinity or -Infinity)."""
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return json.loads(response.text, parse_constant=_refuse)


@pytest.fixture(scope="module")
def floats(engine: superfile.Connection, server: BackgroundServer) -> str:
    """A table whose float columns hold NaN and infinities next to ordinary values (vectors may not); table
    options cannot be infinite (they travel as strict JSON)."""
    fields: list[pa.Field] = [
        pa.field("id", pa.int64()),
        pa.field("title", pa.string()),
        pa.field("x", pa.float64()),
        pa.field("f", pa.float32()),
        pa.field("emb", pa.list_(pa.float32(), 3)),
    ]
    schema = pa.schema(fields)
    with pytest.raises(InvalidOptionError):
        engine.create_table("floats", schema, max_staleness_s=math.inf)
    table = engine.create_table("floats", schema, fts_columns=["title"], vector_columns={"emb": 3})
    nan, inf = float("nan"), float("inf")
    table.append(
        {
            "id": [0, 1, 2, 3],
            "title": ["flow one", "flow two", "flow three", "flow four"],
            "x": [1.5, nan, inf, -inf],
            "f": [-inf, 0.5, None, nan],
            "emb": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]],
        }
    )
    return "floats"


def test_results_are_strict_json(http: httpx.Client, floats: str) -> None:
    """Rows (scan, every search kind, SQL, changes) have null where a value was NaN or infinite, at any depth
    (SQL can make lists and structs of them); metadata answers are strict too."""
    expected: dict[int, dict[str, float | None]] = {
        0: {"x": 1.5, "f": None},
        1: {"x": None, "f": 0.5},
        2: {"x": None, "f": None},
        3: {"x": None, "f": None},
    }
    row_reads: list[tuple[str, dict[str, Any]]] = [
        ("/tables/floats/scan", {}),
        ("/tables/floats/search/bm25", {"column": "title", "query": "flow", "k": 10}),
        ("/tables/floats/search/prefix", {"column": "title", "prefix": "fl", "k": 10}),
        ("/tables/floats/search/token_match", {"column": "title", "tokens": ["flow"]}),
        ("/tables/floats/search/vector", {"column": "emb", "vector": [1.0, 0.5, 0.25], "k": 10}),
        (
            "/tables/floats/search/hybrid",
            {"text_column": "title", "query": "flow", "vector_column": "emb", "vector": [1.0, 0.5, 0.25], "k": 10},
        ),
        ("/sql", {"query": "SELECT id, x, f, x * 2 AS y FROM floats"}),
    ]
    for path, body in row_reads:
        response = http.post(path, headers=ADMIN, json=body)
        assert response.status_code == 200, (path, response.text)
        out = {r["id"]: r for r in strict(response)["rows"]}
        assert set(out) == set(expected), path
        for key, values in expected.items():
            assert {c: out[key][c] for c in values} == values, (path, key)
    nested = http.post(
        "/sql",
        headers=ADMIN,
        json={"query": "SELECT id, make_array(x, 2.0) AS xs, named_struct('x', x, 'one', 1.0) AS s FROM floats"},
    )
    assert nested.status_code == 200, nested.text
    out = {r["id"]: (r["xs"], r["s"]) for r in strict(nested)["rows"]}
    assert out[0] == ([1.5, 2.0], {"x": 1.5, "one": 1.0}) and out[1] == ([None, 2.0], {"x": None, "one": 1.0})
    changes = http.get("/tables/floats/changes", headers=ADMIN, params={"from": 1})
    assert sorted(r["x"] for r in strict(changes)["rows"] if r["x"] is not None) == [1.5]
    for path in ("/tables/floats", "/tables/floats/stats", "/tables/floats/versions", "/tables/floats/properties"):
        response = http.get(path, headers=ADMIN)
        assert response.status_code == 200, (path, response.text)
        strict(response)
    # the describe answers of create_table (exist_ok) and of GET agree, and both are strict
    again = http.post(
        "/tables", headers=ADMIN, json={"name": "floats", "schema": [{"name": "id", "type": "int64"}], "exist_ok": True}
    )
    described = strict(http.get("/tables/floats", headers=ADMIN))
    assert again.status_code == 200, again.text
    assert strict(again)["options"] == described["options"]


def _raw(token: str) -> dict[str, tuple[str, str, bytes]]:
    """Every route that reads a JSON body, with a body holding ``token`` where a number may stand."""
    t = token.encode()
    vector = b'"vector": [1.0, ' + t + b", 0.0]"
    return {
        "append": ("POST", "/tables/floats/append", b'[{"id": 9, "title": "new", "x": ' + t + b', "emb": [1, 0, 0]}]'),
        "append rows": ("POST", "/tables/floats/append", b'{"rows": [{"id": 9, "emb": [1, 0, 0], "f": ' + t + b"}]}"),
        "update": (
            "POST",
            "/tables/floats/update",
            b'{"where": "id = 0", "rows": [{"id": 0, "title": "x", "x": ' + t + b', "emb": [1, 0, 0]}]}',
        ),
        "delete": ("POST", "/tables/floats/delete", b'{"where": "id = 0", "limit": ' + t + b"}"),
        "restore": ("POST", "/tables/floats/restore", b'{"version": ' + t + b"}"),
        "bm25": ("POST", "/tables/floats/search/bm25", b'{"column": "title", "query": "flow", "k": ' + t + b"}"),
        "prefix": ("POST", "/tables/floats/search/prefix", b'{"column": "title", "prefix": "fl", "k": ' + t + b"}"),
        "token_match": ("POST", "/tables/floats/search/token_match", b'{"column": "title", "tokens": [' + t + b"]}"),
        "exact_match": ("POST", "/tables/floats/search/exact_match", b'{"column": "title", "value": ' + t + b"}"),
        "vector": ("POST", "/tables/floats/search/vector", b'{"column": "emb", ' + vector + b"}"),
        "hybrid": (
            "POST",
            "/tables/floats/search/hybrid",
            b'{"text_column": "title", "query": "flow", "vector_column": "emb", ' + vector + b"}",
        ),
        "scan": ("POST", "/tables/floats/scan", b'{"where": "x > 0", "columns": ["id"], "offset": ' + t + b"}"),
        "count": ("POST", "/tables/floats/count", b'{"where": null, "x": ' + t + b"}"),
        "sql": ("POST", "/sql", b'{"query": "SELECT 1", "max_rows": ' + t + b"}"),
        "optimize": ("POST", "/tables/floats/optimize", b'{"target_rows": ' + t + b"}"),
        "cleanup": ("POST", "/tables/floats/cleanup", b'{"older_than": ' + t + b', "dry_run": true}'),
        "create": (
            "POST",
            "/tables",
            b'{"name": "made", "schema": [{"name": "a", "type": "double"}], "options": {"max_staleness_s": '
            + t
            + b"}}",
        ),
        "create vector spec": (
            "POST",
            "/tables",
            b'{"name": "made", "schema": [{"name": "v", "type": "vector[2]"}], "vector_columns": {"v": {"dim": 2, '
            b'"index": {"m": ' + t + b"}}}}",
        ),
        "namespace": ("POST", "/namespaces", b'{"name": "made", "exist_ok": ' + t + b"}"),
        "add column": (
            "POST",
            "/tables/floats/columns",
            b'{"columns": [{"name": "z", "type": "double"}], "defaults": {"z": ' + t + b"}}",
        ),
        "alter column": ("PATCH", "/tables/floats/columns/x", b'{"type": "double", "name": ' + t + b"}"),
        "create index": (
            "POST",
            "/tables/floats/indexes",
            b'{"column": "title", "kind": "fts", "tokenizer": ' + t + b"}",
        ),
    }


@pytest.mark.parametrize("token", TOKENS)
def test_nan_tokens_in_a_body_are_a_typed_400(
    http: httpx.Client, engine: superfile.Connection, floats: str, token: str
) -> None:
    """Each route refuses the token itself (before the body's shape is checked) with a 400 naming it and where
    it stood (a number beyond a double's range too: Python would read it as an infinity); in a query vector the
    error is the engine's own for such a vector (``InvalidVectorError``), as the SDK, which sends a NaN in a
    query vector as it is, expects."""
    before = state(engine, "floats"), engine.open_table("floats").schema, engine.table_names(), engine.list_namespaces()
    wrong = []
    for what, (method, path, body) in _raw(token).items():
        response = http.request(method, path, headers=JSON_TYPE, content=body)
        in_vector = what in ("vector", "hybrid")
        expected = (400, "InvalidVectorError" if in_vector else "InvalidInputError")
        message = strict(response)["error"]["message"] if response.status_code >= 400 else ""
        hint = "must hold finite numbers" if in_vector else "null for a missing one"
        if error_of(response) != expected or f"{token} at " not in message or hint not in message:
            wrong.append(f"{what}: {response.status_code} {response.text}")
    assert not wrong, "\n".join(wrong)
    schema = engine.open_table("floats").schema
    assert (state(engine, "floats"), schema, engine.table_names(), engine.list_namespaces()) == before


def test_a_nan_token_inside_a_string_is_text(http: httpx.Client, engine: superfile.Connection, floats: str) -> None:
    """Only number tokens are refused: the word NaN in a query, a predicate or a SQL string literal is text, and
    so is a long exponent in a string (it only makes the parser check each number)."""
    found = http.post("/tables/floats/search/bm25", headers=JSON_TYPE, content=b'{"column": "title", "query": "NaN"}')
    assert found.status_code == 200 and strict(found)["num_rows"] == 0
    sql = http.post("/sql", headers=JSON_TYPE, content=b"{\"query\": \"SELECT 'Infinity' AS t, 'NaN' AS u\"}")
    assert sql.status_code == 200, sql.text
    assert strict(sql)["rows"] == [{"t": "Infinity", "u": "NaN"}]
    big = http.post("/tables/floats/count", headers=JSON_TYPE, content=b'{"where": "title != \'1e999\'"}')
    assert big.status_code == 200 and strict(big) == {"count": engine.open_table("floats").count_rows()}
    small = http.post(
        "/tables/floats/search/vector",
        headers=JSON_TYPE,
        content=b'{"column": "emb", "vector": [1e-400, 1.5e000, 2.5e+001], "k": 1}',
    )
    assert small.status_code == 200, small.text
