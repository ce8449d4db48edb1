"""API keys: 401 without a known key, 403 without the scope or for another table; a refused write changes nothing."""

from __future__ import annotations

import httpx
import pytest
import superfile
from gateway_helpers import error_of, rows, state
from superfile.remote import AuthenticationError, PermissionDeniedError
from superfile_gateway import BackgroundServer, ConfigError, Settings, parse_api_keys

APPEND = {"json": rows(range(100, 103))}
SEARCH = {"json": {"column": "title", "query": "flow", "k": 3}}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        _bearer("wrong-key"),
        {"X-API-Key": "wrong-key"},
        {"Authorization": "Basic YWRtaW4ta2V5"},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "wrong-bearer", "wrong-x-api-key", "basic-scheme", "empty-bearer"],
)
def test_unknown_key_is_401_and_writes_nothing(
    http: httpx.Client, engine: superfile.Connection, tables: list[str], headers: dict[str, str]
) -> None:
    before = state(engine, "docs")
    assert error_of(http.post("/tables/docs/append", headers=headers, **APPEND)) == (401, "AuthenticationError")
    assert error_of(http.post("/tables/docs/delete", headers=headers, json={"where": "key < 5"})) == (
        401,
        "AuthenticationError",
    )
    assert error_of(http.post("/tables/docs/search/bm25", headers=headers, **SEARCH)) == (401, "AuthenticationError")
    assert error_of(http.get("/tables", headers=headers)) == (401, "AuthenticationError")
    assert state(engine, "docs") == before


def test_read_only_key_cannot_write(http: httpx.Client, engine: superfile.Connection, tables: list[str]) -> None:
    before = state(engine, "docs")
    reader = {"X-API-Key": "reader-key"}
    assert error_of(http.post("/tables/docs/append", headers=reader, **APPEND)) == (403, "PermissionDeniedError")
    assert error_of(http.post("/tables/docs/delete", headers=reader, json={"where": "key < 5"})) == (
        403,
        "PermissionDeniedError",
    )
    update = http.post("/tables/docs/update", headers=reader, json={"where": "key = 1", "rows": rows(range(1))})
    assert error_of(update) == (403, "PermissionDeniedError")
    assert error_of(http.delete("/tables/docs", headers=reader)) == (403, "PermissionDeniedError")
    create = http.post("/tables", headers=reader, json={"name": "docs2", "schema": [{"name": "a", "type": "int64"}]})
    assert error_of(create) == (403, "PermissionDeniedError")
    assert state(engine, "docs") == before
    assert "docs2" not in engine.table_names()
    found = http.post("/tables/docs/search/bm25", headers=reader, **SEARCH)
    assert found.status_code == 200 and found.json()["num_rows"] == 3


def test_key_scoped_to_other_tables(http: httpx.Client, engine: superfile.Connection, tables: list[str]) -> None:
    before = state(engine, "other")
    writer = _bearer("docs-writer")
    assert error_of(http.post("/tables/other/append", headers=writer, **APPEND)) == (403, "PermissionDeniedError")
    assert error_of(http.post("/tables/other/search/bm25", headers=writer, **SEARCH)) == (403, "PermissionDeniedError")
    assert error_of(http.get("/tables/other", headers=writer)) == (403, "PermissionDeniedError")
    assert error_of(http.delete("/tables/other", headers=writer)) == (403, "PermissionDeniedError")
    assert state(engine, "other") == before
    # The catalog and SQL only show it the tables it may read.
    assert http.get("/tables", headers=writer).json()["tables"] == ["docs"]
    sql = http.post("/sql", headers=writer, json={"query": "SELECT count(*) AS n FROM other"})
    assert error_of(sql) == (400, "SqlError")
    ok = http.post("/sql", headers=writer, json={"query": "SELECT count(*) AS n FROM docs"})
    assert ok.status_code == 200 and ok.json()["rows"] == [{"n": before[1]}]
    # Its own tables it may write.
    written = http.post("/tables/docs/append", headers=writer, **APPEND)
    assert written.status_code == 200 and written.json()["version"] == state(engine, "docs")[0]


