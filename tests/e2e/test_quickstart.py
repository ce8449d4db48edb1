"""docs/quickstart.md, run as a reader would run it: every fenced block, in order, and its results checked.

The blocks are ``sh`` or ``python`` (any other language fails the test, so nothing on the page goes unrun).
They run in a temporary directory:

- ``sh`` blocks run with ``bash -e``. The first one (install) clones the repository under test, the root
  computed from this file's path, in place of ``<repository-url>`` (the clone holds its committed files:
  the Cranfield sample the walk reads comes from it). Its ``make install`` line is the one line not run:
  ``make test``, which runs this test, has already installed the same packages into the venv it runs in
  (``install-test`` depends on ``install``), so the test checks that the Makefile has the ``install``
  target and links ``.venv`` in the clone to that venv instead. Every other line runs as written
  (``source .venv/bin/activate``; ``pip install`` with ``PIP_NO_INDEX=1``, so it finds the packages
  installed and reaches no registry; ``python -c ...``). The engine imported is the venv's editable install,
  the working tree of the repository under test.
- ``python`` blocks run in one fresh interpreter (the clone's ``.venv/bin/python``, working directory the
  clone), one after another in one namespace, as pasted into ``python``; each block's output is kept.
- The ``superfile serve`` block is what a reader starts in a second terminal: it runs in the background
  (its own process group, ended at the end), on a free port in place of 8000 (also in the Python block that
  connects to it), and the test waits for its ``/healthz`` before going on, as a reader waits for the
  server to say it is running.

Then the interpreter is asked for the values the page made, and the test checks them: 1,400 distinct rows
from the three appends, a BM25 top 5, the example row first in its own vector search, a hybrid top 10 with
documents the Cranfield judgments call relevant, the same ids from pandas, polars and DuckDB, the same
ranking from the ``hybrid_search`` SQL function and from the gateway; and the outputs the page shows.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
PORT_IN_DOC = 8000

pytestmark = pytest.mark.timeout(240)

# The interpreter the Python blocks run in: it reads one JSON message per line (a block's code and where it
# starts in the page), runs it in one namespace and answers with the block's output or its traceback.
DRIVER = r"""
import contextlib, io, json, sys, traceback
namespace = {"__name__": "__main__"}
answers = sys.stdout
for line in sys.stdin:
    message = json.loads(line)
    out, error = io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            exec(compile("\n" * (message["line"] - 1) + message["code"], message["file"], "exec"), namespace)
        except BaseException:
            error = traceback.format_exc()
    answers.write(json.dumps({"stdout": out.getvalue(), "error": error}) + "\n")
    answers.flush()
