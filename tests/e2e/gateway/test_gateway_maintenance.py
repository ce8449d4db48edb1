"""Maintenance and history over HTTP: optimize, cleanup, restore, changes and as_of reads, with scopes and 4xx."""

from __future__ import annotations

import datetime
import re
import uuid
from pathlib import Path

import httpx
import pyarrow as pa
import superfile
from e2e_support import wait_until
from gateway_helpers import SCHEMA, error_of, rows, state
from superfile.remote.wire import ARROW_STREAM, from_ipc
from superfile_gateway import BackgroundServer, Settings

ADMIN = {"Authorization": "Bearer admin-key"}
READER = {"X-API-Key": "reader-key"}
DOCS_WRITER = {"Authorization": "Bearer docs-writer"}


def _table(engine: superfile.Connection, prefix: str = "m") -> str:
    """A fresh table of four small superfiles (key 0..7, two rows per append): versions 1 (create) to 5."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    table = engine.create_table(name, SCHEMA, fts_columns=["title"], vector_columns={"emb": 4})
    for start in range(0, 8, 2):
        table.append(rows(range(start, start + 2)))
    return name


def test_scopes(http: httpx.Client, engine: superfile.Connection) -> None:
    """Maintenance needs the write scope on the table; history reads need the read scope."""
    name = _table(engine)
    before = state(engine, name)
    for path, body in (("optimize", {}), ("cleanup", {"older_than": 7200}), ("restore", {"version": 2})):
        response = http.post(f"/tables/{name}/{path}", headers=READER, json=body)
        assert error_of(response) == (403, "PermissionDeniedError"), path
        response = http.post(f"/tables/{name}/{path}", headers=DOCS_WRITER, json=body)  # its glob is docs*
        assert error_of(response) == (403, "PermissionDeniedError"), path
        assert error_of(http.post(f"/tables/{name}/{path}", json=body)) == (401, "AuthenticationError"), path
    assert state(engine, name) == before
    assert engine.open_table(name).stats()["superfile_count"] == 4
    assert http.get(f"/tables/{name}/changes", headers=READER, params={"from": 1}).json()["num_rows"] == 8
    assert len(http.get(f"/tables/{name}/versions", headers=READER).json()["versions"]) == 5
    scan = http.post(f"/tables/{name}/scan", headers=READER, params={"version": 3}, json={"columns": ["key"]})
    assert scan.json()["num_rows"] == 4
    assert error_of(http.get(f"/tables/{name}/changes", headers=DOCS_WRITER, params={"from": 1})) == (
        403,
        "PermissionDeniedError",
    )
    assert http.post(f"/tables/{name}/optimize", headers=ADMIN).json()["superfiles_removed"] == 4  # no body: defaults


def test_bad_requests_are_typed_4xx_and_change_nothing(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    before = state(engine, name)
    cases = [
        ("optimize", {"target_rows": "many"}, 422, "InvalidInputError"),
        ("optimize", {"target_rows": True}, 422, "InvalidInputError"),
        ("optimize", {"target_rows": 0}, 400, "InvalidOptionError"),
        ("optimize", {"target_rows": 10, "target_bytes": 1000}, 400, "InvalidOptionError"),
        ("optimize", {"rows": 10}, 422, "InvalidInputError"),
        ("cleanup", {"older_than": "a week"}, 422, "InvalidInputError"),
        ("cleanup", {"older_than": 60}, 400, "InvalidOptionError"),  # the margin (the window) is below the floor
        ("cleanup", {"older_than": 7200, "safety_margin": 60}, 400, "InvalidOptionError"),
        ("cleanup", {"safety_margin": -1}, 400, "InvalidOptionError"),
        ("restore", {}, 422, "InvalidInputError"),
        ("restore", {"version": "2"}, 422, "InvalidInputError"),
        ("restore", {"version": 99}, 404, "VersionNotFoundError"),
    ]
    for path, body, status, kind in cases:
        assert error_of(http.post(f"/tables/{name}/{path}", headers=ADMIN, json=body)) == (status, kind), body
    floor = http.post(f"/tables/{name}/cleanup", headers=ADMIN, json={"older_than": 60})
    assert "SUPERFILE_CLEANUP_MIN_AGE_S" in floor.json()["error"]["message"]
    malformed = http.post(
        f"/tables/{name}/optimize", headers={**ADMIN, "content-type": "application/json"}, content=b"{"
    )
    assert error_of(malformed) == (400, "InvalidInputError")
    reads = [
        (f"/tables/{name}/changes", {"from": 3, "to": 2}, 400, "InvalidInputError"),
        (f"/tables/{name}/changes", {"from": 99}, 404, "VersionNotFoundError"),
        (f"/tables/{name}/changes", {"from": 1, "columns": "key,nope"}, 400, "UnknownColumnError"),
        (f"/tables/{name}/changes", {"from": "one"}, 422, "InvalidInputError"),
        (f"/tables/{name}/changes", {}, 422, "InvalidInputError"),
        (f"/tables/{name}", {"as_of": "yesterday"}, 400, "InvalidInputError"),
        (f"/tables/{name}", {"as_of": "1", "version": 2}, 400, "InvalidOptionError"),
        (f"/tables/{name}", {"as_of": "1"}, 404, "VersionNotFoundError"),  # 1970: before the table existed
        (f"/tables/{name}/stats", {"as_of": "2000-01-01T00:00:00"}, 404, "VersionNotFoundError"),
        ("/tables/nosuch/changes", {"from": 1}, 404, "TableNotFoundError"),
    ]
    for path, params, status, kind in reads:
        assert error_of(http.get(path, headers=ADMIN, params=params)) == (status, kind), (path, params)
    count = http.post(f"/tables/{name}/count", headers=ADMIN, params={"as_of": "1", "wait_for": "x@1"}, json={})
    assert error_of(count) == (400, "InvalidInputError")
    assert error_of(http.post("/tables/nosuch/optimize", headers=ADMIN)) == (404, "TableNotFoundError")
    assert state(engine, name) == before
    assert engine.open_table(name).stats()["superfile_count"] == 4


def test_optimize_and_cleanup(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    table = engine.open_table(name)
    optimized = http.post(f"/tables/{name}/optimize", headers=ADMIN, json={"target_rows": 100})
    assert optimized.status_code == 200
    assert optimized.json() == {
        "version": 6,
        "target_rows": 100,
        "superfiles_removed": 4,
        "superfiles_added": 1,
        "rows_rewritten": 8,
        "deletes_carried": 0,
    }
    assert table.stats()["superfile_count"] == 1 and table.versions()[-1]["operation"] == "optimize"
    # Everything is younger than the window: a cleanup keeps it all. (The floor blocks shorter windows.)
    kept = http.post(f"/tables/{name}/cleanup", headers=ADMIN, json={"older_than": 7200, "dry_run": False})
    assert kept.status_code == 200 and kept.json()["files_removed"] == 0 and kept.json()["retained_versions"] == 6
    assert http.post(f"/tables/{name}/cleanup", headers=ADMIN).json()["files_removed"] == 0  # default: 7 days
    # A window of 0 expires every old version; the margin keeps the files of the last hour.
    expired = http.post(f"/tables/{name}/cleanup", headers=ADMIN, json={"older_than": 0, "safety_margin": 3600})
    assert expired.json()["files_removed"] == 0 and expired.json()["oldest_version"] == 6
    assert [h["version"] for h in table.versions()] == [6]
    assert error_of(http.get(f"/tables/{name}", headers=ADMIN, params={"version": 3})) == (404, "VersionNotFoundError")
    assert error_of(http.post(f"/tables/{name}/restore", headers=ADMIN, json={"version": 3})) == (
        404,
        "VersionNotFoundError",
    )


def test_restore(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    table = engine.open_table(name)
    restored = http.post(f"/tables/{name}/restore", headers=ADMIN, json={"version": 3})
    assert restored.json() == {"version": 6, "position": None}
    assert sorted(table.to_arrow(columns=["key"]).column("key").to_pylist()) == [0, 1, 2, 3]
    assert table.versions()[-1]["operation"] == "restore"
    assert http.post(f"/tables/{name}/restore", headers=ADMIN, json={"version": 5}).json()["version"] == 7
    assert table.count_rows() == 8


def test_changes_as_json_and_arrow(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    table = engine.open_table(name)
    table.update("key = 1", [{**rows(range(1))[0], "key": 1, "title": "changed"}])
    table.delete("key = 6")
    as_arrow = http.get(
        f"/tables/{name}/changes", headers={**ADMIN, "accept": ARROW_STREAM}, params={"from": 5, "columns": "key,title"}
    )
    assert as_arrow.headers["content-type"] == ARROW_STREAM
    feed = from_ipc(as_arrow.content)
    assert feed.equals(table.changes(5, columns=["key", "title"]))
    assert feed.schema.field("_id").type == pa.uint64()
    assert [(r["_change"], r["key"], r["title"]) for r in feed.to_pylist()] == [
        ("delete", 1, "document number 1 about flow"),
        ("insert", 1, "changed"),
        ("delete", 6, "document number 6 about flow"),
    ]
    as_json = http.get(f"/tables/{name}/changes", headers=ADMIN, params={"from": 5, "to": 6, "columns": ""})
    assert as_json.json() == {
        "columns": ["_change", "_id"],
        "num_rows": 2,
        "rows": [
            {"_change": "delete", "_id": feed["_id"][0].as_py()},
            {"_change": "insert", "_id": feed["_id"][1].as_py()},
        ],
    }
    everything = http.get(f"/tables/{name}/changes", headers=ADMIN, params={"from": 1}).json()
    assert everything["columns"] == ["_change", "_id", "key", "title", "emb"] and everything["num_rows"] == 7


def test_as_of_reads(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    history = engine.open_table(name).versions()
    third = history[2]["timestamp_ms"]
    expected = max(h["version"] for h in history if h["timestamp_ms"] <= third)
    iso = datetime.datetime.fromtimestamp(third / 1000, datetime.UTC).isoformat()
    naive = datetime.datetime.fromtimestamp(third / 1000, datetime.UTC).replace(tzinfo=None).isoformat()
    for as_of in (str(third), iso, naive):
        described = http.get(f"/tables/{name}", headers=READER, params={"as_of": as_of})
        assert described.json()["version"] == expected, as_of
    n = engine.open_table(name, version=expected).count_rows()
    count = http.post(f"/tables/{name}/count", headers=READER, params={"as_of": str(third)}, json={})
    assert count.json() == {"count": n}
    stats = http.get(f"/tables/{name}/stats", headers=READER, params={"as_of": iso}).json()
    assert stats["version"] == expected and stats["row_count"] == n
    search = http.post(
        f"/tables/{name}/search/bm25",
        headers=READER,
        params={"as_of": str(third)},
        json={"column": "title", "query": "document", "k": 20, "projection": ["key"]},
    )
    assert search.json()["num_rows"] == n
    versions = http.get(f"/tables/{name}/versions", headers=READER, params={"as_of": str(third)}).json()["versions"]
    assert [h["version"] for h in versions] == list(range(1, expected + 1))


def test_openapi_and_metrics(http: httpx.Client, engine: superfile.Connection) -> None:
    name = _table(engine)
    assert http.post(f"/tables/{name}/optimize", headers=ADMIN).status_code == 200
    assert http.get(f"/tables/{name}/changes", headers=ADMIN, params={"from": 1}).status_code == 200
    spec = http.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("optimize", "cleanup", "restore"):
        assert "post" in paths[f"/tables/{{name}}/{path}"], path
    params = {p["name"] for p in paths["/tables/{name}/changes"]["get"]["parameters"]}
    assert {"from", "to", "columns", "wait_for"} <= params
    scan_params = {p["name"] for p in paths["/tables/{name}/scan"]["post"]["parameters"]}
    assert {"version", "as_of", "wait_for"} <= scan_params
    text = http.get("/metrics").text
    assert re.search(r'superfile_gateway_write_duration_seconds_count\{[^}]*op="optimize"[^}]*\} [1-9]', text)
    assert re.search(r'superfile_gateway_query_duration_seconds_count\{kind="changes"[^}]*\} [1-9]', text)


def test_maintenance_runs_itself_in_embedded_mode(tmp_path: Path) -> None:
    """On by default: small appends through the gateway are compacted in the background, and counted."""
    settings = Settings(storage=f"file://{tmp_path}", auth=False, compact_small_files=4)
    with BackgroundServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        table = superfile.connect(server.url).create_table(
            "auto", SCHEMA, fts_columns=["title"], vector_columns={"emb": 4}
        )
        for i in range(12):
            table.append(rows(range(i * 5, i * 5 + 5)))
        wait_until(lambda: table.stats()["superfile_count"] <= 5, 60, "the background compaction")
        assert table.count_rows() == 60
        metrics = http.get("/metrics").text
        counted = r'superfile_gateway_maintenance_total\{[^}]*what="compactions"[^}]*\} [1-9]'
        assert re.search(counted, metrics), metrics[-2000:]
