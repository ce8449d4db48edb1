"""The ``superfile`` command as real processes: maintenance and history, on a storage root and through a gateway."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import superfile
from superfile_gateway import BackgroundServer, Settings, parse_api_keys
from superfile_suite import free_port

SUPERFILE = str(Path(sys.executable).with_name("superfile"))


def _run(*args: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SUPERFILE_")}
    done = subprocess.run([SUPERFILE, *args], env={**clean, **env}, capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, f"superfile {' '.join(args)} failed:\n{done.stderr}"
    return done


def _json(*args: str, **env: str) -> Any:
    return json.loads(_run(*args, **env).stdout)


def _lines(*args: str, **env: str) -> list[Any]:
    return [json.loads(line) for line in _run(*args, **env).stdout.splitlines()]


def _jsonl(path: Path, keys: range) -> str:
    path.write_text("".join(json.dumps({"key": k, "title": f"note {k} on flow"}) + "\n" for k in keys))
    return str(path)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """A storage root with table ``notes``: keys 0..5 in three appends (versions 2-4), key 1 deleted (version 5)."""
    root = f"file://{tmp_path / 'data'}"
    _run("create", root, "notes", "--schema-from", _jsonl(tmp_path / "schema.jsonl", range(1)), "--fts", "title")
    for start in (0, 2, 4):
        _run("append", root, "notes", _jsonl(tmp_path / f"rows{start}.jsonl", range(start, start + 2)))
    assert _run("delete", root, "notes", "key = 1").stdout.strip() == "version 5"
    return root


def test_versions_changes_scan_as_of_and_restore(uri: str, tmp_path: Path) -> None:
    versions = _lines("versions", uri, "notes")
    assert [(v["version"], v["operation"], v["row_count"]) for v in versions] == [
        (1, "create", 0),
        (2, "append", 2),
        (3, "append", 4),
        (4, "append", 6),
        (5, "delete", 5),
    ]
    feed = _lines("changes", uri, "notes", "3")
    assert [(r["_change"], r["key"], r["title"]) for r in feed] == [
        ("delete", 1, "note 1 on flow"),
        ("insert", 4, "note 4 on flow"),
        ("insert", 5, "note 5 on flow"),
    ]
    assert list(feed[0]) == ["_change", "_id", "key", "title"]
    assert _lines("changes", uri, "notes", "2", "3", "--columns", "key") == [
        {"_change": "insert", "_id": 2, "key": 2},
        {"_change": "insert", "_id": 3, "key": 3},
    ]
    assert _lines("changes", uri, "notes", "4", "5", "--columns", "") == [{"_change": "delete", "_id": 1}]

    def scanned(*at: str) -> list[int]:
        out = _run("scan", uri, "notes", "--columns", "key", *at).stdout.splitlines()
        return sorted(json.loads(line)["key"] for line in out)

    assert scanned("--version", "3") == [0, 1, 2, 3]
    third = versions[2]["timestamp_ms"]
    expected = max(v["version"] for v in versions if v["timestamp_ms"] <= third)
    in_process = superfile.connect(uri).open_table("notes", version=expected).to_arrow(columns=["key"])
    assert scanned("--as-of", str(third)) == sorted(in_process.column("key").to_pylist())
    iso = datetime.datetime.fromtimestamp(third / 1000, datetime.UTC).replace(tzinfo=None).isoformat()
    assert scanned("--as-of", iso) == scanned("--as-of", str(third))  # naive ISO 8601 means UTC

    assert _json("restore", uri, "notes", "3") == {"version": 6}
    assert scanned() == [0, 1, 2, 3]
    assert _lines("versions", uri, "notes")[-1]["operation"] == "restore"


def test_optimize_and_cleanup(uri: str) -> None:
    assert superfile.connect(uri).open_table("notes").stats()["superfile_count"] == 3
    assert _json("optimize", uri, "notes", "--target-rows", "100") == {
        "version": 6,
        "target_rows": 100,
        "superfiles_removed": 3,
        "superfiles_added": 1,
        "rows_rewritten": 5,
        "deletes_carried": 0,
    }
    assert _json("optimize", uri, "notes")["superfiles_removed"] == 0
    assert _json("cleanup", uri, "notes", "--older-than", "1h30m")["files_removed"] == 0  # all younger
    dry = _json("cleanup", uri, "notes", "--older-than", "0", "--dry-run")
    assert dry["dry_run"] is True and dry["removed"]["superfiles"] == 3 and dry["oldest_version"] == 6
    assert len(_lines("versions", uri, "notes")) == 6
    done = _json("cleanup", uri, "notes", "--older-than", "0")
    assert done["files_removed"] == dry["files_removed"] and done["dry_run"] is False
    assert [v["version"] for v in _lines("versions", uri, "notes")] == [6]
    table = superfile.connect(uri).open_table("notes")
    assert sorted(table.to_arrow(columns=["key"]).column("key").to_pylist()) == [0, 2, 3, 4, 5]
    assert table.stats()["superfile_count"] == 1


def test_idempotent_append(uri: str, tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "batch.jsonl", range(10, 13))
    assert _run("append", uri, "notes", rows, "--idempotency-key", "batch-10").stdout.strip() == "version 6"
    again = _run("append", uri, "notes", rows, "--idempotency-key", "batch-10", "--batch-rows", "1")
    assert again.stdout.strip() == "version 6"  # the first append's version; nothing added
    assert superfile.connect(uri).open_table("notes").count_rows() == 8


def test_bad_input_is_an_error_and_changes_nothing(uri: str) -> None:
    cases = [
        (["restore", uri, "notes", "99"], "no retained version 99"),
        (["changes", uri, "notes", "4", "3"], "after to_version"),
        (["changes", uri, "notes", "1", "--columns", "nope"], "unknown columns"),
        (["optimize", uri, "notes", "--target-rows", "0"], "target_rows must be a positive integer"),
        (["cleanup", uri, "notes", "--older-than", "-5"], "older_than must be a non-negative"),
        (["cleanup", uri, "notes", "--older-than", "soon"], "duration like 7d"),
        (["cleanup", uri, "notes", "--safety-margin", "-1"], "safety_margin must be a non-negative"),
        (["scan", uri, "notes", "--as-of", "last tuesday"], "ISO 8601"),
        (["scan", uri, "notes", "--as-of", "1"], "no retained version as of"),
        (["scan", uri, "notes", "--version", "2", "--as-of", "1"], "not allowed with argument"),
        (["optimize", uri, "notes", "--target-rows", "5", "--target-bytes", "5"], "not allowed with argument"),
        (["versions", uri, "missing"], "does not exist"),
    ]
    for args, message in cases:
        done = _run(*args, ok=False)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert done.stdout == "", args
    assert len(_lines("versions", uri, "notes")) == 5


def test_through_a_gateway(uri: str) -> None:
    """An http:// URI goes through the SDK and a gateway, with the key from SUPERFILE_API_KEY."""
    settings = Settings(storage=uri, api_keys=parse_api_keys("cli-key:*:rw,cli-reader:*:r"))
    with BackgroundServer(settings) as srv:
        key = {"SUPERFILE_API_KEY": "cli-key"}
        assert _json("optimize", srv.url, "notes", **key)["superfiles_removed"] == 3
        assert [r["key"] for r in _lines("changes", srv.url, "notes", "4", "--columns", "key", **key)] == [1]
        assert _json("restore", srv.url, "notes", "3", **key) == {"version": 7}
        # The gateway's floor on the cleanup window holds for the CLI too.
        refused = _run("cleanup", srv.url, "notes", "--older-than", "0", ok=False, **key)
        assert refused.returncode == 2 and "SUPERFILE_CLEANUP_MIN_AGE_S" in refused.stderr
        expired = _json("cleanup", srv.url, "notes", "--older-than", "0", "--safety-margin", "1h", **key)
        assert expired["files_removed"] == 0 and expired["oldest_version"] == 7
        denied = _run("restore", srv.url, "notes", "2", ok=False, SUPERFILE_API_KEY="cli-reader")
        assert denied.returncode == 2 and "may not write" in denied.stderr
    table = superfile.connect(uri).open_table("notes")
    assert table.version == 7 and sorted(table.to_arrow(columns=["key"]).column("key").to_pylist()) == [0, 1, 2, 3]
    assert [v["version"] for v in table.versions()] == [7]