"""

# The test's own question to the interpreter once the page has run: the values the page made.
PROBE = """
import json
print(json.dumps({
    "rows": papers.count_rows(),
    "ids": sorted(papers.to_arrow(columns=["id"])["id"].to_pylist()),
    "bm25": bm25["id"].to_pylist(),
    "bm25_scores": bm25["score"].to_pylist(),
    "near": near["id"].to_pylist(),
    "hybrid": hybrid["id"].to_pylist(),
    "hybrid_scores": hybrid["score"].to_pylist(),
    "pandas": in_pandas["id"].tolist(),
    "polars": in_polars["id"].to_list(),
    "duckdb": [r[0] for r in in_duckdb.fetchall()],
    "sql": top["id"].to_pylist(),
    "remote": over_http["id"].to_pylist(),
}))
"""


@dataclass
class Block:
    lang: str
    code: str
    line: int  # the page's line number of the block's first line of code


def page_blocks() -> list[Block]:
    blocks: list[Block] = []
    lines = QUICKSTART.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        blocks.append(Block(opening.group(1), "\n".join(lines[i + 1 : end]) + "\n", i + 2))
        i = end + 1
    return blocks


def install_script(block: Block) -> str:
    """The install block with its two mapped lines (the module docstring says why)."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^install:", makefile, re.M), "the quickstart's `make install` is not a Makefile target"
    assert sys.prefix != sys.base_prefix, "the test must run in the venv make install creates"
    out: list[str] = []
    for line in block.code.splitlines():
        command = line.split("#")[0].strip()
        if command.startswith("git clone"):
            assert re.fullmatch(r"git clone \S+ supertable", command), command
            out.append(f"git clone -q {shlex.quote(str(ROOT))} supertable")
        elif command == "make install":
            out.append(f"ln -s {shlex.quote(sys.prefix)} .venv  # in place of make install")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Interpreter:
    """The one Python process the page's blocks run in."""

    def __init__(self, python: Path, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [str(python), "-c", DRIVER],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )

    def run(self, code: str, line: int = 1, file: str = str(QUICKSTART)) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "line": line, "file": file}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the interpreter died:\n{self.log.read_text()}"
        result = json.loads(answer)
        assert result["error"] is None, f"block at {QUICKSTART.name}:{line} failed:\n{result['error']}"
        return str(result["stdout"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"superfile serve exited with {proc.returncode}:\n{log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"superfile serve did not answer /healthz within {timeout} s:\n{log.read_text()}")


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the page starts in a second terminal; each one's process group is ended at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_quickstart_runs_as_written(tmp_path: Path, background: list[subprocess.Popen[bytes]]) -> None:
    blocks = page_blocks()
    assert [b.lang for b in blocks if b.lang not in ("sh", "python")] == [], "a block this test does not run"
    assert blocks[0].lang == "sh" and "git clone" in blocks[0].code, "the page starts with the install block"

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SUPERFILE_API_KEY", "SUPERFILE_API_KEYS")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
    clone = tmp_path / "supertable"
    port = free_port()
    outputs: list[str] = []
    interpreter: Interpreter | None = None
    try:
        for i, block in enumerate(blocks):
            if block.lang == "python":
                code = block.code
                if f"127.0.0.1:{PORT_IN_DOC}" in code:
                    code = code.replace(f"127.0.0.1:{PORT_IN_DOC}", f"127.0.0.1:{port}")
                if interpreter is None:
                    interpreter = Interpreter(clone / ".venv" / "bin" / "python", clone, env, tmp_path / "python.log")
                outputs.append(interpreter.run(code, block.line))
            elif i == 0:
                done = subprocess.run(
                    ["bash", "-e", "-c", install_script(block)],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, f"install block failed:\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
            elif "superfile serve" in block.code:
                assert f"--port {PORT_IN_DOC}" in block.code
                log = tmp_path / "serve.log"
                with log.open("w") as sink:
                    background.append(
                        subprocess.Popen(
                            ["bash", "-e", "-c", block.code.replace(f"--port {PORT_IN_DOC}", f"--port {port}")],
                            cwd=clone,
                            env=env,
                            stdout=sink,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                wait_healthy(background[-1], port, log)
                outputs.append("")
            else:
                done = subprocess.run(
                    ["bash", "-e", "-c", block.code], cwd=clone, env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0, f"block at line {block.line} failed:\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
        assert interpreter is not None, "the page has no Python"
        facts = json.loads(interpreter.run(PROBE, file="<test_quickstart probe>"))
    finally:
        if interpreter is not None:
            interpreter.close()

    def output_of(snippet: str) -> list[str]:
        """The output lines of the one block whose code holds ``snippet``."""
        (found,) = [out for block, out in zip(blocks, outputs, strict=True) if snippet in block.code]
        return found.splitlines()

    # Install: the activated venv's python imports the engine; the clone holds the sample the walk reads.
    import superfile

    assert output_of("git clone")[-1] == superfile.__version__
    assert (clone / "examples" / "data" / "cranfield" / "docs.parquet").is_file()
    assert (clone / "data").is_dir(), "the table is under the clone's ./data"

    # Appends: three commits, each a newer version, 1,400 distinct rows in all.
    *versions, count = (int(v) for v in output_of("papers.count_rows()"))
    assert len(versions) == 3 and versions == sorted(set(versions)), versions
    assert count == facts["rows"] == 1400
    assert facts["ids"] == list(range(1, 1401))

    # BM25: five hits, best first.
    assert len(facts["bm25"]) == 5
    assert facts["bm25_scores"] == sorted(facts["bm25_scores"], reverse=True) and facts["bm25_scores"][-1] > 0

    # Vector search by example: the example row is its own nearest neighbour.
    assert len(facts["near"]) == 5 and facts["near"][0] == 1
    assert output_of("papers.vector_search(")[-1] == "1"

    # Hybrid: ten rows, best first, with documents the judgments call relevant to Cranfield question 1.
    question = pq.read_table(clone / "examples" / "data" / "cranfield" / "queries.parquet").slice(0, 1)
    assert output_of("q_text, q_vec =")[-1] == question["text"][0].as_py()
    assert len(facts["hybrid"]) == 10
    assert facts["hybrid_scores"] == sorted(facts["hybrid_scores"], reverse=True)
    qrels = pq.read_table(clone / "examples" / "data" / "cranfield" / "qrels.parquet")
    judged = {d for q, d in zip(qrels["query_id"].to_pylist(), qrels["doc_id"].to_pylist(), strict=True) if q == 1}
    assert len(judged & set(facts["hybrid"])) >= 3, (facts["hybrid"], judged)

    # pandas, polars and DuckDB read the same result: the same ids (DuckDB sorts by score itself).
    assert facts["pandas"] == facts["polars"] == facts["hybrid"]
    assert sorted(facts["duckdb"]) == sorted(facts["hybrid"])
    if len(set(facts["hybrid_scores"])) == len(facts["hybrid_scores"]):  # no ties: one order
        assert facts["duckdb"] == facts["hybrid"]
    shown = output_of("in_pandas = hybrid.to_pandas()")
    assert sum(str(facts["hybrid"][0]) in line for line in shown) >= 3, "each library shows the top hit"

    # SQL's hybrid_search and the gateway rank as the table's search does; the page prints True for both.
    assert facts["sql"] == facts["hybrid"]
    assert facts["remote"] == facts["hybrid"]
    assert output_of("FROM hybrid_search(")[-1] == "True"
    assert output_of('superfile.connect("http://')[-1] == "True"
