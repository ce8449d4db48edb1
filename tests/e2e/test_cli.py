"""The ``superfile`` command as real processes (its console script): reads, searches, SQL, writes, maintenance and
history, on a storage root and through a gateway; its output formats, its errors, and the examples of README.md and
docs/cli.md run as written against the demo's table."""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from superfile.cli import _parser
from superfile_gateway import BackgroundServer, Settings, parse_api_keys
from superfile_suite import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SUPERFILE = str(BIN / "superfile")


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SUPERFILE_")}
    return {**clean, **extra}


def _run(
    *args: str, ok: bool = True, stdin: str | bytes | None = None, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``superfile ARGS`` as a process (``stdin``: its input, text or bytes); ``ok``: it must succeed."""
    raw = subprocess.run(
        [SUPERFILE, *args],
        env=_env(**env),
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        timeout=180,
        cwd=cwd,
    )
    done = subprocess.CompletedProcess(raw.args, raw.returncode, raw.stdout.decode(), raw.stderr.decode())
    if ok:
        assert done.returncode == 0, f"superfile {' '.join(args)} failed:\n{done.stderr}"
    return done


def _lines(*args: str, **env: str) -> list[Any]:
    """The rows a command prints with ``--format json``: one JSON object per line."""
    return [json.loads(line) for line in _run(*args, "--format", "json", **env).stdout.splitlines()]


def _json(*args: str, **env: str) -> Any:
    """The one row a command prints with ``--format json``."""
    rows = _lines(*args, **env)
    assert len(rows) == 1, rows
    return rows[0]


def _failed(*args: str, code: int = 1, stdin: str | None = None, **env: str) -> str:
    """A command that fails: its exit code, nothing on stdout, and one line on stderr (returned), no traceback."""
    done = _run(*args, ok=False, stdin=stdin, **env)
    assert done.returncode == code, (args, done.returncode, done.stderr)
    assert done.stdout == "", (args, done.stdout)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, done.stderr)
    assert "Traceback" not in done.stderr
    return lines[0]


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
    _run("delete", root, "notes", "key = 1")
    assert superfile.connect(root).open_table("notes").version == 5
    return root


@pytest.fixture(scope="module")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``data/``: the table ``superfile demo`` makes (Cranfield, 1400 rows in 7 appends)."""
    root = tmp_path_factory.mktemp("demo")
    _run("demo", cwd=root)
    return root


@pytest.fixture
def demo(demo_template: Path, tmp_path: Path) -> Path:
    """A copy of the demo's directory for one test (which may write to it); ``file://./data`` from it."""
    shutil.copytree(demo_template / "data", tmp_path / "data")
    return tmp_path


# -- history and maintenance --------------------------------------------------------------------------------------
def test_versions_changes_scan_as_of_and_restore(uri: str) -> None:
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
    inserted = _lines("changes", uri, "notes", "2", "3", "--columns", "key")
    assert [(r["_change"], r["key"]) for r in inserted] == [("insert", 2), ("insert", 3)]
    # _ids are unique and ascend within a writer, not dense: each process reserves its own block of them
    ids = {r["key"]: r["_id"] for r in _lines("scan", uri, "notes", "--columns", "_id,key")}
    assert [r["_id"] for r in inserted] == [ids[2], ids[3]] and ids[2] < ids[3]
    key_1 = [r["_id"] for r in _lines("changes", uri, "notes", "1", "2", "--columns", "key") if r["key"] == 1]
    assert _lines("changes", uri, "notes", "4", "5", "--columns", "") == [{"_change": "delete", "_id": key_1[0]}]

    def scanned(*at: str) -> list[int]:
        return sorted(r["key"] for r in _lines("scan", uri, "notes", "--columns", "key", *at))

    assert scanned("--version", "3") == [0, 1, 2, 3]
    third = versions[2]["timestamp_ms"]
    expected = max(v["version"] for v in versions if v["timestamp_ms"] <= third)
    in_process = superfile.connect(uri).open_table("notes", version=expected).to_arrow(columns=["key"])
    assert scanned("--as-of", str(third)) == sorted(in_process.column("key").to_pylist())
    iso = datetime.datetime.fromtimestamp(third / 1000, datetime.UTC).replace(tzinfo=None).isoformat()
    assert scanned("--as-of", iso) == scanned("--as-of", str(third))  # naive ISO 8601 means UTC
    assert _json("count", uri, "notes", "--version", "3") == {"count": 4}

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
    assert _json("append", uri, "notes", rows, "--idempotency-key", "batch-10") == {"version": 6}
    assert _json("append", uri, "notes", rows, "--idempotency-key", "batch-10") == {"version": 6}  # nothing added
    assert superfile.connect(uri).open_table("notes").count_rows() == 8


# -- defects of issue 19 item 4, each shown by a test that failed before the fix ----------------------------------
def test_values_are_printed_in_full_unless_truncate_asks(uri: str, tmp_path: Path) -> None:
    """Defect: the CLI cut strings to 60 characters."""
    long = "a boundary layer note " * 20 + "end"
    (tmp_path / "long.jsonl").write_text(json.dumps({"key": 99, "title": long}) + "\n")
    _run("append", uri, "notes", str(tmp_path / "long.jsonl"))
    assert long in _run("scan", uri, "notes", "--where", "key = 99", "--columns", "title").stdout
    for fmt in ("table", "csv"):
        out = _run("scan", uri, "notes", "--where", "key = 99", "--columns", "title", "--format", fmt).stdout
        assert long in out.splitlines()[-1], fmt
    assert _json("scan", uri, "notes", "--where", "key = 99", "--columns", "title") == {"title": long}
    hits = _lines("search", uri, "notes", "title", "boundary", "--columns", "title")
    assert [h["title"] for h in hits] == [long]
    short = _run("scan", uri, "notes", "--where", "key = 99", "--columns", "key,title", "--truncate", "13").stdout
    assert short.splitlines()[-1].strip() == "99  a boundary l…"


def test_scan_limit_reads_only_the_superfiles_it_needs(demo: Path) -> None:
    """Defect: ``scan --limit`` read the whole table and then kept the first rows. With every superfile but the
    first removed from storage, a limit the first one holds still answers, in the full scan's order."""
    uri = f"file://{demo / 'data'}"
    table = superfile.connect(uri).open_table("cranfield")
    first = table.to_arrow(columns=["_id", "id", "title"]).slice(0, 150)
    entries = sorted(table.snapshot().entries(), key=lambda e: e.id_min)
    assert len(entries) == 7 and entries[0].rows == 200
    for entry in entries[1:]:
        (demo / "data" / "cranfield" / entry.path).unlink()
    _run("scan", uri, "cranfield", "--columns", "_id,id,title", "--limit", "150")
    rows = _lines("scan", uri, "cranfield", "--columns", "_id,id,title", "--limit", "150")
    assert rows == first.to_pylist()
    assert _lines("scan", uri, "cranfield", "--where", "id > 100", "--columns", "id", "--limit", "2") == [
        {"id": 101},
        {"id": 102},
    ]
    assert "superfile" in _failed("scan", uri, "cranfield", "--columns", "id", "--limit", "201")  # the second's rows
    assert "superfile" in _failed("scan", uri, "cranfield", "--columns", "id")


def test_every_command_prints_rows_in_the_format_asked(uri: str, tmp_path: Path) -> None:
    """Defect: each command printed in a style of its own (Python-ish dicts, indented JSON, JSON lines, bare
    names, "version N"). Now each prints rows, in the format --format picks."""
    commands = [
        ["scan", uri, "notes"],
        ["count", uri, "notes", "--where", "key > 2"],
        ["describe", uri, "notes"],
        ["sql", uri, "SELECT key, title FROM notes ORDER BY key"],
        ["search", uri, "notes", "title", "flow"],
        ["stats", uri, "notes"],
        ["tables", uri],
        ["versions", uri, "notes"],
        ["changes", uri, "notes", "2"],
    ]
    for i, args in enumerate(commands):
        rows = _lines(*args)
        assert rows and all(isinstance(r, dict) for r in rows), args
        names = list(rows[0])
        table = _run(*args).stdout.splitlines()  # the default: an aligned table with a header
        assert table[0].split() == names and set(table[1].replace(" ", "")) == {"-"}, (args, table[:2])
        assert len(table) == 2 + len(rows)
        if i % 3:
            continue  # every format of every third command (each run is a process of its own, about a second)
        assert len(_run(*args, "--no-header").stdout.splitlines()) == len(rows)
        parsed = list(csv.reader(io.StringIO(_run(*args, "--format", "csv").stdout)))
        assert parsed[0] == names and len(parsed) == 1 + len(rows), args
        path = tmp_path / f"{args[0]}.parquet"
        assert _run(*args, "--format", "parquet", "--output", str(path)).stdout == ""
        assert pq.read_table(path).column_names == names and pq.read_table(path).num_rows == len(rows)
    assert _json("count", uri, "notes", "--where", "key > 2") == {"count": 3}
    assert _run("count", uri, "notes", "--no-header").stdout == "5\n"
    assert _lines("tables", uri) == [{"table": "notes"}]
    described = _lines("describe", uri, "notes")
    assert described == [
        {"column": "_id", "type": "uint64", "nullable": False, "index": "row id"},
        {"column": "key", "type": "int64", "nullable": True, "index": ""},
        {"column": "title", "type": "string", "nullable": True, "index": "full-text (english)"},
    ]


def test_missing_files_and_bad_input_are_one_line_errors(uri: str, tmp_path: Path) -> None:
    """Defect: a missing file (and other bad input) printed a raw traceback."""
    missing = str(tmp_path / "nope.jsonl")
    assert "no such file" in _failed("append", uri, "notes", missing) and missing in _failed(
        "append", uri, "notes", missing
    )
    assert "no such file" in _failed("create", uri, "other", "--schema-from", missing)
    assert "no such file" in _failed("create", uri, "other", "--schema-from", str(tmp_path / "nope.parquet"))
    assert "does not exist" in _failed("versions", uri, "other")
    assert "no such file" in _failed("append", uri, "notes", str(tmp_path))  # a directory
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    assert "bad.parquet" in _failed("append", uri, "notes", str(tmp_path / "bad.parquet"))
    (tmp_path / "bad.jsonl").write_text('{"key": 1, "title": "x"}\n{"key": \n')
    assert "bad.jsonl" in _failed("append", uri, "notes", str(tmp_path / "bad.jsonl"))
    (tmp_path / "extra.jsonl").write_text('{"key": 1, "nope": "x"}\n')
    assert "unknown columns" in _failed("append", uri, "notes", str(tmp_path / "extra.jsonl"))
    assert "does not exist" in _failed("scan", uri, "missing")
    assert "does not exist" in _failed("count", f"file://{tmp_path / 'nowhere'}", "notes")
    assert "unreachable" in _failed("count", f"http://127.0.0.1:{free_port()}", "notes")
    assert "unknown columns" in _failed("scan", uri, "notes", "--columns", "nope", "--limit", "1")
    assert "nope" in _failed("count", uri, "notes", "--where", "nope = 1")
    assert "vector" in _failed("search", uri, "notes", "title", "--kind", "vector", "--vector", "[1, 2]")
    assert _run("count", uri, "notes", "--no-header").stdout == "5\n"  # nothing written


def test_append_commits_a_whole_file_once_or_not_at_all(tmp_path: Path) -> None:
    """Defect: ``append`` committed every 100,000 rows, so a file failing past them left those rows in. Now a
    file is one commit, read as a stream: a bad row anywhere in it (here the last) commits nothing."""
    root = f"file://{tmp_path / 'data'}"
    schema = tmp_path / "schema.jsonl"
    schema.write_text(json.dumps({"key": 0, "title": "x", "emb": [0.5, 0.5]}) + "\n")
    _run("create", root, "big", "--schema-from", str(schema), "--fts", "title", "--vector", "emb:2")
    n = 150_001

    def rows(last: dict[str, Any]) -> str:
        body = "".join(f'{{"key": {i}, "title": "row {i}", "emb": [0.25, 0.75]}}\n' for i in range(n - 1))
        return body + json.dumps(last) + "\n"

    table = superfile.connect(root).open_table("big")
    bad_vector = tmp_path / "bad_vector.jsonl"  # reads as JSON; the engine refuses its last row
    bad_vector.write_text(rows({"key": n, "title": "last", "emb": [0.1, 0.2, 0.3]}))
    assert _run("append", root, "big", str(bad_vector), ok=False).returncode != 0
    assert table.count_rows() == 0 and [v["version"] for v in table.versions()] == [1]
    assert "2 values per vector" in _failed("append", root, "big", str(bad_vector))
    bad_json = tmp_path / "bad_json.jsonl"  # the reader fails on its last row, after the earlier ones streamed in
    bad_json.write_text(rows({"key": "not a number", "title": "last", "emb": [0.1, 0.2]}))
    assert "bad_json.jsonl" in _failed("append", root, "big", str(bad_json))
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("key,title\n" + "".join(f"{i},row {i}\n" for i in range(n)) + "oops,last\n")
    assert "bad.csv" in _failed("append", root, "big", str(bad_csv))
    assert table.count_rows() == 0 and [v["version"] for v in table.versions()] == [1]

    good = tmp_path / "good.jsonl"
    good.write_text(rows({"key": n, "title": "last", "emb": [0.5, 0.5]}))
    done = _run("append", root, "big", str(good), "--progress")
    assert json.loads(_run("count", root, "big", "--format", "json").stdout) == {"count": n}
    assert done.stdout.split()[-1] == "2"  # the version: one commit for the whole file
    assert "append big" in done.stderr and "rows" in done.stderr  # the progress bar
    assert [v["operation"] for v in _lines("versions", root, "big")] == ["create", "append"]
    assert "append big" not in _run("append", root, "big", str(good)).stderr  # no bar when stderr is no terminal


def test_readme_says_how_to_put_superfile_on_path() -> None:
    """Defect: after ``make run`` the README used ``superfile`` that was not on PATH. It says to activate the
    environment ``make run`` installs into, and that puts ``superfile`` on PATH."""
    setup = _shell_lines(ROOT / "README.md")
    activate = [line for line in setup if ".venv/bin/activate" in line]
    assert activate and setup.index(activate[0]) < min(i for i, s in enumerate(setup) if s.startswith("superfile "))
    assert setup[setup.index(activate[0]) - 1].startswith("make run")
    if BIN != ROOT / ".venv" / "bin":
        pytest.skip(f"the tests run from {BIN}, not from the checkout's .venv")
    found = subprocess.run(
        ["bash", "-c", f"{activate[0]}\ncommand -v superfile"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert found.stdout.strip() == str(ROOT / ".venv" / "bin" / "superfile"), found.stderr
    assert "activate" in (ROOT / "Makefile").read_text().split("\nrun:")[1].split("\n\n")[0]


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_documented_examples_run_against_the_demo_table(doc: str, demo: Path) -> None:
    """Defect: the README's examples used a table ``docs``; the demo makes ``cranfield``. Every ``superfile``
    line of the document's shell blocks runs, in order, against the demo's table (``file://./data`` from the
    directory ``make run`` runs in), and through a gateway for an http:// one."""
    lines = [line for line in _shell_lines(ROOT / doc) if re.match(r"(\w+=\S*\s+)*superfile\s", line)]
    assert len(lines) >= 5
    (demo / "examples").symlink_to(ROOT / "examples")
    settings = Settings(storage=f"file://{demo / 'data'}", api_keys=parse_api_keys("k1:*:rw"))
    env = _env(PATH=f"{BIN}:{os.environ['PATH']}")
    with BackgroundServer(settings) as server:
        for line in lines:
            if re.search(r"superfile (serve|demo)\b", line):
                continue  # they run until stopped / rebuild the table; make run and the tests above run them
            command = line.replace("http://127.0.0.1:8000", server.url)
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command],
                cwd=demo,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert done.returncode == 0, f"{doc}: {line}\n{done.stderr}"
            assert done.stdout or "--output" in line, f"{doc}: {line} printed nothing"


def _shell_lines(path: Path) -> list[str]:
    """The commands of the ```sh blocks of a Markdown file, continuation lines joined."""
    out: list[str] = []
    for block in re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", path.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line.strip())
    return out


# -- reads ----------------------------------------------------------------------------------------------------------
def test_searches_answer_as_the_api(demo: Path) -> None:
    uri = f"file://{demo / 'data'}"
    table = superfile.connect(uri).open_table("cranfield")

    def same(rows: list[dict[str, Any]], want: pa.Table) -> None:
        assert [r["_id"] for r in rows] == want.column("_id").to_pylist()
        assert [r["id"] for r in rows] == want.column("id").to_pylist()

    args = ["search", uri, "cranfield"]
    same(
        _lines(*args, "text", "shock waves", "--columns", "id"),
        table.bm25_search("text", "shock waves", projection=["id"]),
    )
    same(
        _lines(*args, "text", "shock waves", "--mode", "all", "-k", "3", "--columns", "id"),
        table.bm25_search("text", "shock waves", k=3, mode="all", projection=["id"]),
    )
    same(
        _lines(*args, "title", "boundar", "--kind", "prefix", "--limit", "4", "--columns", "id"),
        table.bm25_search_prefix("title", "boundar", k=4, projection=["id"]),
    )
    vector = table.to_arrow(columns=["embedding"], where="id = 7").column("embedding")[0].as_py()
    want = table.vector_search("embedding", vector, k=5, projection=["id"])
    same(_lines(*args, "embedding", "--kind", "vector", "--like", "id = 7", "--limit", "5", "--columns", "id"), want)
    same(_lines(*args, "embedding", json.dumps(vector), "--kind", "vector", "--limit", "5", "--columns", "id"), want)
    piped = _run(
        *args,
        "embedding",
        "-",
        "--kind",
        "vector",
        "-k",
        "5",
        "--columns",
        "id",
        "-f",
        "json",
        stdin=json.dumps(vector),
    )
    same([json.loads(line) for line in piped.stdout.splitlines()], want)
    filtered = table.vector_search("embedding", vector, k=3, where="id > 1000", projection=["id"])
    same(
        _lines(
            *args,
            "embedding",
            "--kind",
            "vector",
            "--like",
            "id = 7",
            "-k",
            "3",
            "--where",
            "id > 1000",
            "--columns",
            "id",
        ),
        filtered,
    )
    same(
        _lines(*args, "text", "shock waves", "--kind", "hybrid", "--like", "id = 7", "--columns", "id"),
        table.hybrid_search("text", "shock waves", "embedding", vector, projection=["id"]),
    )
    same(
        _lines(*args, "text", "shock tube", "--kind", "tokens", "--columns", "id"),
        table.token_match("text", ["shock", "tube"], projection=["id"]),
    )
    assert len(_lines(*args, "text", "shock tube", "--kind", "tokens", "--limit", "2", "--columns", "id")) == 2
    title = table.to_arrow(columns=["title"], where="id = 7").column("title")[0].as_py()
    same(
        _lines(*args, "title", title, "--kind", "exact", "--columns", "id"),
        table.exact_match("title", title, projection=["id"]),
    )
    same(
        _lines(*args, "text", "-", "--columns", "id", stdin="shock waves\n"),
        table.bm25_search("text", "shock waves", projection=["id"]),
    )
    old = superfile.connect(uri).open_table("cranfield", version=2)
    same(
        _lines(*args, "text", "shock", "--version", "2", "--columns", "id"),
        old.bm25_search("text", "shock", projection=["id"]),
    )
    assert "--where applies to --kind vector" in _failed(*args, "text", "shock", "--where", "id > 1", code=2)
    assert "--mode of a bm25 search is any or all" in _failed(*args, "text", "shock", "--mode", "and", code=2)
    assert "one query vector" in _failed(*args, "embedding", "--kind", "vector", code=2)
    assert "one query vector" in _failed(*args, "text", "shock", "--kind", "hybrid", code=2)
    assert "needs QUERY" in _failed(*args, "text", code=2)
    assert "JSON array of numbers" in _failed(*args, "embedding", "[1, 'x']", "--kind", "vector")
    assert "no row matches" in _failed(*args, "embedding", "--kind", "vector", "--like", "id = -1")


def test_sql_limit_is_part_of_the_query(demo: Path) -> None:
    uri = f"file://{demo / 'data'}"
    db = superfile.connect(uri)
    query = "SELECT id, title FROM cranfield ORDER BY id DESC"
    assert _lines("sql", uri, query, "--limit", "3") == db.sql(query + " LIMIT 3").to_pylist()
    assert [r["id"] for r in _lines("sql", uri, query + " LIMIT 2;", "--limit", "3")] == [1400, 1399]
    assert [r["id"] for r in _lines("sql", uri, query + " LIMIT 9", "--limit", "3")] == [1400, 1399, 1398]
    assert [r["id"] for r in _lines("sql", uri, query + " OFFSET 5", "--limit", "2")] == [1395, 1394]
    union = "SELECT id FROM cranfield WHERE id < 3 UNION ALL SELECT id FROM cranfield WHERE id > 1398 ORDER BY id"
    assert [r["id"] for r in _lines("sql", uri, union, "--limit", "3")] == [1, 2, 1399]
    assert _lines("sql", uri, "SELECT count(*) AS n FROM cranfield -- all of it", "--limit", "1") == [{"n": 1400}]
    assert _lines("sql", uri, "-", stdin="SELECT max(id) AS top\nFROM cranfield\n") == [{"top": 1400}]
    assert len(_lines("sql", uri, "SELECT id FROM cranfield")) == 1400
    assert "cranfieldd" in _failed("sql", uri, "SELECT * FROM cranfieldd")
    assert "empty" in _failed("sql", uri, "-", stdin="")


def test_output_formats_keep_every_value(tmp_path: Path) -> None:
    """Types in each format: JSON strict (no NaN), float32 as written, binary as base64, times in ISO 8601,
    nulls; the table format keeps one row per line; parquet round-trips the table."""
    root = f"file://{tmp_path / 'data'}"
    data = pa.table(
        {
            "i": pa.array([1, None], pa.int32()),
            "x": pa.array([0.1, float("nan")], pa.float32()),
            "d": pa.array([2.5, float("inf")], pa.float64()),
            "s": ["line one\nline\ttwo", None],
            "b": pa.array([b"\x00\x01", None], pa.binary()),
            "t": pa.array([datetime.datetime(2025, 1, 2, 3, 4, 5), None], pa.timestamp("us")),
            "ok": [True, None],
            "v": pa.array([[0.1, 0.2], [0.3, 0.4]], pa.list_(pa.float32(), 2)),
        }
    )
    superfile.connect(root).create_table("typed", data=data, vector_columns={"v": {"dim": 2}})
    args = ["scan", root, "typed", "--columns", "i,x,d,s,b,t,ok,v"]
    out = _run(*args, "--format", "json").stdout
    assert "NaN" not in out and "Infinity" not in out
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "i": 1,
            "x": 0.1,
            "d": 2.5,
            "s": "line one\nline\ttwo",
            "b": "AAE=",
            "t": "2025-01-02T03:04:05",
            "ok": True,
            "v": [0.1, 0.2],
        },
        {"i": None, "x": None, "d": None, "s": None, "b": None, "t": None, "ok": None, "v": [0.3, 0.4]},
    ]
    table = _run(*args).stdout.splitlines()
    assert len(table) == 4
    assert table[2].split() == [
        "1",
        "0.1",
        "2.5",
        "line",
        "one\\nline\\ttwo",
        "AAE=",
        "2025-01-02T03:04:05",
        "true",
        "[0.1,",
        "0.2]",
    ]
    assert table[3].split() == ["null", "NaN", "Infinity", "null", "null", "null", "null", "[0.3,", "0.4]"]
    rows = list(csv.reader(io.StringIO(_run(*args, "--format", "csv").stdout)))
    assert rows[1] == ["1", "0.1", "2.5", "line one\nline\ttwo", "AAE=", "2025-01-02T03:04:05", "true", "[0.1, 0.2]"]
    assert rows[2] == ["", "NaN", "Infinity", "", "", "", "", "[0.3, 0.4]"]
    path = tmp_path / "out.parquet"
    _run(*args, "--format", "parquet", "--output", str(path))
    written = superfile.connect(root).open_table("typed").to_arrow(columns=args[4].split(","))
    assert repr(pq.read_table(path).to_pylist()) == repr(written.to_pylist())  # repr: NaN is not NaN
    assert pq.read_table(path).schema.names == written.schema.names


