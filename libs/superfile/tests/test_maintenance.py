"""Maintenance and history: optimize, cleanup, versions / as_of / restore, the change feed, idempotent appends.

In-process tests pin interleavings exactly (a transaction staged before an
optimize publishes after it); the race tests run writers, readers and
compaction in real processes against file:// and s3:// and compare the
final table with the model of every acknowledged write.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import superfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from maintenance_worker import SCHEMA, batch
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    ReadOnlyTableError,
    UnknownColumnError,
    VersionNotFoundError,
)
from superfile.io import from_uri
from superfile.io.local import LocalStorage
from superfile.table import cleanup as cleanup_module
from superfile.table import optimize as optimize_module

HERE = Path(__file__).resolve().parent
CRANFIELD = HERE.parents[2] / "examples" / "data" / "cranfield" / "docs.parquet"
WORKER = HERE / "maintenance_worker.py"
QUERIES = ["boundary layer", "supersonic flow wing", "heat transfer", "shock wave interaction", "buckling of shells"]


@pytest.fixture(scope="module")
def cranfield() -> pa.Table:
    return pq.read_table(CRANFIELD)


def _uri(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if backend == "file":
        return f"file://{tmp_path / 'store'}"
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{request.getfixturevalue('s3_bucket')}/m?endpoint_url={quote(endpoint, safe='')}"


def _docs(db: superfile.Connection, name: str, schema: pa.Schema, **options: Any) -> superfile.Supertable:
    return db.create_table(
        name, schema, fts_columns=["title", "text"], vector_columns={"embedding": {"dim": 384}}, **options
    )


def _small(db: superfile.Connection, name: str = "t", **options: Any) -> superfile.Supertable:
    return db.create_table(name, SCHEMA, fts_columns=["text"], vector_columns={"emb": {"dim": 8}}, **options)


def _rows(t: superfile.Supertable | pa.Table) -> list[dict[str, Any]]:
    """Every live row as Python values, in ``_id`` order (vectors included)."""
    table = t if isinstance(t, pa.Table) else t.to_arrow()
    return table.sort_by("_id").to_pylist()


def _superfile_paths(t: superfile.Supertable) -> set[str]:
    return {e.path for e in t._current().entries()}


def _search_results(t: superfile.Supertable, queries: list[str], vectors: np.ndarray) -> dict[str, Any]:
    """BM25, exact vector kNN, unranked matches, filters and SQL: everything a compaction must not change."""
    rows = t.count_rows()
    out: dict[str, Any] = {}
    for q in queries:
        r = t.bm25_search("text", q, k=20, projection=["_id", "score"])
        out[f"bm25 {q}"] = (r["_id"].to_pylist(), r["score"].to_pylist())
        out[f"tokens {q}"] = sorted(t.token_match("text", q.split(), "or", projection=["_id"])["_id"].to_pylist())
    for i, v in enumerate(vectors):  # every row re-ranked exactly: the ranking does not depend on the layout
        r = t.vector_search("embedding", v, k=10, nprobe=1000, rerank=rows, projection=["_id", "score"])
        out[f"vector {i}"] = (r["_id"].to_pylist(), r["score"].to_numpy())
    out["filtered"] = sorted(
        t.to_arrow(columns=["_id"], where="id % 7 = 3 OR author LIKE '%smith%'")["_id"].to_pylist()
    )
    return out


def _assert_same_results(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key.startswith(("vector", "bm25")):
            # Same rows in the same order; scores to float32 rounding. BM25 before optimize runs per superfile
            # (deletion vectors), after it as one tantivy search (docs/search.md): same formula, other rounding.
            assert a[key][0] == b[key][0], key
            np.testing.assert_allclose(a[key][1], b[key][1], rtol=1e-5, atol=1e-6)
        else:
            assert a[key] == b[key], key


# -- optimize --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_optimize_after_500_small_appends_and_100_deletes(cranfield: pa.Table) -> None:
    # cranfield's text, with its embeddings cut to 16 dimensions (the vector path is the same, manifests smaller)
    vectors = cranfield["embedding"].combine_chunks().values.to_numpy().reshape(-1, 384)[:, :16].astype(np.float32)
    docs = cranfield.set_column(
        cranfield.schema.get_field_index("embedding"),
        "embedding",
        pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 16),
    )
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = db.create_table(
        "docs",
        docs.schema,
        fts_columns=["text"],
        vector_columns={"embedding": {"dim": 16}},
        max_rows_per_superfile=400,
        manifest_part_max_entries=64,  # several manifest parts: optimize removes entries across all of them
    )
    for i in range(500):  # 500 commits of 3 rows: one superfile each
        t.append(docs.slice(3 * i % 1398, 3))
    rng = np.random.default_rng(5)
    for _ in range(100):  # 100 commits deleting up to 4 rows each (some already deleted: fewer)
        t.delete(f"id IN ({', '.join(map(str, rng.integers(1, 1401, 4)))})")
    before_stats = t.stats()
    assert before_stats["superfile_count"] == 500 and before_stats["manifest_parts"] == 8
    assert before_stats["deleted_rows"] > 300
    live = before_stats["row_count"]
    before_rows = _rows(t)
    before = _search_results(t, QUERIES, vectors[[0, 77, 512, 900]])
    sql = "SELECT source, count(*) AS n, min(_id) AS first FROM docs GROUP BY source ORDER BY source"
    before_sql = db.sql(sql).to_pylist()
    version = t.version

    result = t.optimize()
    assert result["version"] == version + 1 and result["superfiles_removed"] == 500
    after_stats = t.stats()
    assert after_stats["superfile_count"] == result["superfiles_added"] == math.ceil(live / 400)
    assert after_stats["row_count"] == live and after_stats["deleted_rows"] == 0
    assert _rows(t) == before_rows  # same rows, same _ids, vectors included
    _assert_same_results(before, _search_results(t, QUERIES, vectors[[0, 77, 512, 900]]))
    assert db.sql(sql).to_pylist() == before_sql
    assert t.versions()[-1] == {**t.versions()[-1], "operation": "optimize", "rows_added": 0, "rows_deleted": 0}
    assert t.optimize()["version"] == t.version == version + 1  # nothing left to do: no new version
    assert _rows(t.checkout(version)) == before_rows  # the old layout is still readable


def test_optimize_empty_nothing_to_do_and_bad_arguments(tmp_path: Path) -> None:
    db = superfile.connect(f"file://{tmp_path}")
    t = _small(db, max_rows_per_superfile=100)
    empty = t.optimize()
    assert empty["version"] == 1 and empty["superfiles_removed"] == empty["superfiles_added"] == 0
    assert t.version == 1 and len(t.versions()) == 1
    t.append(batch(0, 0, 80))  # one superfile, not worth rewriting
    assert t.optimize()["superfiles_removed"] == 0 and t.version == 2
    for bad in ({"target_rows": 0}, {"target_rows": -5}, {"target_rows": "10"}, {"target_rows": True}):
        with pytest.raises(InvalidOptionError):
            t.optimize(**bad)
    with pytest.raises(InvalidOptionError):
        t.optimize(target_bytes=0)
    with pytest.raises(InvalidOptionError):
        t.optimize(10, target_bytes=1000)
    with pytest.raises(ReadOnlyTableError):
        t.checkout(2).optimize()
    assert t.version == 2 and len(os.listdir(tmp_path / "t" / "data")) == 1  # nothing was written


def test_optimize_by_bytes_partitions_and_outputs_left_alone(tmp_path: Path) -> None:
    db = superfile.connect(f"file://{tmp_path}")
    t = _small(db, partition={"column": "worker", "transform": "identity"}, max_rows_per_superfile=40)
    for seq in range(25):
        t.append(pa.concat_tables([batch(0, seq, 10), batch(1, seq, 2)]))  # two partitions, 10 and 2 rows
    rows = _rows(t)
    first = t.optimize()
    # worker 0: 250 rows -> 7 balanced outputs (~36 rows); worker 1: 50 rows -> 2 outputs of 25
    assert first["superfiles_removed"] == 50 and first["superfiles_added"] == 9
    entries = t._current().entries()
    assert Counter(e.partition for e in entries) == {"0": 7, "1": 2}
    assert all(2 * e.rows >= 40 for e in entries)
    assert _rows(t) == rows
    # outputs of at least half the target are left alone: only what arrives later is merged
    for seq in range(25, 30):
        t.append(batch(0, seq, 1))
    second = t.optimize()
    assert (second["superfiles_removed"], second["superfiles_added"], second["rows_rewritten"]) == (5, 1, 5)
    assert t.optimize()["superfiles_removed"] == 0
    # a byte target is turned into rows from the table's bytes per row
    per_row = sum(e.size for e in t._current().entries()) / t.count_rows()
    sized = t.optimize(target_bytes=int(per_row * 1000))
    assert sized["target_rows"] in range(990, 1011)
    assert Counter(e.partition for e in t._current().entries()) == {"0": 1, "1": 1}
    assert _rows(t) == _rows(t.checkout(second["version"] - 1))  # optimizing never changes the rows
    assert [r for r in _rows(t) if r["seq"] < 25] == rows


def test_delete_landing_during_optimize_is_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete that commits after optimize read its inputs and before it publishes still applies."""
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = _small(db, max_rows_per_superfile=100)
    for seq in range(10):
        t.append(batch(0, seq, 10))
    t.delete("seq = 0 AND i < 3")  # an input with a deletion vector already
    other = db.open_table("t")
    build = optimize_module._Rewrite.add
    landed: list[int] = []

    def add_then_delete(self: Any, shards: Any) -> None:
        build(self, shards)
        if not landed:  # outputs built, not yet published: a concurrent delete commits now
            landed.append(other.delete("seq IN (0, 5) AND i >= 5"))

    monkeypatch.setattr(optimize_module._Rewrite, "add", add_then_delete)
    result = t.optimize()
    assert landed and result["version"] == landed[0] + 1
    assert result["deletes_carried"] == 10
    assert t.stats()["superfile_count"] == 1
    kept = {(r["seq"], r["i"]) for r in _rows(t)}
    assert kept == {(s, i) for s in range(10) for i in range(10)} - {(0, i) for i in range(3)} - {
        (s, i) for s in (0, 5) for i in range(5, 10)
    }
    assert t.count_rows() == len(kept) == t.versions()[-1]["row_count"]


