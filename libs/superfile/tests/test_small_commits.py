"""The small-write commit path: _ids reserved in blocks, and a commit's objects uploaded concurrently.

Invariants: no _id is ever handed out twice (threads, processes, forked children, a table dropped and
re-created), and nothing a pointer swap makes reachable is still being written when the swap happens.
"""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import superfile
from superfile.errors import StorageError
from superfile.io.local import LocalStorage, StagedWrite
from superfile.manifest.store import ID_BLOCK, POINTER, SEQUENCE, ManifestStore
from superfile.manifest.summary import part_ref
from table_worker import append_until_killed

SCHEMA = pa.schema([("worker", pa.int32()), ("seq", pa.int32()), ("text", pa.string())])
WORKER = Path(__file__).with_name("table_worker.py")


def _rows(worker: int, seq: int, n: int = 3) -> pa.Table:
    return pa.table(
        {
            "worker": pa.array([worker] * n, pa.int32()),
            "seq": pa.array([seq] * n, pa.int32()),
            "text": [f"w{worker} s{seq} r{i}" for i in range(n)],
        }
    )


def _ids(t: superfile.Supertable) -> list[int]:
    return t.to_arrow(columns=["_id"]).column("_id").to_pylist()


def test_small_appends_take_ids_from_one_reservation(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table("t", SCHEMA, level0_max_rows=1000)
    storage = _Recording(str(tmp_path))
    t = superfile.Connection(uri, storage=storage).open_table("t")
    for seq in range(50):
        t.append(_rows(0, seq, 20))
    assert [e for e in storage.events if e == ("cas", SEQUENCE)] == [("cas", SEQUENCE)]  # one 4,096-id block
    assert _ids(t) == list(range(1000))
    t.append(_rows(0, 99, ID_BLOCK))  # a big append reserves exactly its own ids, after the block
    ids = sorted(_ids(t))
    assert len(ids) == len(set(ids)) == 1000 + ID_BLOCK
    assert ids[-1] == 2 * ID_BLOCK - 1


def test_ids_unique_under_concurrent_small_appends_across_processes(tmp_path: Path) -> None:
    """Four processes of two threads each, every thread with its own handle, and this process's own
    handle in between: 20-row appends, every _id distinct, every acknowledged batch there once."""
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    db.create_table("t", SCHEMA, fts_columns=["text"], level0_max_rows=1000)
    code = (
        "import sys, threading, superfile\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from table_worker import batch\n"
        "def run(w):\n"
        "    t = superfile.connect(sys.argv[1]).open_table('t')\n"
        "    for s in range(15):\n"
        "        v = t.append(batch(w, s, 20))\n"
        "        print(f'ack {w} {s} {v}', flush=True)\n"
        "ths = [threading.Thread(target=run, args=(int(sys.argv[2]) * 2 + k,)) for k in range(2)]\n"
        "[th.start() for th in ths]\n"
        "[th.join() for th in ths]\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, uri, str(p), str(WORKER.parent)], stdout=subprocess.PIPE, text=True
        )
        for p in range(4)
    ]
    mine = db.open_table("t")
    for s in range(15):
        mine.append(_rows(100, s, 20))
    acks = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        acks += [line for line in out.splitlines() if line.startswith("ack")]
    assert len(acks) == 8 * 15
    rows = superfile.connect(uri).open_table("t").to_arrow()
    ids = rows.column("_id").to_pylist()
    assert len(ids) == len(set(ids)) == 9 * 15 * 20
    batches: dict[tuple[int, int], int] = {}
    for w, s in zip(rows.column("worker").to_pylist(), rows.column("seq").to_pylist(), strict=True):
        batches[(w, s)] = batches.get((w, s), 0) + 1
    assert set(batches.values()) == {20}
    assert set(batches) == {(w, s) for w in [*range(8), 100] for s in range(15)}


