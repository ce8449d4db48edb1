"""Scratch directories of index builds (``format/scratch.py``): a build killed by SIGKILL leaves its directory
behind, and a later process's first build removes it; a live build's directory is never removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pytest
import superfile
from superfile.format import archive, scratch

HOLD = """
import sys, time
from superfile.format.scratch import scratch_dir
with scratch_dir(sys.argv[2], sys.argv[1]) as path:
    print(path, flush=True)
    time.sleep(120)
"""

APPEND = """
import sys, pyarrow as pa, superfile
db = superfile.connect("file://" + sys.argv[1])
t = db.create_table("t", pa.schema([("text", pa.string())]), fts_columns=["text"])
t.append(pa.table({"text": [f"word{i % 977} other{i % 31}" for i in range(2_000_000)]}))
"""


def _holder(parent: Path, prefix: str = "sf-test-") -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(parent), prefix], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_killed_build_s_directory_is_removed_and_a_live_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "ORPHAN_AGE_S", 0.0)
    killed, dead = _holder(tmp_path)
    live, alive = _holder(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert os.path.isdir(dead) and os.path.exists(dead + ".lock")  # what SIGKILL leaves
        assert scratch.remove_orphans(str(tmp_path), "sf-test-") == [dead]
        assert not os.path.exists(dead) and not os.path.exists(dead + ".lock")
        assert os.path.isdir(alive) and os.path.exists(alive + ".lock")
    finally:
        live.kill()
        live.wait(10)


def test_a_process_s_first_build_sweeps_old_directories_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory without a lock file (its build killed before it took the lock, or written before locks) is
    removed once older than ORPHAN_AGE_S; a younger one may be a build about to take its lock."""
    old, young = tmp_path / "sf-test-old", tmp_path / "sf-test-young"
    old.mkdir()
    young.mkdir()
    (old / "segment").write_bytes(b"left")
    past = time.time() - 2 * scratch.ORPHAN_AGE_S
    os.utime(old, (past, past))
    monkeypatch.setattr(scratch, "_swept", set())
    with scratch.scratch_dir("sf-test-", str(tmp_path)) as path:
        assert os.path.isdir(path) and os.path.exists(path + ".lock")
    assert not old.exists() and young.exists()
    assert not os.path.exists(path) and not os.path.exists(path + ".lock")


def test_an_append_killed_mid_build_leaves_nothing_after_the_next_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real append SIGKILLed while it indexes: its full-text scratch directory stays in the temporary
    directory until the next process's first build there, which removes it."""
    work = tmp_path / "tmp"
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", APPEND, str(tmp_path / "data")], env={**os.environ, "TMPDIR": str(work)}
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith("sf-fts-") for p in work.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "the append ended before it was killed"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert any(p.name.startswith("sf-fts-") for p in work.iterdir())
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    monkeypatch.setattr(scratch, "_swept", set())
    monkeypatch.setattr(scratch, "ORPHAN_AGE_S", 0.0)
    t = superfile.connect(f"memory://scratch-{os.urandom(4).hex()}").create_table(
        "t", pa.schema([("text", pa.string())]), fts_columns=["text"]
    )
    t.append(pa.table({"text": ["one row"]}))
    assert not [p.name for p in work.iterdir() if p.name.startswith("sf-fts-")]


def test_an_extraction_sweeps_what_killed_extractions_and_removals_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index extraction and its removal write through scratch directories (``.tmp-``, ``.stale-``) beside the
    extraction: what a SIGKILLed process left there (or one of a version without locks, once old) is removed by
    the next extraction's (or removal's) first sweep of that directory; one a live process holds is kept."""
    parent = tmp_path / "dir_shared.parquet-1"
    parent.mkdir()
    killed, dead = _holder(parent, ".tmp-")
    live, alive = _holder(parent, ".stale-")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        unlocked = parent / ".stale-unlocked"
        unlocked.mkdir()
        (unlocked / "index").mkdir()
        past = time.time() - 2 * scratch.ORPHAN_AGE_S
        for left in (dead, unlocked):
            os.utime(left, (past, past))
        monkeypatch.setattr(scratch, "_swept", set())
        blob = archive.pack([("meta.json", b"{}"), ("seg.idx", b"postings")])
        archive.extract(memoryview(blob), str(parent / "text"), "shared.parquet")
        held = [os.path.basename(alive), os.path.basename(alive) + ".lock"]
        assert sorted(os.listdir(parent)) == sorted(["text", unlocked.name, *held])  # each prefix swept by its use
        assert sorted(os.listdir(parent / "text")) == ["meta.json", "seg.idx"]
        archive._remove(str(parent / "text"))
        assert sorted(os.listdir(parent)) == sorted(held)
    finally:
        live.kill()
        live.wait(10)


def test_the_swept_directories_are_forgotten_past_a_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Extractions sweep a directory per superfile: a process that serves a streaming table for months must not
    remember every one it swept."""
    monkeypatch.setattr(scratch, "_swept", set())
    monkeypatch.setattr(scratch, "_SWEPT_MAX", 8)
    for i in range(30):
        parent = tmp_path / f"entry-{i}"
        parent.mkdir()
        with scratch.scratch_dir(".tmp-", str(parent)):
            pass
        assert len(scratch._swept) <= 8
    assert all(os.listdir(tmp_path / f"entry-{i}") == [] for i in range(30))