def test_keys_scope_namespaces(server: BackgroundServer, engine: superfile.Connection, tables: list[str]) -> None:
    """A key whose grants are team* manages namespace team and its tables, and sees nothing else."""
    with superfile.connect(server.url, api_key="admin-key") as admin:
        admin.create_namespace("elsewhere", exist_ok=True)
    with superfile.connect(server.url, api_key="team-key") as db:
        db.create_namespace("team", exist_ok=True)
        t = db.create_table("team.docs", data=[{"key": k} for k in range(3)], exist_ok=True)
        assert t.count_rows() == 3
        assert db.list_namespaces() == ["team"] and db.table_names() == ["team.docs"]
        for refused in (
            lambda: db.create_namespace("other"),
            lambda: db.drop_namespace("elsewhere"),
            lambda: db.create_table("elsewhere.docs", data=[{"key": 1}]),
            lambda: db.open_table("docs").append(rows(range(1))),
        ):
            with pytest.raises(PermissionDeniedError):
                refused()
    assert "other" not in engine.list_namespaces() and "elsewhere.docs" not in engine.table_names()


def test_sdk_raises_typed_errors(server: BackgroundServer, engine: superfile.Connection, tables: list[str]) -> None:
    before = state(engine, "docs")
    with superfile.connect(server.url, api_key="nope") as db, pytest.raises(AuthenticationError):
        db.table_names()
    with superfile.connect(server.url, api_key="reader-key") as db:
        docs = db.open_table("docs")
        assert len(docs.bm25_search("title", "flow", k=2)) == 2
        with pytest.raises(PermissionDeniedError):
            docs.append(rows(range(200, 201)))
    assert state(engine, "docs") == before


def test_a_missing_key_names_the_variable(
    server: BackgroundServer, tables: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK that sent no key is told both ways to give one; connect() reads SUPERFILE_API_KEY itself."""
    monkeypatch.delenv("SUPERFILE_API_KEY", raising=False)
    with superfile.connect(server.url) as db, pytest.raises(AuthenticationError, match="SUPERFILE_API_KEY") as missing:
        db.table_names()
    assert "api_key=" in str(missing.value)
    with superfile.connect(server.url, api_key="nope") as db, pytest.raises(AuthenticationError) as wrong:
        db.table_names()
    assert "SUPERFILE_API_KEY" not in str(wrong.value)  # a key was sent: it is wrong, not missing
    monkeypatch.setenv("SUPERFILE_API_KEY", "reader-key")
    with superfile.connect(server.url) as db:
        assert "docs" in db.table_names()
    monkeypatch.setenv("SUPERFILE_API_KEY", "stale-key")
    with superfile.connect(server.url) as db, pytest.raises(AuthenticationError, match="SUPERFILE_API_KEY"):
        db.table_names()  # a wrong key from the environment: the message says where it came from
    with superfile.connect(server.url, api_key="reader-key") as db:
        assert "docs" in db.table_names()  # an explicit key wins over the environment


def test_no_keys_refuses_to_start(storage: str) -> None:
    with pytest.raises(ConfigError, match="no API keys"):
        Settings(storage=storage)
    with pytest.raises(ConfigError, match="key:table-glob:scopes"):
        parse_api_keys("just-a-key")
    with pytest.raises(ConfigError, match="scopes"):
        parse_api_keys("k:*:rwx")
    # Keys are kept as digests only: not in the settings' repr, where logs might print them.
    assert "admin-key" not in repr(Settings(storage=storage, api_keys=parse_api_keys("admin-key:*:rw")))
    open_settings = Settings(storage=storage, auth=False)
    with BackgroundServer(open_settings) as srv, httpx.Client(base_url=srv.url) as client:
        assert client.get("/tables").status_code == 200