def _reserve_in_child(t: superfile.Supertable, out: Any) -> None:
    out.put(t.files.manifests.reserve_ids(10, 3, t.snapshot().manifest.table_uuid))


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_does_not_take_ids_from_its_parents_block(tmp_path: Path) -> None:
    t = superfile.connect(f"file://{tmp_path}").create_table("t", SCHEMA, level0_max_rows=1000)
    t.append(_rows(0, 0, 10))  # the parent holds a block: ids 0-9 taken, 10-4095 left
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_reserve_in_child, args=(t, out))
    child.start()
    first = out.get(timeout=120)
    child.join(timeout=120)
    assert child.exitcode == 0
    assert first == ID_BLOCK  # its own block, after the parent's
    t.append(_rows(0, 1, 10))  # the parent goes on in its block
    assert sorted(_ids(t)) == list(range(20))


def test_a_block_is_never_used_on_a_recreated_table(tmp_path: Path) -> None:
    """The sequence of a table dropped and re-created starts again: a block reserved under the old table's
    uuid is not served to the new one."""
    db = superfile.connect(f"file://{tmp_path}")
    t = db.create_table("t", SCHEMA)
    store = t.files.manifests
    old = t.snapshot().manifest.table_uuid
    assert store.reserve_ids(10, 3, old) == 0
    assert store.reserve_ids(10, 3, old) == 10  # from the block
    db.drop_table("t")
    new = db.create_table("t", SCHEMA).snapshot().manifest.table_uuid
    assert store.reserve_ids(10, 3, new) == 0  # the new table's sequence, not the old block
    assert store.reserve_ids(10, 3, old) != 20  # nor does the old table's block survive a reservation


class _Recording(LocalStorage):
    """Local storage (itself, so a commit takes its fast path: ``write_unique``, a staged pointer) that records
    when each create finished and when each pointer swap began."""

    def __init__(self, root: str, fail: str | None = None, parent: _Recording | None = None) -> None:
        super().__init__(root, create=parent is None)
        self.events: list[tuple[str, str]] = parent.events if parent else []
        self.fail = fail
        self._lock = parent._lock if parent else threading.Lock()

    def child(self, prefix: str) -> _Recording:
        return _Recording(str(Path(self.local_path(prefix.removesuffix("/")) or "")), self.fail, self)

    def _create(self, write: Any, path: str, data: bytes) -> Any:
        if self.fail and path.startswith(self.fail):
            raise StorageError(f"{path!r}: injected failure")
        etag = write(path, data)
        with self._lock:
            self.events.append(("created", path))
        return etag

    def write_unique(self, path: str, data: bytes) -> None:
        self._create(super().write_unique, path, data)

    def write_if_absent(self, path: str, data: bytes) -> str:
        return self._create(super().write_if_absent, path, data)

    def write(self, path: str, data: bytes) -> str:
        return self._create(super().write, path, data)

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        with self._lock:
            self.events.append(("swap", data.decode()) if path == POINTER else ("cas", path))
        return super().write_if_match(path, data, etag)

    def swap_staged(self, staged: StagedWrite, etag: str) -> str:
        with self._lock:
            self.events.append(("swap", Path(staged.tmp).read_text()))
        return super().swap_staged(staged, etag)