def test_parquet_is_not_written_to_a_terminal(uri: str, tmp_path: Path) -> None:
    parent, child = pty.openpty()
    try:
        done = subprocess.run(
            [SUPERFILE, "scan", uri, "notes", "--format", "parquet"],
            env=_env(),
            stdout=child,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(child)
        os.close(parent)
    assert done.returncode == 2 and done.stderr.startswith("error: --format parquet writes binary")
    piped = subprocess.run(
        [SUPERFILE, "scan", uri, "notes", "--format", "parquet"], env=_env(), capture_output=True, timeout=60
    )
    assert pq.read_table(pa.BufferReader(piped.stdout)).num_rows == 5


def test_append_reads_each_format_and_stdin(uri: str, tmp_path: Path) -> None:
    def key_rows(keys: range) -> pa.Table:
        return pa.table({"key": list(keys), "title": [f"row {k}" for k in keys]})

    pq.write_table(key_rows(range(100, 103)), tmp_path / "rows.parquet")
    (tmp_path / "rows.csv").write_text("title,key\n007,103\n,104\n")  # 007 stays text; an empty field is null
    (tmp_path / "rows.data").write_text('{"key": 105, "title": "sniffed"}\n')  # no extension: its bytes tell
    for name in ("rows.parquet", "rows.csv", "rows.data"):
        _run("append", uri, "notes", str(tmp_path / name))
    _run("append", uri, "notes", "-", stdin=(tmp_path / "rows.csv").read_text().replace("10", "20"))
    _run("append", uri, "notes", "-", stdin='{"key": 300, "title": "piped"}\n')
    parquet = io.BytesIO()
    pq.write_table(key_rows(range(400, 402)), parquet)
    _run("append", uri, "notes", "-", "--input-format", "parquet", stdin=parquet.getvalue())
    got = _lines("scan", uri, "notes", "--where", "key >= 100", "--columns", "key,title")
    assert sorted((r["key"], r["title"]) for r in got) == [
        (100, "row 100"),
        (101, "row 101"),
        (102, "row 102"),
        (103, "007"),
        (104, None),
        (105, "sniffed"),
        (203, "007"),
        (204, None),
        (300, "piped"),
        (400, "row 400"),
        (401, "row 401"),
    ]
    assert [v["operation"] for v in _lines("versions", uri, "notes")][5:] == ["append"] * 6  # one each


def test_version_and_help_on_every_option() -> None:
    assert _run("--version").stdout.strip() == f"superfile {version('superfile')}"
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, command in sub.choices.items():
        assert command.description and command.format_help().startswith(f"usage: superfile {name}"), name
        for action in command._actions:
            if action.help is None or not action.help.strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    assert _run("scan", "--help").stdout.startswith("usage: superfile scan")
    assert _failed(code=2).startswith("error: the following arguments are required: COMMAND")
    assert "invalid choice: 'nope'" in _failed("nope", code=2)
    assert "--format/-f: invalid choice" in _failed("count", "file:///x", "t", "--format", "xml", code=2)
    assert "not a positive integer" in _failed("scan", "file:///x", "t", "--limit", "0", code=2)


def test_bad_input_is_an_error_and_changes_nothing(uri: str) -> None:
    cases = [
        (["restore", uri, "notes", "99"], 1, "no retained version 99"),
        (["changes", uri, "notes", "4", "3"], 1, "after to_version"),
        (["changes", uri, "notes", "1", "--columns", "nope"], 1, "unknown columns"),
        (["optimize", uri, "notes", "--target-rows", "0"], 1, "target_rows must be a positive integer"),
        (["cleanup", uri, "notes", "--older-than", "-5"], 1, "older_than must be a non-negative"),
        (["cleanup", uri, "notes", "--older-than", "soon"], 2, "duration like 7d"),
        (["cleanup", uri, "notes", "--safety-margin", "-1"], 1, "safety_margin must be a non-negative"),
        (["scan", uri, "notes", "--as-of", "last tuesday"], 2, "ISO 8601"),
        (["scan", uri, "notes", "--as-of", "1"], 1, "no retained version as of"),
        (["scan", uri, "notes", "--version", "2", "--as-of", "1"], 2, "not allowed with argument"),
        (["optimize", uri, "notes", "--target-rows", "5", "--target-bytes", "5"], 2, "not allowed with argument"),
        (["versions", uri, "missing"], 1, "does not exist"),
        (["delete", uri, "notes", "key ==== 1"], 1, "key"),
        (["create", uri, "more", "--schema-from", "rows.jsonl", "--vector", "emb"], 2, "not name:dim[:metric]"),
    ]
    for args, code, message in cases:
        assert message in _failed(*args, code=code), args
    assert len(_lines("versions", uri, "notes")) == 5


# -- through a gateway and as make run runs it ---------------------------------------------------------------------
def test_through_a_gateway(uri: str, tmp_path: Path) -> None:
    """An http:// URI goes through the SDK and a gateway, with the key from SUPERFILE_API_KEY."""
    settings = Settings(storage=uri, api_keys=parse_api_keys("cli-key:*:rw,cli-reader:*:r"))
    with BackgroundServer(settings) as srv:
        key = {"SUPERFILE_API_KEY": "cli-key"}
        assert _json("count", srv.url, "notes", "--where", "key > 2", **key) == {"count": 3}
        assert [r["column"] for r in _lines("describe", srv.url, "notes", **key)] == ["_id", "key", "title"]
        assert [r["key"] for r in _lines("scan", srv.url, "notes", "--columns", "key", "--limit", "2", **key)] == [0, 2]
        hits = _lines("search", srv.url, "notes", "title", "note", "--limit", "2", "--columns", "key", **key)
        assert len(hits) == 2 and set(hits[0]) == {"_id", "score", "key"}
        assert _lines("sql", srv.url, "SELECT key FROM notes ORDER BY key DESC", "--limit", "2", **key) == [
            {"key": 5},
            {"key": 4},
        ]
        assert _json("append", srv.url, "notes", _jsonl(tmp_path / "more.jsonl", range(20, 22)), **key) == {
            "version": 6
        }
        assert _json("optimize", srv.url, "notes", **key)["superfiles_removed"] == 4
        assert [r["key"] for r in _lines("changes", srv.url, "notes", "4", "--columns", "key", **key)] == [1, 20, 21]
        assert _json("restore", srv.url, "notes", "3", **key) == {"version": 8}
        # The gateway's floor on the cleanup window holds for the CLI too.
        assert "SUPERFILE_CLEANUP_MIN_AGE_S" in _failed("cleanup", srv.url, "notes", "--older-than", "0", **key)
        expired = _json("cleanup", srv.url, "notes", "--older-than", "0", "--safety-margin", "1h", **key)
        assert expired["files_removed"] == 0 and expired["oldest_version"] == 8
        assert "may not write" in _failed("restore", srv.url, "notes", "2", SUPERFILE_API_KEY="cli-reader")
        assert "SUPERFILE_API_KEY" in _failed("count", srv.url, "notes")
    table = superfile.connect(uri).open_table("notes")
    assert table.version == 8 and sorted(table.to_arrow(columns=["key"]).column("key").to_pylist()) == [0, 1, 2, 3]
    assert [v["version"] for v in table.versions()] == [8]


def test_demo_serves_the_sample_with_the_key_it_prints(tmp_path: Path) -> None:
    """What ``make run`` runs: load Cranfield, then serve it; the printed key and curl body work, others don't;
    the shell commands it prints run."""
    port = free_port()
    args = [SUPERFILE, "demo", "--uri", f"file://{tmp_path / 'data'}", "--serve", "--port", str(port)]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        shell = [
            line.strip() for line in printed.splitlines() if re.match(r"\s+(SUPERFILE_API_KEY=\S+ )?superfile ", line)
        ]
        assert len(shell) == 6, printed
        for line in shell:
            done = subprocess.run(
                ["bash", "-c", line],
                env=_env(PATH=f"{BIN}:{os.environ['PATH']}"),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0 and done.stdout, (line, done.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
