"""The embedded engine end to end: commits, snapshots, deletes, updates, transactions, bad input."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import superfile
from superfile.errors import (
    ContentionError,
    CorruptSuperfileError,
    InvalidPredicateError,
    InvalidTableNameError,
    InvalidVectorError,
    NamespaceExistsError,
    ReadOnlyTableError,
    SchemaMismatchError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
    VectorDimensionError,
)
from superfile.io import from_uri
from table_worker import append_until_killed

HERE = Path(__file__).resolve().parent
CRANFIELD = HERE.parents[2] / "examples" / "data" / "cranfield" / "docs.parquet"
WORKER = HERE / "table_worker.py"


@pytest.fixture(scope="module")
def cranfield() -> pa.Table:
    return pq.read_table(CRANFIELD)


def create_docs(db: superfile.Connection, name: str, schema: pa.Schema, **kw: object) -> superfile.Supertable:
    return db.create_table(
        name,
        schema,
        fts_columns=["title", "text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
        **kw,
    )


def superfile_bytes(uri: str, table: str, path: str) -> bytes:
    return from_uri(uri).child(table).read(path)


def superfile_paths(t: superfile.Supertable) -> list[str]:
    snap = t._current()
    return [e.path for e in snap.entries()]


def test_cranfield_in_several_commits(storage_uri: str, cranfield: pa.Table, tmp_path: Path) -> None:
    db = superfile.connect(storage_uri)
    t = create_docs(db, "docs", cranfield.schema)
    versions = [t.append(cranfield.slice(a, 500)) for a in range(0, cranfield.num_rows, 500)]
    assert versions == [2, 3, 4]
    assert t.count_rows() == cranfield.num_rows
    got = t.to_arrow().sort_by("_id")
    assert got.column("_id").to_pylist() == list(range(cranfield.num_rows))
    user = got.drop_columns(["_id"])
    assert user.equals(cranfield.cast(user.schema))

    # each superfile read directly by pyarrow and DuckDB gives the table's rows (vectors live in the blob)
    direct = []
    for path in superfile_paths(t):
        local = tmp_path / Path(path).name
        local.write_bytes(superfile_bytes(storage_uri, "docs", path))
        by_arrow = pq.read_table(local)
        by_duck = duckdb.sql(f"select * from read_parquet('{local}')").arrow()
        if hasattr(by_duck, "read_all"):
            by_duck = by_duck.read_all()
        assert by_arrow.column_names == ["_id", "id", "title", "author", "source", "text"]
        assert by_duck.sort_by("_id").to_pylist() == by_arrow.sort_by("_id").to_pylist()
        direct.append(by_arrow)
    scalar = got.drop_columns(["embedding"])
    assert pa.concat_tables(direct).sort_by("_id").equals(scalar)

    if not storage_uri.startswith("memory://"):  # reopened in a new process: every row, vectors included
        dump = tmp_path / "reopened.arrow"
        script = (
            "import sys, pyarrow as pa, superfile\n"
            f"t = superfile.connect({storage_uri!r}).open_table('docs')\n"
            "rows = t.to_arrow()\n"
            f"with pa.ipc.new_file({str(dump)!r}, rows.schema) as w:\n"
            "    w.write_table(rows)\n"
            "print(t.version)\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
        assert int(out.stdout) == 4
        assert pa.ipc.open_file(dump).read_all().sort_by("_id").equals(got)


def test_snapshot_pinned_reader_keeps_its_view(cranfield: pa.Table) -> None:
    db = superfile.connect("memory://pinned-" + os.urandom(4).hex())
    t = create_docs(db, "docs", cranfield.schema)
    t.append(cranfield.slice(0, 100))
    pinned = db.open_table("docs", consistency="snapshot")
    old = db.open_table("docs", version=2)
    t.append(cranfield.slice(100, 100))
    assert pinned.count_rows() == 100 and old.count_rows() == 100
    assert db.open_table("docs").count_rows() == 200
    assert t.count_rows() == 200
    with pytest.raises(ReadOnlyTableError):
        old.append(cranfield.slice(0, 1))


def test_delete_update_transaction(cranfield: pa.Table) -> None:
    db = superfile.connect("memory://dut-" + os.urandom(4).hex())
    t = create_docs(db, "docs", cranfield.schema)
    t.append(cranfield.slice(0, 300))
    t.append(cranfield.slice(300, 300))
    v = t.delete("id <= 10 OR id > 590")
    assert t.count_rows() == 600 - 10 - 10
    assert t.count_rows("id <= 10") == 0
    replacement = cranfield.filter(pc.equal(cranfield["id"], 42)).set_column(1, "title", pa.array(["a replaced title"]))
    before_id = t.to_arrow(columns=["_id"], where="id = 42").column("_id").to_pylist()
    t.update("id = 42", replacement)
    row = t.to_arrow(where="id = 42")
    assert row.num_rows == 1 and row.column("title").to_pylist() == ["a replaced title"]
    assert row.column("_id").to_pylist() == before_id
    with pytest.raises(superfile.InvalidInputError):
        t.update("id < 50", replacement)  # count mismatch: nothing staged
    assert t.count_rows() == 580

    with t.transaction() as tx:
        tx.append(cranfield.slice(600, 50))
        tx.delete("id > 640")  # also sees the rows staged above
        tx.delete("id = 100")
    assert t.version == v + 2
    assert t.count_rows() == 580 + 40 - 1
    with pytest.raises(RuntimeError), t.transaction() as tx:
        tx.append(cranfield.slice(700, 10))
        raise RuntimeError("abort")
    assert t.count_rows() == 619 and t.version == v + 2
    assert [h["operation"] for h in t.versions()] == [
        "create",
        "append",
        "append",
        "delete",
        "update",
        "transaction",
    ]


def test_bad_input_is_typed_and_writes_nothing(tmp_path: Path, cranfield: pa.Table) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = create_docs(db, "docs", cranfield.schema)
    t.append(cranfield.slice(0, 10))
    before = sorted(i.path for i in from_uri(uri).list(""))
    good = cranfield.slice(0, 2)
    emb = good.column("embedding").to_pylist()
    cases = [
        (SchemaMismatchError, good.drop_columns(["title"]).append_column("nope", pa.array([1, 2]))),
        (SchemaMismatchError, good.set_column(0, "id", pa.array(["x", "y"]))),
        (VectorDimensionError, good.set_column(5, "embedding", pa.array([v[:10] for v in emb]))),
        (InvalidVectorError, good.set_column(5, "embedding", pa.array([[float("nan")] * 384, emb[1]]))),
        (InvalidVectorError, good.set_column(5, "embedding", pa.array([[float("inf")] * 384, emb[1]]))),
        (SchemaMismatchError, [{"id": 1, "bogus": 2}]),
    ]
    for error, data in cases:
        with pytest.raises(error):
            t.append(data)
    with pytest.raises(InvalidPredicateError):
        t.delete("id <<< 3")
    with pytest.raises(UnknownColumnError):
        t.delete("nope = 3")
    for name in ["../x", "a/b", "", ".hidden", "x" * 200]:
        with pytest.raises(InvalidTableNameError):
            db.create_table(name, cranfield.schema)
    with pytest.raises(TableExistsError):
        create_docs(db, "docs", cranfield.schema)
    with pytest.raises(TableNotFoundError):
        db.open_table("missing")
    assert sorted(i.path for i in from_uri(uri).list("")) == before
    assert t.count_rows() == 10 and t.version == 2


def test_a_namespace_created_twice_in_one_millisecond_is_refused(
    storage_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second create must not pass for the first one's retry after a lost answer (same bytes written)."""
    db = superfile.connect(storage_uri)
    monkeypatch.setattr(superfile.tables, "now_ms", lambda: 1_700_000_000_000)
    db.create_namespace("team")
    with pytest.raises(NamespaceExistsError):
        db.create_namespace("team")
    db.create_namespace("team", exist_ok=True)
    assert db.list_namespaces() == ["team"]