def test_everything_a_swap_reaches_is_written_before_it(tmp_path: Path) -> None:
    """Four threads commit small appends and deletes concurrently: each manifest list, its parts, its
    superfiles and deletion vectors had finished writing (fsync and directory fsync included) before the
    swap naming that list began."""
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table("t", SCHEMA, fts_columns=["text"], level0_max_rows=1000)
    storage = _Recording(str(tmp_path))
    assert storage.syncs  # the concurrent upload path
    db = superfile.Connection(uri, storage=storage)
    rng = random.Random(5)

    def writer(w: int) -> None:
        t = db.open_table("t")
        for s in range(10):
            t.append(_rows(w, s, 5))
            if rng.random() < 0.3:
                t.delete(f"worker = {w} AND seq = {s}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    t = db.open_table("t")
    created: set[str] = set()
    swaps = 0
    for kind, what in storage.events:
        if kind == "created":
            created.add(what)
            continue
        if kind == "cas":
            continue
        swaps += 1
        manifest = what.split('"manifest": "')[1].split('"')[0]
        assert manifest in created, f"swap to {manifest} before it was written"
    assert swaps >= 40
    entries = t.snapshot().entries()
    assert all(e.path in created for e in entries)
    assert all(e.deletes.path in created for e in entries if e.deletes is not None)


def test_a_failed_upload_commits_nothing(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table("t", SCHEMA, level0_max_rows=1000)
    storage = _Recording(str(tmp_path), fail="data/")
    t = superfile.Connection(uri, storage=storage).open_table("t")
    with pytest.raises(StorageError, match="injected"):
        t.append(_rows(0, 0))
    assert not [e for e in storage.events if e[0] == "swap"]
    assert not list((tmp_path / "t").glob("._pointer.json.*"))  # the staged pointer was removed
    fresh = superfile.connect(uri).open_table("t")
    assert fresh.version == 1
    assert fresh.count_rows() == 0


def test_sigkill_during_small_commits_leaves_a_committed_table(tmp_path: Path) -> None:
    """Level-0 commits (the concurrent-upload path) killed at random points: the table opens at a committed
    version, with every acknowledged batch once and no partial one."""
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table("t", SCHEMA, fts_columns=["text"], level0_max_rows=1000)
    rng = random.Random(11)
    acked: set[tuple[int, int]] = set()
    for trial in range(12):
        acked |= {(trial, seq) for seq in append_until_killed("append", uri, "t", trial, 5, rng.uniform(0, 0.2))}
        t = superfile.connect(uri).open_table("t")
        rows = t.to_arrow()
        batches: dict[tuple[int, int], int] = {}
        for w, s in zip(rows.column("worker").to_pylist(), rows.column("seq").to_pylist(), strict=True):
            batches[(w, s)] = batches.get((w, s), 0) + 1
        assert all(n == 5 for n in batches.values()), "a partial commit is visible"
        assert acked <= set(batches), "an acknowledged commit was lost"
        ids = rows.column("_id").to_pylist()
        assert len(ids) == len(set(ids)), "an _id was handed out twice"


def test_an_open_part_summarized_commit_by_commit_equals_a_full_merge(tmp_path: Path) -> None:
    """The open part a small commit adds to is summarized from its previous summary and the new entries only
    (``manifest.summary.extended_ref``) and written as its previous zstd frames plus one
    (``ManifestStore.extend_part``): across commits, deletes (which rewrite the part whole), a reopen, parts
    sealing and a recompression, every part's summary equals ``part_ref`` over its entries as read back from
    storage."""
    uri = f"file://{tmp_path}"
    schema = pa.schema([("n", pa.int64()), ("s", pa.string()), ("f", pa.float64())])
    t = superfile.connect(uri).create_table("t", schema, level0_max_rows=1000, manifest_part_max_entries=80)
    rng = random.Random(3)

    def batch(i: int) -> pa.Table:
        n = 1 + rng.randrange(4)
        ints = [None] * n if i % 7 == 0 else [rng.randrange(-1000, 1000) for _ in range(n)]
        # long strings: their bounds are truncated
        strs = [None if rng.random() < 0.3 else f"k{rng.randrange(1000):03d}" * rng.randrange(1, 30) for _ in range(n)]
        return pa.table({"n": pa.array(ints, pa.int64()), "s": pa.array(strs, pa.string()), "f": [rng.random()] * n})

    def check(table: superfile.Supertable) -> None:
        ml = table.snapshot().manifest
        fresh = ManifestStore(table.files.storage)  # reads every part back from storage
        for ref in ml.parts:
            entries = fresh.load_part(ref, ml.schema)
            assert len(entries) == ref.entry_count
            full = replace(part_ref(ref.path, ref.partition, entries, ref.byte_size), sealed=ref.sealed)
            assert full.to_json(ml.schema) == ref.to_json(ml.schema)

    for i in range(100):
        t.append(batch(i))
        if i % 25 == 24:
            t.delete(f"n = {rng.randrange(-1000, 1000)} OR f < 0.05")
        if i % 10 == 9:
            check(t)
    t = superfile.connect(uri).open_table("t")  # the open part's summary and frames now come from storage
    for i in range(100, 180):
        t.append(batch(i))
        if i % 10 == 9:
            check(t)
    assert len(t.snapshot().manifest.parts) >= 3
    assert t.count_rows() == superfile.connect(uri).open_table("t").to_arrow().num_rows