def test_writes_staged_before_optimize_follow_the_moved_rows() -> None:
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = _small(db, max_rows_per_superfile=100)
    for seq in range(6):
        t.append(batch(0, seq, 5))
    ids = {(r["seq"], r["i"]): r["_id"] for r in _rows(t)}
    deleting = t.transaction()
    assert deleting.delete("seq = 1") == 5
    updating = db.open_table("t").transaction()
    assert updating.update("seq = 2 AND i = 0", batch(9, 2, 1)) == 1
    appending = db.open_table("t").transaction()
    appending.append(batch(0, 6, 5))
    db.open_table("t").optimize()  # rewrites every superfile the transactions staged deletes on
    deleting.commit()
    updating.commit()
    appending.commit()
    rows = _rows(t)
    assert len(rows) == 6 * 5 - 5 + 5 and len({r["_id"] for r in rows}) == len(rows)
    assert not any(r["seq"] == 1 for r in rows)
    updated = [r for r in rows if r["_id"] == ids[(2, 0)]]
    assert len(updated) == 1 and updated[0]["worker"] == 9  # kept its _id, replaced once
    assert {r["_id"] for r in rows if r["worker"] == 0 and r["seq"] < 6} == {
        v for (s, _), v in ids.items() if s != 1 and (s, _) != (2, 0)
    }