def test_table_catalog(storage_uri: str, cranfield: pa.Table) -> None:
    db = superfile.connect(storage_uri)
    assert db.table_names() == []
    create_docs(db, "b", cranfield.schema)
    t = create_docs(db, "a", cranfield.schema, max_rows_per_superfile=1000)
    assert db.table_names() == ["a", "b"]
    assert t.options.fts_columns == {"title": "english", "text": "english"}
    assert t.options.vector_columns["embedding"].dim == 384
    assert t.options.max_rows_per_superfile == 1000
    assert t.schema.names[0] == "_id"
    db.drop_table("b")
    assert db.table_names() == ["a"]
    with pytest.raises(TableNotFoundError):
        db.drop_table("b")


def test_finding_tables_lists_no_table_files(cranfield: pa.Table, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder looks for new tables every few seconds: that costs one listing of the root's folder names,
    not a listing of every table's superfiles and manifests."""
    from superfile.io.memory import MemoryStorage

    uri = "memory://finding-tables"
    db = superfile.connect(uri)
    for name in ("b", "a"):
        create_docs(db, name, cranfield.schema).append(cranfield.slice(0, 5))
    root = from_uri(uri)
    root.write("stray/notes.txt", b"not a table")  # a folder without a pointer
    root.write("odd name!/_pointer.json", b"{}")  # not a table name: never looked up

    def no_listing(self: MemoryStorage, prefix: str = "") -> Any:
        raise AssertionError(f"listed every object under {prefix!r}")

    monkeypatch.setattr(MemoryStorage, "list", no_listing)
    assert db.table_names() == ["a", "b"]


def _run_workers(uri: str, workers: int, appends: int, rows: int) -> list[str]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "append", uri, "t", str(w), str(appends), str(rows)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    acks = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        acks.extend(line for line in out.splitlines() if line.startswith("ack"))
    return acks


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_concurrent_appends_lose_nothing(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if backend == "file":
        uri = f"file://{tmp_path}"
    else:
        from urllib.parse import quote

        endpoint = request.getfixturevalue("s3_endpoint")
        uri = f"s3://{request.getfixturevalue('s3_bucket')}/c?endpoint_url={quote(endpoint, safe='')}"
    db = superfile.connect(uri)
    db.create_table(
        "t",
        pa.schema([("worker", pa.int32()), ("seq", pa.int32()), ("text", pa.string())]),
        fts_columns=["text"],
    )
    acks = _run_workers(uri, workers=4, appends=25, rows=3)
    assert len(acks) == 100
    t = db.open_table("t")
    rows = t.to_arrow()
    assert rows.num_rows == 300
    assert len(set(rows.column("_id").to_pylist())) == 300
    pairs = {(w, s) for w, s in zip(rows.column("worker").to_pylist(), rows.column("seq").to_pylist(), strict=True)}
    assert pairs == {(w, s) for w in range(4) for s in range(25)}
    assert t.version == 101
    assert sorted(int(a.split()[3]) for a in acks) == list(range(2, 102))


@pytest.mark.parametrize("attempts", [1, 3])
@pytest.mark.parametrize("wins", [True, False])
def test_contention_beyond_retry_bound_raises(tmp_path: Path, attempts: int, wins: bool) -> None:
    """A rival commit lands right before each of a transaction's pointer swaps: each costs it one attempt
    (it rebuilds on the newer manifest and retries); one rival more than it has attempts raises."""
    uri = f"file://{tmp_path}"
    t = superfile.connect(uri).create_table("t", pa.schema([("x", pa.int64())]), commit_max_attempts=attempts)
    other = superfile.connect(uri).open_table("t")  # its own connection: its own manifest store
    rivals = attempts - 1 if wins else attempts
    tx = t.transaction()
    tx.append({"x": [0]})
    store = t._files.manifests
    swap = store.swap_pointer
    published: list[int] = []

    def rival_then_swap(*args: Any, **kwargs: Any) -> None:
        if len(published) < rivals:
            published.append(other.append({"x": [len(published) + 1]}))
        swap(*args, **kwargs)

    store.swap_pointer = rival_then_swap  # type: ignore[method-assign]
    if wins:
        assert tx.commit() == rivals + 2  # version 1 created the table
    else:
        with pytest.raises(ContentionError, match=f"{attempts} times"):
            tx.commit()
    rows = sorted(superfile.connect(uri).open_table("t").to_arrow().column("x").to_pylist())
    assert rows == [*range(0 if wins else 1, rivals + 1)]  # the transaction's row 0 wholly or not at all
    assert len(published) == rivals


def test_sigkill_during_commits_leaves_a_committed_table(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    db.create_table(
        "t",
        pa.schema([("worker", pa.int32()), ("seq", pa.int32()), ("text", pa.string())]),
        fts_columns=["text"],
    )
    rng = random.Random(7)
    acked: set[tuple[int, int]] = set()
    for trial in range(20):
        acked |= {(trial, seq) for seq in append_until_killed("append", uri, "t", trial, 7, rng.uniform(0, 0.3))}
        t = superfile.connect(uri).open_table("t")
        rows = t.to_arrow()
        batches: dict[tuple[int, int], int] = {}
        for w, s in zip(rows.column("worker").to_pylist(), rows.column("seq").to_pylist(), strict=True):
            batches[(w, s)] = batches.get((w, s), 0) + 1
        assert all(n == 7 for n in batches.values()), "a partial commit is visible"
        assert acked <= set(batches), "an acknowledged commit was lost"
        assert t.count_rows() == rows.num_rows == t.versions()[-1]["row_count"]


def test_checksum_error_names_the_file(tmp_path: Path, cranfield: pa.Table) -> None:
    uri = f"file://{tmp_path}"
    t = create_docs(superfile.connect(uri), "docs", cranfield.schema)
    t.append(cranfield.slice(0, 200))
    (path,) = superfile_paths(t)
    file = tmp_path / "docs" / path
    data = bytearray(file.read_bytes())
    rng = random.Random(3)
    pos = rng.randrange(100, len(data) - 100)
    data[pos] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(CorruptSuperfileError) as err:
        superfile.connect(uri).open_table("docs").to_arrow(columns=["_id"])
    assert path in str(err.value)
    unverified = superfile.connect(uri, verify_checksums=False).open_table("docs")
    assert unverified.stats()["row_count"] == 200
    unverified._current().files.open(unverified._current().entries()[0])  # opens without verification


def test_lazy_manifest_parts_are_not_all_read(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = db.create_table("t", pa.schema([("x", pa.int64())]), manifest_part_max_entries=2, manifest_eager_max_parts=3)
    for i in range(20):
        t.append({"x": list(range(i * 10, i * 10 + 10))})
    fresh = superfile.connect(uri).open_table("t")
    stats = fresh.stats()
    assert stats["manifest_parts"] == 10 and stats["superfile_count"] == 20
    assert stats["manifest_parts_fetched"] == 0  # opening read the manifest list only
    assert fresh.to_arrow(where="_id >= 190").column("x").to_pylist() == list(range(190, 200))
    assert fresh.stats()["manifest_parts_fetched"] == 1  # part-level pruning on the _id range
    assert fresh.count_rows("x < 1000") == 200
    assert fresh.stats()["manifest_parts_fetched"] == 10
    eager = db.create_table("e", pa.schema([("x", pa.int64())]), manifest_part_max_entries=2)
    for i in range(6):
        eager.append({"x": [i]})
    assert superfile.connect(uri).open_table("e").stats()["manifest_parts_fetched"] == 3


@pytest.mark.parametrize(
    ("partition", "expected_parts"),
    [("region", 3), ({"column": "region", "transform": "bucket[4]"}, None), ({"column": "ts", "transform": "day"}, 4)],
)
def test_partitioned_table(partition: object, expected_parts: int | None) -> None:
    import datetime

    from superfile.commit.shard import partition_keys
    from superfile.options import PartitionSpec

    db = superfile.connect("memory://part-" + os.urandom(4).hex())
    schema = pa.schema([("region", pa.string()), ("ts", pa.timestamp("us")), ("x", pa.int64())])
    t = db.create_table("t", schema, partition=partition)
    day0 = datetime.datetime(2026, 1, 1)
    rows = [
        {"region": ["eu", "us", "ap"][i % 3], "ts": day0 + datetime.timedelta(hours=18 * i), "x": i} for i in range(6)
    ]
    t.append(rows)
    t.append(rows)
    if expected_parts is None:
        expected_parts = len(
            set(partition_keys(pa.chunked_array([["eu", "us", "ap"]]), PartitionSpec("region", "bucket[4]")))
        )
    snap = t._current()
    entries = snap.entries()
    keys = {e.partition for e in entries}
    assert len(keys) == expected_parts == len({p.partition for p in snap.manifest.parts})
    for e in entries:  # every superfile holds one partition only
        got = snap.read_rows(e, snap.live_offsets(e), ["region", "ts"])
        if partition == "region":
            assert set(got.column("region").to_pylist()) == {e.partition}
    assert sorted(t.to_arrow(columns=["x"]).column("x").to_pylist()) == sorted(list(range(6)) * 2)
    assert t.options.partition is not None
    if partition == "region":
        assert len(snap.entries(snap_predicate(t, "region = 'eu'"))) == 2
    t.delete("x = 1")
    assert t.count_rows() == 10


def snap_predicate(t: superfile.Supertable, where: str) -> object:
    from superfile.expressions import parse_predicate

    return parse_predicate(where, t.schema)


def test_consistency_policies(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    schema = pa.schema([("x", pa.int64())])
    writer = db.create_table("t", schema)
    strong = superfile.connect(uri).open_table("t")
    bounded = superfile.connect(uri).open_table("t", consistency="bounded")
    pinned = superfile.connect(uri).open_table("t", consistency="snapshot")
    assert bounded.options.max_staleness_s == 1.0
    writer.append({"x": [1, 2]})
    assert strong.count_rows() == 2  # strong: every read resolves the pointer
    assert pinned.count_rows() == 0  # snapshot: stays where it opened
    deadline = time.monotonic() + 10
    while bounded.count_rows() != 2:  # bounded: catches up within max_staleness_s
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pinned.append({"x": [3]})  # its own write advances the pinned handle
    assert pinned.count_rows() == 3


def test_a_handle_serves_the_newest_snapshot_only_when_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``newest`` looks ahead without moving the handle; ``serve`` moves it and renews a bounded handle's
    staleness clock, never backwards; a ``snapshot`` handle follows neither; a strong read that meets the
    snapshot ``newest`` loaded does not load its manifest again."""
    uri = f"file://{tmp_path}"
    schema = pa.schema([("x", pa.int64())])
    writer = superfile.connect(uri).create_table("t", schema, max_staleness_s=3600.0)
    writer.append({"x": [1]})
    bounded = superfile.connect(uri).open_table("t", consistency="bounded")
    pinned = superfile.connect(uri).open_table("t", consistency="snapshot")
    assert bounded.count_rows() == 1 and bounded.consistency == "bounded" and pinned.consistency == "snapshot"
    old = bounded.snapshot()
    writer.append({"x": [2, 3]})
    assert bounded.count_rows() == 1  # within its hour of staleness: no pointer read
    newest, checked = bounded.newest()
    assert newest.version == writer.version and bounded.count_rows() == 1  # looked ahead, not moved
    bounded.serve(newest, checked)
    assert bounded.count_rows() == 3 and bounded.snapshot() is newest
    bounded.serve(old, time.monotonic())  # an older snapshot does not move it back
    assert bounded.count_rows() == 3
    assert pinned.newest()[0].version == old.version
    pinned.serve(newest, time.monotonic())
    assert pinned.count_rows() == 1

    strong = superfile.connect(uri).open_table("t")
    assert strong.count_rows() == 3
    writer.append({"x": [4]})
    newest, _ = strong.newest()
    loads: list[str] = []
    load_list = strong.files.manifests.load_list
    monkeypatch.setattr(strong.files.manifests, "load_list", lambda path: loads.append(path) or load_list(path))
    assert strong.count_rows() == 4 and strong.snapshot() is newest and loads == []


def test_write_buffer_flushes_but_commits_once(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = db.create_table("t", pa.schema([("x", pa.int64()), ("s", pa.string())]), write_buffer_bytes=4096)
    store = from_uri(uri).child("t")
    with t.transaction() as tx:
        for i in range(5):
            tx.append({"x": list(range(i * 200, i * 200 + 200)), "s": ["y" * 20] * 200})
        flushed = [i.path for i in store.list("data/")]
        assert len(flushed) >= 4  # built and uploaded early to bound the buffer ...
        assert superfile.connect(uri).open_table("t").count_rows() == 0  # ... and still invisible
    assert t.version == 2 and t.count_rows() == 1000


def test_shards_do_not_depend_on_caller_batching() -> None:
    schema = pa.schema([("x", pa.int64())])
    one = fresh_table("one", schema, max_rows_per_superfile=300)
    one.append({"x": list(range(1000))})
    many = fresh_table("many", schema, max_rows_per_superfile=300)
    with many.transaction() as tx:
        for i in range(0, 1000, 7):
            tx.append({"x": list(range(i, min(i + 7, 1000)))})
    sizes = [sorted(e.rows for e in t._current().entries()) for t in (one, many)]
    assert sizes[0] == sizes[1] == [250, 250, 250, 250]


def fresh_table(name: str, schema: pa.Schema, **options: object) -> superfile.Supertable:
    return superfile.connect(f"memory://{name}-{os.urandom(4).hex()}").create_table("t", schema, **options)


def test_cold_part_is_fetched_once_by_concurrent_readers(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    uri = f"file://{tmp_path}"
    t = superfile.connect(uri).create_table("t", pa.schema([("x", pa.int64())]), manifest_part_max_entries=2)
    for i in range(20):
        t.append({"x": [i]})
    cold = superfile.connect(uri).open_table("t")
    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(lambda _: cold.count_rows("x >= 0"), range(16)))
    assert counts == [20] * 16
    assert cold.stats()["manifest_parts_fetched"] == 10  # each of the 10 parts fetched once, not 16 times


def test_where_through_indexes_equals_scan() -> None:
    import datetime

    from superfile.expressions import parse_predicate

    rng = random.Random(11)
    n = 3000
    data = pa.table(
        {
            "label": [rng.choice(["cat", "dog", "eel", None]) for _ in range(n)],
            "x": [rng.randrange(-50, 50) if rng.random() > 0.05 else None for _ in range(n)],
            "f": [rng.random() * 10 for _ in range(n)],
            "flag": [rng.random() < 0.3 for _ in range(n)],
            "ts": [datetime.datetime(2026, 1, 1) + datetime.timedelta(minutes=rng.randrange(10**6)) for _ in range(n)],
            "body": [rng.choice(["alpha beta", "beta gamma", "gamma", None]) for _ in range(n)],
        }
    )
    schema = data.schema
    indexed = fresh_table("idx", schema, fts_columns=["body"], max_rows_per_superfile=1000)
    kinds = {c: "none" for c in ["label", "x", "f", "flag", "ts"]}
    scanned = fresh_table("scan", schema, fts_columns=["body"], scalar_indexes=kinds, max_rows_per_superfile=1000)
    for t in (indexed, scanned):
        t.append(data)
        t.delete("x = 7 OR label = 'eel' AND flag")
    snap = indexed._current()
    entry = snap.entries()[0]
    assert {"idx/label", "idx/x", "idx/f", "idx/flag", "idx/ts"} <= set(snap.files.open(entry).sections)
    kept = data.filter(
        pc.invert(pc.fill_null(parse_predicate("x = 7 OR label = 'eel' AND flag", schema).evaluate(data), False))
    )
    predicates = [
        "label = 'cat'",
        "label IN ('dog', 'eel') AND x > 10",
        "x BETWEEN -5 AND 5 OR flag",
        "x IS NULL",
        "label IS NOT NULL AND f < 2.5",
        "ts >= TIMESTAMP '2026-06-01 00:00:00'",
        "body = 'beta gamma'",
        "body IN ('gamma', 'alpha beta') AND NOT flag",
        "x != 3 AND label <> 'dog'",
        "NOT (x < 0)",
    ]
    for where in predicates:
        want = sorted(kept.filter(parse_predicate(where, schema).evaluate(kept)).column("f").to_pylist())
        assert sorted(indexed.to_arrow(columns=["f"], where=where).column("f").to_pylist()) == want, where
        assert sorted(scanned.to_arrow(columns=["f"], where=where).column("f").to_pylist()) == want, where
