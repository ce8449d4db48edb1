"""Hostile input to a real gateway process (issue: a read-only key must not crash, stall or write): reads of
tables that do not exist change nothing in storage, names are checked in full, numbers are numbers, nested
JSON is refused, keys in URLs are refused and never logged, an unreachable ``wait_for`` answers at once. After
every probe the gateway is alive and both tables hold exactly their rows."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import superfile

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from e2e_support import GatewayProcess

READ_KEY = "hostile-reader-key"
WRITE_KEY = "owner-key"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string())])
ROWS = {"a": 300, "b": 200}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    root = tmp_path_factory.mktemp("hostile")
    db = superfile.connect(f"file://{root}")
    for name, n in ROWS.items():
        db.create_table(name, SCHEMA, fts_columns=["text"]).append(
            {"id": list(range(n)), "text": [f"row {i} of {name}" for i in range(n)]}
        )
    gw = GatewayProcess(SUPERFILE_STORAGE=f"file://{root}", SUPERFILE_API_KEYS=f"{READ_KEY}:*:r,{WRITE_KEY}:*:rw")
    yield gw, root
    gw.stop()


@pytest.fixture
def client(gateway: tuple[GatewayProcess, Path]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway[0].url, headers={"authorization": f"Bearer {READ_KEY}"}, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def _unharmed(gateway: tuple[GatewayProcess, Path]) -> Iterator[None]:
    """Every probe: the storage root gains nothing, the gateway stays up and fast, both tables hold their rows."""
    gw, root = gateway
    before = _tree(root)
    yield
    assert _tree(root) - before == set(), "a probe wrote to storage"
    with httpx.Client(base_url=gw.url, timeout=5) as health:
        started = time.monotonic()
        assert health.get("/healthz").status_code == 200
        assert time.monotonic() - started < 0.1
    db = superfile.connect(gw.url, api_key=READ_KEY)
    assert {name: db.open_table(name).count_rows() for name in ROWS} == ROWS


MISSING_READS = [
    ("GET", "/tables/x", None),
    ("GET", "/tables/x/stats", None),
    ("GET", "/tables/x/version", None),
    ("GET", "/tables/x/versions", None),
    ("GET", "/tables/x/properties", None),
    ("GET", "/tables/x/idempotency?key=k", None),
    ("GET", "/tables/x/changes?from=1", None),
    ("POST", "/tables/x/scan", {}),
    ("POST", "/tables/x/count", {}),
    ("POST", "/tables/x/search/bm25", {"column": "text", "query": "row"}),
    ("POST", "/tables/x/search/prefix", {"column": "text", "prefix": "ro"}),
    ("POST", "/tables/x/search/token_match", {"column": "text", "tokens": "row"}),
    ("POST", "/tables/x/search/exact_match", {"column": "text", "value": "row"}),
    ("POST", "/tables/x/search/vector", {"column": "v", "vector": [0.0]}),
    ("POST", "/sql", {"query": "SELECT count(*) FROM x"}),
    ("POST", "/sql", {"query": "SELECT * FROM bm25_search('x', 'text', 'row', 5)"}),
]


@pytest.mark.parametrize(("method", "path", "body"), MISSING_READS, ids=[f"{m} {p}" for m, p, _ in MISSING_READS])
def test_reads_of_a_table_that_does_not_exist_write_nothing(
    client: httpx.Client, method: str, path: str, body: object
) -> None:
    response = client.request(method, path, json=body)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["type"] in ("TableNotFoundError", "SqlError", "InvalidInputError")


@pytest.mark.parametrize(
    ("in_url", "name"), [("a%0A", "a\n"), ("b%0A", "b\n"), ("a%00", "a\x00"), ("..", ".."), ("a%20b", "a b")]
)
def test_names_are_matched_in_full(client: httpx.Client, in_url: str, name: str) -> None:
    assert client.get(f"/tables/{in_url}/stats").status_code in (400, 404)
    owner = {"authorization": f"Bearer {WRITE_KEY}"}
    # "/tables/.." is normalised to "/" by the client: DELETE on the playground page is a 405, no table route
    assert client.delete(f"/tables/{in_url}", headers=owner).status_code in (400, 404, 405)
    created = client.post("/tables", json={"name": name, "schema": [{"name": "x", "type": "int64"}]}, headers=owner)
    assert created.status_code == 400, created.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tables/a/search/bm25", {"column": "text", "query": "row", "k": True}),
        ("/tables/a/search/bm25", {"column": "text", "query": "row", "k": 2.0}),
        ("/tables/a/search/bm25", {"column": "text", "query": "row", "k": "5"}),
        ("/tables/a/search/prefix", {"column": "text", "prefix": "ro", "k": False}),
        ("/tables/a/search/vector", {"column": "v", "vector": [True, False]}),
        ("/tables/a/search/vector", {"column": "v", "vector": [0.1], "nprobe": True}),
    ],
)
def test_numbers_are_numbers(client: httpx.Client, path: str, body: object) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422 and response.json()["error"]["type"] == "InvalidInputError", response.text


def test_size_knobs_are_bounded(gateway: tuple[GatewayProcess, Path]) -> None:
    owner = httpx.Client(base_url=gateway[0].url, headers={"authorization": f"Bearer {WRITE_KEY}"}, timeout=30)
    for body in ({"target_bytes": 1e30}, {"target_bytes": 10**30}, {"target_rows": 10**12}, {"target_rows": True}):
        response = owner.post("/tables/a/optimize", json=body)
        assert response.status_code in (400, 422), (body, response.text)


def test_deeply_nested_json_is_a_400(gateway: tuple[GatewayProcess, Path]) -> None:
    owner = {"authorization": f"Bearer {WRITE_KEY}", "content-type": "application/json"}
    for depth in (200, 100_000):
        body = "[" * depth + "]" * depth
        response = httpx.post(f"{gateway[0].url}/tables/a/append", content=body, headers=owner, timeout=30)
        assert response.status_code == 400, response.text[:300]


def test_keys_in_urls_are_refused_and_never_logged(gateway: tuple[GatewayProcess, Path]) -> None:
    gw, _ = gateway
    secret = "secret-in-url-0123456789"
    for parameter in ("api_key", "token", "Access_Token"):
        response = httpx.get(f"{gw.url}/tables/a/stats?{parameter}={secret}", timeout=30)
        assert response.status_code == 400 and "header" in response.json()["error"]["message"], response.text
    response = httpx.get(f"{gw.url}/tables/a/stats?api_key={READ_KEY}", timeout=30)  # even a valid key
    assert response.status_code == 400
    log = gw.output()
    assert "/tables/a/stats?api_key=[redacted]" in log  # the access log saw the request
    assert secret not in log and READ_KEY not in log


def test_a_wait_for_that_cannot_be_reached_is_refused_at_once(client: httpx.Client) -> None:
    """Embedded mode has no log: a position not visible now never will be."""
    started = time.monotonic()
    response = client.get("/tables/a/version", params={"wait_for": "superfile.a@99999999"})
    assert response.status_code == 400 and "never written" in response.json()["error"]["message"]
    assert time.monotonic() - started < 2
    response = client.post("/tables/a/count", json={}, params={"wait_for": "superfile.a@5"})
    assert response.status_code == 400


def test_the_storage_root_is_where_the_tables_are(gateway: tuple[GatewayProcess, Path]) -> None:
    """The fixture's check of 'no new file' is only as good as the root it watches."""
    assert {"a", "b"} <= set(os.listdir(gateway[1]))
