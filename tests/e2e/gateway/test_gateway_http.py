"""The HTTP surface: bad requests are 4xx with a JSON error and write nothing; Arrow and JSON agree; metrics, docs."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from gateway_helpers import MAX_BODY, SCHEMA, error_of, rows, state
from superfile.remote.errors import GatewayUnavailableError
from superfile.remote.wire import ARROW_STREAM, from_ipc, to_ipc
from superfile_gateway import BackgroundServer, Settings, parse_api_keys

ADMIN = {"Authorization": "Bearer admin-key"}
CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"


def test_bad_json_is_400_and_writes_nothing(
    http: httpx.Client, engine: superfile.Connection, tables: list[str]
) -> None:
    before = state(engine, "docs")
    json_type = {**ADMIN, "content-type": "application/json"}
    for path in ("/tables/docs/append", "/tables/docs/update", "/tables/docs/delete", "/tables/docs/search/bm25"):
        assert error_of(http.post(path, headers=json_type, content=b'{"rows": [')) == (400, "InvalidInputError"), path
    assert error_of(http.post("/tables/docs/append", headers=json_type, content=b'{"not": "rows"}')) == (
        400,
        "InvalidInputError",
    )
    arrow_type = {**ADMIN, "content-type": ARROW_STREAM}
    assert error_of(http.post("/tables/docs/append", headers=arrow_type, content=b"not arrow")) == (
        400,
        "InvalidInputError",
    )
    assert state(engine, "docs") == before


def test_wrong_shape_is_422(http: httpx.Client, tables: list[str]) -> None:
    cases = [
        {"column": "title"},  # no query
        {"column": "title", "query": "flow", "k": "many"},
        {"column": "title", "query": "flow", "unexpected": 1},
    ]
    for body in cases:
        response = http.post("/tables/docs/search/bm25", headers=ADMIN, json=body)
        assert error_of(response) == (422, "InvalidInputError"), body
    assert "k" in http.post("/tables/docs/search/bm25", headers=ADMIN, json=cases[1]).json()["error"]["message"]
    assert error_of(http.post("/tables/docs/delete", headers=ADMIN, json={})) == (422, "InvalidInputError")


def test_wrong_schema_and_bad_values_write_nothing(
    http: httpx.Client, engine: superfile.Connection, tables: list[str]
) -> None:
    before = state(engine, "docs")
    bad = [
        ([{"key": 1, "nope": 2, "emb": [0, 0, 0, 1]}], "SchemaMismatchError"),
        ([{"key": "one", "emb": [0, 0, 0, 1]}], "SchemaMismatchError"),
        ([{"key": 1, "emb": [0, 0, 0, 1], "_id": 5}], "SchemaMismatchError"),
        (pa.table({"key": [1], "emb": [[0.0, 1.0]]}), "VectorDimensionError"),
        (pa.table({"key": [1], "emb": [[float("inf"), 0.0, 0.0, 1.0]]}), "InvalidVectorError"),
    ]
    for data, expected in bad:
        if isinstance(data, pa.Table):
            response = http.post(
                "/tables/docs/append", headers={**ADMIN, "content-type": ARROW_STREAM}, content=to_ipc(data)
            )
        else:
            response = http.post("/tables/docs/append", headers=ADMIN, json=data)
        assert error_of(response) == (400, expected), data
    update = http.post("/tables/docs/update", headers=ADMIN, json={"where": "key < 2", "rows": rows(range(1))})
    assert error_of(update) == (400, "InvalidInputError")  # matched 2 rows, 1 replacement given
    assert error_of(http.post("/tables/docs/update", headers=ADMIN, json=rows(range(1)))) == (400, "InvalidInputError")
    assert error_of(http.post("/tables/docs/delete", headers=ADMIN, json={"where": "key >>> 1"})) == (
        400,
        "InvalidPredicateError",
    )
    assert state(engine, "docs") == before


def test_unknown_table_and_bad_names(http: httpx.Client, engine: superfile.Connection, tables: list[str]) -> None:
    assert error_of(http.get("/tables/nosuch", headers=ADMIN)) == (404, "TableNotFoundError")
    assert error_of(http.post("/tables/nosuch/append", headers=ADMIN, json=rows(range(1)))) == (
        404,
        "TableNotFoundError",
    )
    assert error_of(http.post("/tables/nosuch/search/bm25", headers=ADMIN, json={"column": "t", "query": "q"})) == (
        404,
        "TableNotFoundError",
    )
    assert "nosuch" not in engine.table_names()
    for name in ("%2E%2E", ".hidden", "a%20b", "a..b", "x" * 200):  # "a.b" names table b of namespace a
        response = http.get(f"/tables/{name}", headers=ADMIN)
        assert error_of(response) == (400, "InvalidTableNameError"), name
    bad_create = http.post("/tables", headers=ADMIN, json={"name": "../up", "schema": [{"name": "a", "type": "int64"}]})
    assert error_of(bad_create) == (400, "InvalidTableNameError")
    unknown_type = http.post(
        "/tables", headers=ADMIN, json={"name": "typed", "schema": [{"name": "a", "type": "int65"}]}
    )
    assert error_of(unknown_type) == (400, "InvalidInputError")
    bad_option = http.post(
        "/tables",
        headers=ADMIN,
        json={"name": "typed", "schema": [{"name": "a", "type": "int64"}], "options": {"max_staleness_s": "soon"}},
    )
    assert error_of(bad_option) == (400, "InvalidOptionError")
    assert "typed" not in engine.table_names()
    assert error_of(http.get("/no/such/route", headers=ADMIN))[0] == 404


def _chunks(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        chunk = b" " * min(16384, total - sent)
        sent += len(chunk)
        yield chunk


def test_oversized_body_is_413_and_writes_nothing(
    http: httpx.Client, engine: superfile.Connection, tables: list[str]
) -> None:
    before = state(engine, "docs")
    big = rows(range(MAX_BODY // 50))  # a few hundred KB of JSON
    declared = http.post("/tables/docs/append", headers=ADMIN, json=big)
    assert error_of(declared) == (413, "PayloadTooLargeError")
    streamed = http.post(
        "/tables/docs/append", headers={**ADMIN, "content-type": "application/json"}, content=_chunks(MAX_BODY + 1)
    )
    assert error_of(streamed) == (413, "PayloadTooLargeError")
    arrow = to_ipc(pa.Table.from_pylist(big, schema=SCHEMA))
    assert len(arrow) > MAX_BODY
    response = http.post("/tables/docs/append", headers={**ADMIN, "content-type": ARROW_STREAM}, content=arrow)
    assert error_of(response) == (413, "PayloadTooLargeError")
    assert state(engine, "docs") == before
    # Under the limit, streamed without a length, the body is accepted.
    small = http.post(
        "/tables/docs/search/bm25",
        headers={**ADMIN, "content-type": "application/json"},
        content=iter([b'{"column": "title", ', b'"query": "flow", "k": 2}']),
    )
    assert small.status_code == 200 and small.json()["num_rows"] == 2


def test_arrow_and_json_bodies_agree(http: httpx.Client, engine: superfile.Connection, tables: list[str]) -> None:
    body = {"column": "title", "query": "document flow", "k": 5, "projection": ["key", "title"]}
    as_json = http.post("/tables/other/search/bm25", headers=ADMIN, json=body)
    as_arrow = http.post("/tables/other/search/bm25", headers={**ADMIN, "accept": ARROW_STREAM}, json=body)
    assert as_json.headers["content-type"] == "application/json"
    assert as_arrow.headers["content-type"] == ARROW_STREAM
    table = from_ipc(as_arrow.content)
    assert table.schema.field("_id").type == pa.uint64()
    assert table.schema.metadata and b"superfile.superfiles" in table.schema.metadata  # query counts travel along
    assert as_json.json()["columns"] == table.column_names == ["_id", "score", "key", "title"]
    assert as_json.json()["rows"] == table.to_pylist()
    direct = engine.open_table("other").bm25_search("title", "document flow", k=5, projection=["key", "title"])
    assert table.equals(direct)
    # An Arrow append and an Arrow update (predicate as a query parameter).
    v, n = state(engine, "other")
    new = pa.Table.from_pylist(rows(range(500, 503)), schema=SCHEMA)
    appended = http.post("/tables/other/append", headers={**ADMIN, "content-type": ARROW_STREAM}, content=to_ipc(new))
    assert appended.json() == {"version": v + 1, "position": None}
    replacement = pa.Table.from_pylist([{**rows(range(1))[0], "key": 501, "title": "replaced"}], schema=SCHEMA)
    updated = http.post(
        "/tables/other/update",
        params={"where": "key = 501"},
        headers={**ADMIN, "content-type": ARROW_STREAM},
        content=to_ipc(replacement),
    )
    assert updated.json()["version"] == v + 2
    assert engine.open_table("other").to_arrow(columns=["title"], where="key = 501").to_pylist() == [
        {"title": "replaced"}
    ]
    assert state(engine, "other") == (v + 2, n + 3)


def test_service_endpoints(http: httpx.Client, tables: list[str]) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready", "mode": "embedded"}
    spec = http.get("/openapi.json").json()
    for path in ("/tables", "/tables/{name}/append", "/tables/{name}/search/vector", "/tables/{name}/search/hybrid"):
        assert path in spec["paths"]
    assert ARROW_STREAM in spec["paths"]["/tables/{name}/append"]["post"]["requestBody"]["content"]
    assert set(spec["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert http.get("/docs").status_code == 200
    for _ in range(3):
        searched = http.post("/tables/docs/search/bm25", headers=ADMIN, json={"column": "title", "query": "flow"})
        # the engine's share of the request (Elasticsearch's "took"), never more than the whole round trip
        took = re.fullmatch(r"engine;dur=(\d+\.\d{3})", searched.headers["server-timing"])
        assert took and 0 < float(took.group(1)) <= searched.elapsed.total_seconds() * 1000
    http.post("/tables/docs/search/vector", headers=ADMIN, json={"column": "emb", "vector": [1, 0, 0, 0]})
    http.get("/tables", headers={"X-API-Key": "wrong"})
    text = http.get("/metrics").text
    count = re.search(r'superfile_gateway_query_duration_seconds_count\{kind="bm25"[^}]*\} (\d+)', text)
    assert count and int(count.group(1)) >= 3
    assert re.search(r'superfile_gateway_query_duration_seconds_bucket\{kind="vector",le="0.005"', text)
    assert re.search(r'superfile_gateway_requests_total\{[^}]*status="401"[^}]*\} [1-9]', text)
    assert re.search(r'superfile_gateway_errors_total\{[^}]*type="AuthenticationError"[^}]*\} [1-9]', text)
    assert "admin-key" not in text


def test_sdk_results_equal_in_process(tmp_path: Path) -> None:
    """Over the Cranfield sample: SDK results through the gateway are the engine's results, bit for bit."""
    docs = pq.read_table(CRANFIELD / "docs.parquet").slice(0, 400)
    queries = pq.read_table(CRANFIELD / "queries.parquet").slice(0, 10).to_pylist()
    uri = f"file://{tmp_path}"
    local = superfile.connect(uri).create_table(
        "cranfield", docs.schema, fts_columns=["title", "text"], vector_columns={"embedding": 384}
    )
    local.append(docs)
    settings = Settings(storage=uri, api_keys=parse_api_keys("k:*:r"))
    with BackgroundServer(settings) as srv, superfile.connect(srv.url, api_key="k") as db:
        remote = db.open_table("cranfield")
        assert remote.schema.equals(local.schema) and remote.options == local.options
        for q in queries:
            assert remote.bm25_search("text", q["text"], k=10).equals(local.bm25_search("text", q["text"], k=10))
            assert remote.vector_search("embedding", q["embedding"], k=10, projection=["id"]).equals(
                local.vector_search("embedding", q["embedding"], k=10, projection=["id"])
            )
        assert remote.bm25_search_prefix("title", "aero", k=10).equals(local.bm25_search_prefix("title", "aero"))
        assert remote.to_arrow(where="id < 50").equals(local.to_arrow(where="id < 50"))