def test_concurrent_updates_and_deletes_of_one_row_leave_one_row() -> None:
    """Deletes name rows by ``_id``: two updates of one row leave one row (the later wins), and an update of
    a row a concurrent delete removed adds nothing."""
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = _small(db)
    t.append(batch(0, 0, 4))
    a, b = db.open_table("t").transaction(), db.open_table("t").transaction()
    a.update("i = 1", batch(1, 0, 1))
    b.update("i = 1", batch(2, 0, 1))
    a.commit()
    b.commit()
    assert [(r["_id"], r["worker"]) for r in _rows(t)] == [(0, 0), (1, 2), (2, 0), (3, 0)]
    updating, deleting = db.open_table("t").transaction(), db.open_table("t").transaction()
    updating.update("_id = 2", batch(3, 0, 1))
    deleting.delete("_id = 2")
    deleting.commit()
    version = updating.commit()
    assert [(r["_id"], r["worker"]) for r in _rows(t)] == [(0, 0), (1, 2), (3, 0)]
    assert t.versions()[-1]["version"] == version and t.count_rows() == 3
    deleting, updating = db.open_table("t").transaction(), db.open_table("t").transaction()
    deleting.delete("_id = 3")
    updating.update("_id = 3", batch(4, 0, 1))
    updating.commit()
    deleting.commit()  # the delete follows the row the update put in place
    assert [(r["_id"], r["worker"]) for r in _rows(t)] == [(0, 0), (1, 2)]


def _stream(proc: subprocess.Popen[str], lines: list[str], first: threading.Event) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        first.set()
    first.set()


def _spawn(*args: str) -> tuple[subprocess.Popen[str], list[str], threading.Event]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    first = threading.Event()
    threading.Thread(target=_stream, args=(proc, lines, first), daemon=True).start()
    return proc, lines, first


def _finish(proc: subprocess.Popen[str], timeout: float) -> None:
    proc.wait(timeout=timeout)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == 0, err[-3000:]


def _model(lines: list[str]) -> set[tuple[int, int]]:
    """(worker, seq) of every batch acknowledged as appended and not acknowledged as deleted."""
    added = {(int(w), int(s)) for kind, w, s, _ in (x.split() for x in lines) if kind == "ack"}
    deleted = {(int(w), int(s)) for kind, w, s, _ in (x.split() for x in lines) if kind == "del"}
    assert deleted <= added
    return added - deleted


def _batches(t: superfile.Supertable) -> Counter[tuple[int, int]]:
    rows = t.to_arrow(columns=["worker", "seq"])
    return Counter(zip(rows["worker"].to_pylist(), rows["seq"].to_pylist(), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "s3"])