def test_demo_serves_the_sample_with_the_key_it_prints(tmp_path: Path) -> None:
    """What ``make run`` runs: load Cranfield, then serve it; the printed key and curl body work, others don't."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SUPERFILE_")}
    args = [SUPERFILE, "demo", "--uri", f"file://{tmp_path / 'data'}", "--serve", "--port", str(port)]
    proc = subprocess.Popen(args, env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        printed = ""
        deadline = time.monotonic() + 120
        while "OpenAPI:" not in printed and time.monotonic() < deadline and proc.poll() is None:
            printed += proc.stdout.readline()
        key = re.search(r"API key for this run \(read and write\): (\S+)", printed)
        body = re.search(r"-d '(\{\"column\".*?\})' \S+/search/bm25", printed)
        assert key and body, printed
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.monotonic() < deadline:  # the server starts after the instructions are printed
                try:
                    http.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            headers = {"Authorization": f"Bearer {key[1]}", "content-type": "application/json"}
            hits = http.post("/tables/cranfield/search/bm25", content=body[1], headers=headers)
            assert http.post("/tables/cranfield/search/bm25", content=body[1]).status_code == 401
        assert hits.status_code == 200, hits.text
        embedded = superfile.connect(f"file://{tmp_path / 'data'}").open_table("cranfield")
        want = embedded.bm25_search("text", "shock waves", k=5, projection=["id", "title"])
        assert [r["id"] for r in hits.json()["rows"]] == want.column("id").to_pylist()
        remote = superfile.connect(url, api_key=key[1]).open_table("cranfield")
        assert remote.count_rows() == embedded.count_rows() == 1400
    finally:
        proc.terminate()
        proc.wait(timeout=10)