def test_concurrent_searches(server: BackgroundServer, engine: superfile.Connection, tables: list[str]) -> None:
    """Overlapping searches (handed to the thread pool) answer exactly what a lone one (on the event loop) does."""
    expected = {
        q: engine.open_table("docs").bm25_search("title", q, k=5, projection=["key"]) for q in ("flow", "document 7")
    }
    with superfile.connect(server.url, api_key="reader-key") as db:
        docs = db.open_table("docs")

        def one(i: int) -> bool:
            q = "flow" if i % 2 else "document 7"
            return bool(docs.bm25_search("title", q, k=5, projection=["key"]).equals(expected[q]))

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(one, range(64)))


def test_sdk_reports_an_unreachable_or_silent_gateway() -> None:
    """No server on the port: unreachable. A server that accepts and never answers: no answer in time."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        closed_port = free.getsockname()[1]
        free.close()
        with pytest.raises(GatewayUnavailableError, match="unreachable"):
            superfile.connect(f"http://127.0.0.1:{closed_port}", api_key="k").table_names()
        start = time.monotonic()
        with pytest.raises(GatewayUnavailableError, match="did not answer in time"):
            superfile.connect(f"http://127.0.0.1:{silent.getsockname()[1]}", api_key="k", timeout=0.5).table_names()
        assert time.monotonic() - start < 5


def _strict(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def test_json_is_strict_both_ways(http: httpx.Client, engine: superfile.Connection, tables: list[str]) -> None:
    """NaN and infinities leave as null (strict parsers reject the tokens Python writes for them); a body that
    sends them is a 400 and writes nothing."""
    table = engine.create_table("floats", pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    table.append({"id": [0, 1, 2, 3], "x": [1.5, float("nan"), float("inf"), None]})
    for path, body in (("/tables/floats/scan", {}), ("/sql", {"query": "SELECT id, x, x * 2 AS y FROM floats"})):
        response = http.post(path, headers=ADMIN, json=body)
        assert response.status_code == 200, response.text
        rows_out = sorted(json.loads(response.text, parse_constant=_strict)["rows"], key=lambda r: r["id"])
        assert [r["x"] for r in rows_out] == [1.5, None, None, None], path
    before = state(engine, "floats")
    json_type = {**ADMIN, "content-type": "application/json"}
    for token in (b"NaN", b"Infinity", b"-Infinity"):
        response = http.post("/tables/floats/append", headers=json_type, content=b'[{"id": 9, "x": ' + token + b"}]")
        assert error_of(response) == (400, "InvalidInputError") and token.decode() in response.text
    assert state(engine, "floats") == before


def test_search_path_answers_as_the_app(http: httpx.Client, tables: list[str]) -> None:
    """A search of the latest version is answered ahead of FastAPI (``SearchFirst``); a query string sends the
    same request through the app's route. Both answer alike: the rows, and every refusal (key, scope, body,
    table, column) with the same status and error."""
    bm25 = json.dumps({"column": "title", "query": "document flow", "k": 5, "projection": ["key"]}).encode()
    vector = json.dumps({"column": "emb", "vector": [1.0, 2.0, 0.0, 0.5], "k": 4, "projection": ["key"]}).encode()
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("/tables/docs/search/bm25", bm25, ADMIN),
        ("/tables/docs/search/vector", vector, {"x-api-key": "reader-key"}),
        ("/tables/docs/search/bm25", bm25, {"Authorization": "Bearer docs-writer"}),
        ("/tables/other/search/bm25", bm25, {"Authorization": "Bearer docs-writer"}),  # 403: not its tables
        ("/tables/docs/search/bm25", bm25, {}),  # 401
        ("/tables/docs/search/bm25", bm25, {"Authorization": "Bearer not-a-key"}),  # 401
        ("/tables/docs/search/bm25", b"not json", ADMIN),  # 400
        ("/tables/docs/search/bm25", b"", ADMIN),  # 422
        ("/tables/docs/search/vector", b'{"column": "emb", "vector": [NaN], "k": 3}', ADMIN),  # 400
        ("/tables/docs/search/bm25", b'{"column": "title", "query": "x", "k": "5"}', ADMIN),  # 422
        ("/tables/docs/search/bm25", b'{"column": "title", "query": "x", "nope": 1}', ADMIN),  # 422
        ("/tables/docs/search/bm25", bm25, {**ADMIN, "content-type": "text/plain"}),  # 422
        ("/tables/docs/search/bm25", b'{"column": "nope", "query": "x"}', ADMIN),  # the engine's 4xx
        ("/tables/nope/search/bm25", bm25, ADMIN),  # 404
        ("/tables/docs/search/nope", bm25, ADMIN),  # 404, not a route
    ]
    statuses = []
    for path, body, headers in cases:
        sent = {"content-type": "application/json", **headers}
        fast = http.post(path, content=body, headers=sent)
        app = http.post(f"{path}?through=app", content=body, headers=sent)
        assert (fast.status_code, fast.content, fast.headers.get("content-type")) == (
            app.status_code,
            app.content,
            app.headers.get("content-type"),
        ), (path, body[:80], headers)
        statuses.append(fast.status_code)
    assert statuses == [200, 200, 200, 403, 401, 401, 400, 422, 400, 422, 422, 422, 400, 404, 404]


def test_search_first_answers_a_search_without_the_app(tmp_path: Path) -> None:
    """``SearchFirst`` (in process, over an embedded gateway) answers a valid search itself and hands the app
    only what it does not accept: the app's answer to those is checked against it above."""
    import asyncio

    from superfile_gateway.app import create_app
    from superfile_gateway.routes.search import SearchFirst

    app = create_app(Settings(storage=f"file://{tmp_path}", api_keys=parse_api_keys("the-key:*:rw")))
    gw = app.state.gateway
    gw.db.create_table("t", pa.schema([("text", pa.string())]), fts_columns=["text"]).append(
        pa.table({"text": ["alpha beta", "beta gamma"]})
    )
    handed: list[str] = []

    async def spy(scope: dict[str, object], receive: object, send: object) -> None:
        handed.append(str(scope["path"]))
        await app(scope, receive, send)  # type: ignore[arg-type]

    async def search(body: bytes, key: str = "the-key") -> int:
        transport = httpx.ASGITransport(app=SearchFirst(spy, gw=gw))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
            return (await client.post("/tables/t/search/bm25", content=body, headers=headers)).status_code

    try:
        assert asyncio.run(search(b'{"column": "text", "query": "beta", "k": 5}')) == 200
        assert handed == []
        assert asyncio.run(search(b'{"column": "text", "query": "beta", "k": "5"}')) == 422
        assert asyncio.run(search(b'{"column": "text", "query": "beta"}', key="wrong")) == 401
        assert handed == ["/tables/t/search/bm25"] * 2
    finally:
        gw.close()