def test_optimize_racing_writer_processes_loses_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    uri = _uri(backend, request, tmp_path)
    db = superfile.connect(uri)
    t = _small(db, max_rows_per_superfile=60)
    writers, appends, rows = 3, 24 if backend == "file" else 15, 3
    procs = [_spawn("write", uri, "t", str(w), str(appends), str(rows)) for w in range(writers)]
    for _, _, first in procs:
        assert first.wait(120), "a writer never acknowledged a write"
    results = []
    while any(p.poll() is None for p, _, _ in procs):  # compact for as long as anybody writes
        results.append(t.optimize())
    for p, _, _ in procs:
        _finish(p, 300)
    results.append(t.optimize())
    acked = _model([line for _, lines, _ in procs for line in lines])
    assert len(acked) == writers * (appends - appends // 3)
    got = _batches(t)
    assert set(got) == acked and set(got.values()) == {rows}  # every acknowledged write, each batch whole, once
    ids = t.to_arrow(columns=["_id"])["_id"]
    assert len(pc.unique(ids)) == len(ids) == t.count_rows() == t.versions()[-1]["row_count"]
    assert sum(r["superfiles_removed"] > 0 for r in results) >= 2  # compactions published while writers ran
    # the last compaction materialized every deletion vector; all files but one small tail hold >= half the target
    assert t.stats()["deleted_rows"] == 0
    assert t.stats()["superfile_count"] <= t.count_rows() // 30 + 1


# -- cleanup ---------------------------------------------------------------------------------------------------


def _reachable(uri: str, name: str) -> set[str]:
    """Every object the current version references, read from the raw JSON (independently of cleanup's code)."""
    storage = from_uri(uri).child(name)
    pointer = json.loads(storage.read("_pointer.json"))
    ml = json.loads(storage.read(pointer["manifest"]))
    out = {"_pointer.json", "_sequence.json", pointer["manifest"]}
    out |= {path for path, _ in ml["properties"].get("idempotency_keys", [])}
    segment = ml["history_segment"]
    while segment is not None:
        out.add(segment)
        segment = json.loads(storage.read(segment))["previous"]
    for part in ml["parts"]:
        out.add(part["path"])
        raw = pa.CompressedInputStream(pa.BufferReader(storage.read(part["path"])), "zstd").read()
        for e in json.loads(raw)["entries"]:
            out.add(e["path"])
            if e["deletes"]:
                out.add(e["deletes"][0])
    return out


def _listing(uri: str, name: str) -> dict[str, int]:
    return {i.path: i.size for i in from_uri(uri).child(name).list("") if i.path != "_retention.json"}


def test_cleanup_dry_run_retention_and_expired_versions(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = _small(db, max_rows_per_superfile=100)
    for seq in range(4):
        t.append(batch(0, seq, 5), idempotency_key=f"k{seq}")  # each rewrites the open key block
    t.delete("seq = 0")
    t.optimize()
    version = t.version
    kept = t.cleanup(datetime.timedelta(days=1))
    assert kept["files_removed"] == 0 and kept["retained_versions"] == version
    before = _listing(uri, "t")
    garbage = set(before) - _reachable(uri, "t")
    dry = t.cleanup(0, dry_run=True)
    assert dry["dry_run"] and dry["files_removed"] == len(garbage) and _listing(uri, "t") == before
    assert dry["removed"] == {
        "manifests": version - 1,  # every list but the current one
        "manifest_parts": sum(p.startswith("_manifests/parts/") for p in garbage),
        "superfiles": 4,
        "deletion_vectors": 1,
        "idempotency_blocks": 3,
        "history_segments": 0,  # a short history is all in the manifest list
    }
    assert dry["bytes_removed"] == sum(before[p] for p in garbage)
    assert t.checkout(2).count_rows() == 5  # a dry run expires nothing
    done = t.cleanup(0)
    assert {k: v for k, v in done.items() if k != "dry_run"} == {k: v for k, v in dry.items() if k != "dry_run"}
    assert set(_listing(uri, "t")) == set(before) - garbage == _reachable(uri, "t")
    assert [h["version"] for h in t.versions()] == [version]
    for expired in (2, version - 1):
        with pytest.raises(VersionNotFoundError):
            t.checkout(expired)
        with pytest.raises(VersionNotFoundError):
            t.restore(expired)
        with pytest.raises(VersionNotFoundError):
            t.changes(expired)
        with pytest.raises(VersionNotFoundError):
            db.open_table("t", version=expired)
    with pytest.raises(VersionNotFoundError):
        db.open_table("t", as_of=t.versions()[0]["timestamp_ms"] - 1)
    assert t.append(batch(0, 3, 5), idempotency_key="k3") == 5  # the keys survived in the current block
    assert t.count_rows() == 15 and t.cleanup(0)["files_removed"] == 0
    for bad in (-1, float("nan"), "a week", True):
        with pytest.raises(InvalidOptionError):
            t.cleanup(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        t.cleanup(0, safety_margin=-1)
    with pytest.raises(InvalidOptionError):
        t.cleanup(0, dry_run="yes")  # type: ignore[arg-type]
    with pytest.raises(ReadOnlyTableError):
        t.checkout(version).cleanup(0)


def test_cleanup_safety_margin_keeps_files_of_a_commit_in_flight(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = _small(db, write_buffer_bytes=1)  # every staged append is built and uploaded at once
    t.append(batch(0, 0, 5))
    tx = t.transaction()
    tx.append(batch(0, 1, 5))
    tx.append(batch(0, 2, 5))
    in_flight = {p for p in _listing(uri, "t") if p.startswith("data/")} - _superfile_paths(t)
    assert len(in_flight) == 2
    t.append(batch(0, 3, 5))  # another commit meanwhile
    without = t.cleanup(0, dry_run=True)
    assert without["removed"]["superfiles"] == 2  # no margin: the transaction's files look like garbage
    with_margin = t.cleanup(0, safety_margin=datetime.timedelta(minutes=10))
    assert with_margin["files_removed"] == 0 and with_margin["retained_versions"] == 1  # all young: all kept
    assert in_flight <= set(_listing(uri, "t"))
    tx.commit()
    assert sorted({r["seq"] for r in _rows(t)}) == [0, 1, 2, 3] and t.count_rows() == 20


class _CountingReads(LocalStorage):
    """Local storage counting the reads of each path (one count shared with its children)."""

    def __init__(self, root: str, reads: Counter[str] | None = None) -> None:
        super().__init__(root, create=reads is None)
        self.reads: Counter[str] = Counter() if reads is None else reads

    def child(self, prefix: str) -> _CountingReads:
        return _CountingReads(str(Path(self.local_path(prefix.removesuffix("/")) or "")), self.reads)

    def read(self, path: str) -> bytes:
        self.reads[path] += 1
        return super().read(path)


def test_cleanup_reads_each_retained_manifest_once_per_process(tmp_path: Path) -> None:
    """Manifest lists and parts are immutable: a second cleanup marks the versions the first retained from
    what the first read, and reads only what is new (the builder cleans up every minute, and reading every
    retained version again was most of each run). What it marks is still complete: a superfile a later
    optimize left behind goes, every file a retained version names stays."""
    uri = f"file://{tmp_path}"
    writer = _small(superfile.connect(uri), level0_max_rows=1000)
    for seq in range(80):  # more than the manifest lists a handle caches
        writer.append(batch(0, seq, 5))
    storage = _CountingReads(str(tmp_path))
    t = superfile.Connection(uri, storage=storage).open_table("t")
    first = t.cleanup(datetime.timedelta(days=1))
    read = {p for p in storage.reads if p.startswith("_manifests/")}
    assert sum(p.startswith("_manifests/parts/") for p in read) >= 80 and first["files_removed"] == 0
    storage.reads.clear()
    writer.append(batch(0, 80, 5))
    second = t.cleanup(datetime.timedelta(days=1))
    assert second["retained_versions"] == first["retained_versions"] + 1
    assert not read & set(storage.reads), "a retained version's list or part was read again"
    assert {p for p in storage.reads if p.startswith("_manifests/parts/")}, "the new version's part was not read"
    writer.optimize()
    done = t.cleanup(0)
    assert done["removed"]["superfiles"] == 81 and done["retained_versions"] == 1
    assert set(_listing(uri, "t")) == _reachable(uri, "t")
    table_uri = t.files.storage.uri
    cached = {key.partition("\0")[2] for key in cleanup_module._NAMES if key.partition("\0")[0] == table_uri}
    assert cached and cached <= _reachable(uri, "t")  # what expired versions named is not kept
    assert writer.count_rows() == 405


@pytest.mark.slow
def test_cleanup_with_writers_and_readers_never_breaks_a_retained_read(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'store'}"
    db = superfile.connect(uri)
    t = _small(db, max_rows_per_superfile=40)
    window = 4.0  # seconds; a read finishing within half of it of its start is promised to work
    stop = tmp_path / "stop"
    readers = [_spawn("read", uri, "t", str(stop)) for _ in range(2)]
    for _, _, first in readers:  # readers first: their start (imports, compiled kernels) can outlast the writes
        assert first.wait(120)
    writers = [_spawn("write", uri, "t", str(w), "30", "3") for w in range(2)]
    for _, _, first in writers:
        assert first.wait(120)
    cleanups: list[dict[str, Any]] = []
    peak = 0
    while any(p.poll() is None for p, _, _ in writers):
        t.optimize()  # makes garbage: the inputs leave the current version
        peak = max(peak, len(_listing(uri, "t")))
        cleanups.append(t.cleanup(window, safety_margin=window))
    for p, _, _ in writers:
        _finish(p, 300)
    deadline = time.monotonic() + window + 60
    while time.monotonic() < deadline:  # old versions age out of the window while readers keep reading
        t.optimize()
        cleanups.append(t.cleanup(window, safety_margin=window))
        if cleanups[-1]["retained_versions"] == 1 and cleanups[-1]["files_removed"] == 0:
            break
        time.sleep(0.2)  # poll interval while versions age
    stop.touch()
    for p, _, _ in readers:
        _finish(p, 120)
    reads = [line.split(maxsplit=6) for _, lines, _ in readers for line in lines]
    promised = [r for r in reads if float(r[4]) - float(r[2]) <= window / 2]
    broken = [" ".join(r) for r in promised if r[0] != "ok"]
    assert not broken, broken[:5]
    assert sum(r[0] == "ok" for r in promised) >= 10
    assert sum(c["files_removed"] for c in cleanups) > 0 and len(_listing(uri, "t")) < peak
    got = _batches(t)
    acked = _model([line for _, lines, _ in writers for line in lines])
    assert set(got) == acked and set(got.values()) == {3}
    # with nothing in flight, a zero window removes exactly what the current version does not reference
    before = _listing(uri, "t")
    garbage = set(before) - _reachable(uri, "t")
    done = t.cleanup(0, safety_margin=0)
    assert done["files_removed"] == len(garbage) and done["bytes_removed"] == sum(before[p] for p in garbage)
    assert set(_listing(uri, "t")) == _reachable(uri, "t")
    assert set(_batches(t)) == acked


# -- versions, as_of, restore ----------------------------------------------------------------------------------


def test_versions_as_of_and_restore(tmp_path: Path) -> None:
    db = superfile.connect(f"file://{tmp_path}")
    created = datetime.datetime.now(datetime.UTC)
    t = _small(db, max_rows_per_superfile=100)
    snapshots: dict[int, list[dict[str, Any]]] = {1: []}
    for step, write in enumerate(
        [
            lambda: t.append(batch(0, 0, 6)),
            lambda: t.append(batch(0, 1, 4)),
            lambda: t.delete("i < 2"),
            lambda: t.update("seq = 1 AND i = 3", batch(7, 1, 1)),
            lambda: t.optimize()["version"],
        ]
    ):
        time.sleep(0.005)  # distinct millisecond timestamps
        version = write()
        assert version == step + 2
        snapshots[version] = _rows(t)
    history = t.versions()
    assert [h["operation"] for h in history] == ["create", "append", "append", "delete", "update", "optimize"]
    assert [h["row_count"] for h in history] == [0, 6, 10, 6, 6, 6]
    assert [(h["rows_added"], h["rows_deleted"]) for h in history] == [(0, 0), (6, 0), (4, 0), (0, 4), (1, 1), (0, 0)]
    stamps = {h["version"]: h["timestamp_ms"] for h in history}
    assert list(stamps.values()) == sorted(stamps.values())
    assert abs(stamps[1] - created.timestamp() * 1000) < 5000
    for version, rows in snapshots.items():
        assert _rows(db.open_table("t", version=version)) == rows
        assert _rows(db.open_table("t", as_of=stamps[version])) == rows  # epoch milliseconds
        at = datetime.datetime.fromtimestamp(stamps[version] / 1000, datetime.UTC)
        assert t.checkout(as_of=at).version == version  # aware datetime
        assert t.checkout(as_of=at.replace(tzinfo=None)).version == version  # naive: UTC
    assert t.checkout(as_of=stamps[3] + 1).version == 3  # between commits: the one current then
    assert t.checkout(as_of=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).version == 6
    with pytest.raises(VersionNotFoundError):
        db.open_table("t", as_of=created - datetime.timedelta(seconds=10))  # before the table existed
    with pytest.raises(VersionNotFoundError):
        db.open_table("t", version=99)
    for bad in (0, -1):
        with pytest.raises(InvalidInputError):
            db.open_table("t", version=bad)
    for bad_type in (True, "2", 2.0):
        with pytest.raises(InvalidInputError):
            t.checkout(bad_type)  # type: ignore[arg-type]
    for bad_time in (float("nan"), "yesterday", float("inf")):
        with pytest.raises(InvalidInputError):
            t.checkout(as_of=bad_time)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        t.checkout(2, as_of=stamps[2])
    with pytest.raises(ReadOnlyTableError):
        db.open_table("t", version=2).append(batch(0, 9, 1))

    assert t.restore(3) == 7  # contents of version 3 (before the delete) as the newest version
    assert _rows(t) == snapshots[3]
    assert t.versions()[-1] | {"timestamp_ms": 0} == {
        "version": 7,
        "timestamp_ms": 0,
        "operation": "restore",
        "rows_added": 4,  # by _id: the deleted rows came back; the updated row's _id was live on both sides
        "rows_deleted": 0,
        "row_count": 10,
    }
    assert t.restore(7) == 7 and t.restore(3) == 7  # already the current contents: no new version
    assert t.restore(6) == 8 and _rows(t) == snapshots[6]  # a restore is itself undone by a restore
    t.append(batch(0, 2, 2))
    assert _rows(t.checkout(8)) == snapshots[6] and t.count_rows() == 8
    with pytest.raises(VersionNotFoundError):
        t.restore(42)
    with pytest.raises(InvalidInputError):
        t.restore("3")  # type: ignore[arg-type]
    with pytest.raises(ReadOnlyTableError):
        t.checkout(5).restore(3)
    assert t.version == 9


# -- change feed -----------------------------------------------------------------------------------------------


def _model_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The change feed from two snapshots' rows: net inserts and deletes by ``_id`` and value."""
    a = {r["_id"]: r for r in old}
    b = {r["_id"]: r for r in new}
    out = []
    for i in sorted(a.keys() | b.keys()):
        if a.get(i) == b.get(i):
            continue
        if i in a:
            out.append({"_change": "delete", **a[i]})
        if i in b:
            out.append({"_change": "insert", **b[i]})
    return out


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 6)),
        st.tuples(st.just("delete"), st.integers(0, 9)),
        st.tuples(st.just("update"), st.integers(0, 9)),
        st.tuples(st.just("optimize"), st.just(0)),
        st.tuples(st.just("restore"), st.integers(1, 30)),
        st.tuples(st.just("transaction"), st.integers(0, 9)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, seed=st.integers(0, 2**16))
def test_change_feed_equals_difference_of_snapshots(ops: list[tuple[str, int]], seed: int) -> None:
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = _small(db, max_rows_per_superfile=8)
    seq = 0
    snapshots: dict[int, list[dict[str, Any]]] = {1: []}

    def append(n: int) -> int:
        nonlocal seq
        seq += 1
        return t.append(batch(seed % 7, seq, n))

    for op, arg in ops:
        if op == "append":
            append(arg)
        elif op == "delete":
            t.delete(f"(seq + i) % 10 = {arg}")
        elif op == "update":
            hit = t.count_rows(f"i = 0 AND seq % 10 = {arg}")
            t.update(
                f"i = 0 AND seq % 10 = {arg}", batch(8, arg, hit).set_column(2, "i", pa.array([0] * hit, pa.int32()))
            )
        elif op == "optimize":
            t.optimize()
        elif op == "restore":
            t.restore(1 + arg % t.version)
        else:
            with t.transaction() as tx:  # several changes in one version
                seq += 1
                tx.append(batch(9, seq, 3))
                tx.delete(f"seq = {seq} AND i = 1 OR seq % 10 = {arg}")
        snapshots[t.version] = _rows(t)
    versions = sorted(snapshots)
    for a in versions:
        for b in versions[versions.index(a) :]:
            feed = t.changes(a, b)
            assert feed.column_names == ["_change", "_id", *SCHEMA.names]
            assert feed.to_pylist() == _model_changes(snapshots[a], snapshots[b]), (a, b)
    assert t.changes(versions[0]).num_rows == len(_model_changes([], snapshots[versions[-1]]))


def test_change_feed_reads_only_changed_superfiles_and_rejects_bad_arguments(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    t = _small(superfile.connect(uri), max_rows_per_superfile=100)
    for seq in range(20):
        t.append(batch(0, seq, 5))
    before = t.version
    t.delete("seq = 3 AND i = 4")
    t.append(batch(0, 20, 2))
    fresh = superfile.connect(uri).open_table("t")  # nothing opened or cached yet
    feed = fresh.changes(before, columns=["seq", "i"])
    assert feed.to_pylist() == [
        {"_change": "delete", "_id": 19, "seq": 3, "i": 4},
        {"_change": "insert", "_id": 100, "seq": 20, "i": 0},
        {"_change": "insert", "_id": 101, "seq": 20, "i": 1},
    ]
    snap = fresh._current()
    changed = {e.path for e in snap.entries() if e.added_version > before or e.deletes is not None}
    opened = {e.path for e in snap.entries() if fresh._files.is_open(e)}
    assert len(changed) == 2 and opened == changed  # 2 of 21 superfiles read
    assert fresh.changes(t.version, t.version).num_rows == 0
    assert t.changes(before, t.version).equals(t.changes(before))
    with pytest.raises(InvalidInputError):
        t.changes(5, 3)  # from after to
    with pytest.raises(VersionNotFoundError):
        t.changes(1, 99)
    with pytest.raises(InvalidInputError):
        t.changes(0)
    with pytest.raises(InvalidInputError):
        t.changes(True)  # type: ignore[arg-type]
    with pytest.raises(UnknownColumnError):
        t.changes(1, columns=["nope"])
    with pytest.raises(InvalidInputError):
        t.changes(1, columns="seq")  # type: ignore[arg-type]


# -- BM25 over live rows -------------------------------------------------------------------------------------


def test_bm25_ignores_deleted_rows(cranfield: pa.Table) -> None:
    """Deleted rows do not count in BM25's statistics: scores equal those of a table that never had them."""
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    a = _docs(db, "a", cranfield.schema)
    for start in range(0, 1400, 200):
        a.append(cranfield.slice(start, 200))
    a.delete("id % 3 = 0 OR id > 1300")
    ids = cranfield["id"].to_numpy()
    survivors = cranfield.filter(pa.array((ids % 3 != 0) & (ids <= 1300)))
    b = _docs(db, "b", cranfield.schema)
    b.append(survivors)
    one = _docs(db, "one", cranfield.schema)  # one superfile: the live df of a term is below the file's own
    one.append(cranfield)
    one.delete("id % 3 = 0")
    assert one.bm25_search("text", QUERIES[0], k=5).num_rows == 5  # caches the deleted rows' statistics
    one.delete("id > 1300")  # a larger deletion vector: only the newly deleted rows are analysed
    for q in [*QUERIES, "fatigue of rivets", "flutter"]:
        rb = b.bm25_search("text", q, k=15, projection=["id", "score"])
        for t in (a, one):
            ra = t.bm25_search("text", q, k=15, projection=["id", "score"])
            assert ra["id"].to_pylist() == rb["id"].to_pylist(), q
            np.testing.assert_allclose(ra["score"].to_numpy(), rb["score"].to_numpy(), rtol=1e-5)
    for q in ("flutter", "boundary layer"):
        rb = b.bm25_search("text", q, k=10, mode="all", projection=["id", "score"])
        for t in (a, one):
            assert t.bm25_search("text", q, k=10, mode="all", projection=["id", "score"])["id"] == rb["id"]
    gone = cranfield.filter(pa.array(ids == 1303))["text"][0].as_py().split()  # words of a deleted row only
    only_deleted = [
        w for w in gone if b.bm25_search("text", w, k=1).num_rows == 0 and one.bm25_search("text", w).num_rows
    ]
    assert not only_deleted


# -- idempotent appends ----------------------------------------------------------------------------------------


def test_idempotent_appends(tmp_path: Path) -> None:
    db = superfile.connect(f"file://{tmp_path}")
    t = _small(db)
    first = t.append(batch(0, 0, 3), idempotency_key="batch-0")
    assert t.append(batch(0, 0, 3), idempotency_key="batch-0") == first == 2
    assert t.append(batch(0, 99, 50), idempotency_key="batch-0") == first  # the key decides, not the rows
    assert t.version == 2 and t.count_rows() == 3 and t.idempotency_version("batch-0") == 2
    assert t.idempotency_version("never") is None
    assert t.append(batch(0, 1, 3), idempotency_key="batch-1") == 3
    for bad in ("", "x" * 257, 7, b"bytes"):
        with pytest.raises(InvalidInputError):
            t.append(batch(0, 2, 3), idempotency_key=bad)  # type: ignore[arg-type]
    assert t.version == 3 and t.count_rows() == 6  # nothing written by a rejected key
    assert t.append(batch(0, 2, 0), idempotency_key="empty") == 3  # an empty append records nothing
    assert t.idempotency_version("empty") is None
    with t.transaction() as tx:  # a repeated key skips its append only: the rest of the transaction commits
        assert tx.append(batch(0, 0, 3), idempotency_key="batch-0") == 0
        assert tx.append(batch(0, 3, 3), idempotency_key="batch-3") == 3
        assert tx.append(batch(0, 3, 3), idempotency_key="batch-3") == 0  # once per transaction too
        tx.append(batch(0, 4, 3))
    assert tx.commit_version == 4 and sorted(_batches(t).items()) == [((0, s), 3) for s in range(5) if s != 2]
    # a race: both transactions checked the key before either committed; the loser drops only that append
    one, two = t.transaction(), db.open_table("t").transaction()
    one.append(batch(0, 5, 3), idempotency_key="batch-5")
    two.append(batch(0, 5, 3), idempotency_key="batch-5")
    two.append(batch(0, 6, 3))
    two.delete("seq = 4")
    assert one.commit() == 5
    assert two.commit() == 6
    assert sorted(_batches(t).items()) == [((0, s), 3) for s in (0, 1, 3, 5, 6)]
    lone = db.open_table("t").transaction()
    lone.append(batch(0, 7, 3), idempotency_key="batch-7")
    assert t.append(batch(0, 7, 3), idempotency_key="batch-7") == 7
    assert lone.commit() == 7 and t.version == 7  # nothing left to publish: the first commit's version
    t.optimize()
    t.restore(3)  # keys stay recorded: a log consumer must not re-apply what it already did
    assert t.append(batch(0, 5, 3), idempotency_key="batch-5") == 5 and t.idempotency_version("batch-7") == 7


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "s3"])
def test_repeated_keys_across_processes_do_not_duplicate(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    uri = _uri(backend, request, tmp_path)
    t = _small(superfile.connect(uri))
    count, rows = 12, 4
    procs = [_spawn("keyed", uri, "t", str(count), str(rows)) for _ in range(3)]
    for p, _, _ in procs:
        _finish(p, 300)
    acks: dict[int, set[int]] = {}
    for _, lines, _ in procs:
        assert len(lines) == count
        for line in lines:
            _, s, v = line.split()
            acks.setdefault(int(s), set()).add(int(v))
    assert all(len(v) == 1 for v in acks.values()), acks  # every process got the first commit's version
    assert sorted(_batches(t).items()) == [((0, s), rows) for s in range(count)]
    assert t.version == 1 + count and {t.idempotency_version(f"key-{s}") for s in range(count)} == set(
        range(2, 2 + count)
    )
    assert [v for s in range(count) for v in acks[s]] == [t.idempotency_version(f"key-{s}") for s in range(count)]


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_maintenance_runs_itself_beside_the_commits(tmp_path: Path, scheme: str) -> None:
    from superfile.maintenance import CompactionPolicy, MaintenancePolicy

    uri = f"file://{tmp_path}" if scheme == "file" else f"memory://auto-{uuid.uuid4().hex}"
    policy = MaintenancePolicy(CompactionPolicy(small_files=4), cleanup_interval_s=3600, retention_s=3600)
    with superfile.connect(uri, maintenance=policy) as db:
        t = _small(db)
        for seq in range(12):
            t.append(batch(0, seq, 10))
        assert db.maintenance is not None and db.maintenance.wait_idle(120)
        counts = db.maintenance.counts
        assert counts["compactions"] >= 1 and counts["superfiles_compacted"] >= 5 and counts["errors"] == 0
        assert counts["cleanups"] == 1  # once per interval, on the first commit
        assert t.stats()["superfile_count"] <= 5 and t.count_rows() == 120
        assert sorted(t.to_arrow().column("seq").to_pylist()) == sorted(s for s in range(12) for _ in range(10))
    assert superfile.connect(uri).open_table("t").count_rows() == 120
    plain = superfile.connect(uri)
    assert plain.maintenance is None  # off unless asked for (the gateway and the builder turn it on)


def test_a_compaction_process_whose_parent_dies_while_it_starts_exits(tmp_path: Path) -> None:
    """The parent is SIGKILLed before its compaction process has finished starting (a race once left such
    processes alive for good: the process read its parent's pid after the parent was already gone)."""
    marker = f"superfile-orphan-{uuid.uuid4().hex}"
    uri = f"file://{tmp_path}"
    _small(superfile.connect(uri))
    script = (
        "import sys, threading, time\n"
        "from superfile.maintenance import CompactionPolicy, Compactor\n"
        "c = Compactor(sys.argv[1], CompactionPolicy(4))\n"
        "threading.Thread(target=c.run, args=('t',), daemon=True).start()\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, uri], env={**os.environ, "ORPHAN_MARKER": marker})

    def workers() -> list[int]:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != parent.pid:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if marker.encode() in f.read():
                            found.append(int(pid))
                except OSError:
                    continue
        return found

    deadline = time.monotonic() + 30
    while not workers():  # the compaction process exists (it is still importing)
        assert time.monotonic() < deadline, "no compaction process started"
        time.sleep(0.01)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 15
    while workers():
        assert time.monotonic() < deadline, f"compaction processes outlived their parent: {workers()}"
        time.sleep(0.1)
