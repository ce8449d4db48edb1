"""A long-running process holds the decoded manifest parts of the table's newest versions only (the two kept and
the snapshots still alive, ``TableFiles.pinned``), not one per version it read: every small commit rewrites the
open part under a new name, and a reader that cached each one grew with the table's history (BENCHMARKS.md,
"Soak"). A writer keeps no part of a version it only rebased on. A handle on an older version keeps its parts while
it lives.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pyarrow as pa
import superfile
from superfile.table import Supertable
from superfile.table.snapshot import Snapshot

DIM = 8
SCHEMA = pa.schema(
    [pa.field("key", pa.int64()), pa.field("title", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM), False)]
)
COMMITS = 60


def _batch(start: int, rows: int = 20) -> pa.Table:
    rng = np.random.default_rng(start)
    return pa.table(
        {
            "key": pa.array(np.arange(start, start + rows), pa.int64()),
            "title": [f"wing flow doc{i}" for i in range(start, start + rows)],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=rows * DIM).astype(np.float32)), DIM),
        },
        schema=SCHEMA,
    )


def _cached_parts(t: Supertable) -> set[str]:
    return {key.rsplit("#", 1)[0] for key in t.files.manifests._parts}


def _cached_deletes(t: Supertable) -> set[str]:
    return set(t.files.manifests._deletes)


def _named(snapshots: list[Snapshot]) -> tuple[set[str], set[str]]:
    """The parts and the deletion vectors ``snapshots`` name."""
    parts = {p.path for s in snapshots for p in s.manifest.parts}
    deletes = {e.deletes.path for s in snapshots for e in s.entries() if e.deletes is not None}
    return parts, deletes


def test_long_running_reader_caches_recent_versions_only(tmp_path: Path) -> None:
    uri = (tmp_path / "db").as_uri()
    writer = superfile.connect(uri).create_table(
        "t", SCHEMA, fts_columns=["title"], vector_columns={"vec": {"dim": DIM}}
    )
    reader = superfile.connect(uri).open_table("t")  # its own catalog: its own manifest store, as another process
    assert reader.files is not writer.files
    for i in range(COMMITS):
        writer.append(_batch(i * 20))
        if i % 10 == 9:
            writer.delete(f"key = {i * 20}")  # a deletion vector, replaced by the next delete
        assert reader.bm25_search("title", "wing", k=3).num_rows == 3
        assert reader.count_rows() == (i + 1) * 20 - (i + 1) // 10
        assert reader.version == writer.version
    for t in (reader, writer):
        parts, deletes = _cached_parts(t), _cached_deletes(t)
        # the two kept versions, and the one before them: a snapshot of it (the search state's) was still alive
        # when the newest version was pinned
        named_parts, named_deletes = _named([t.checkout(t.version - n).snapshot() for n in (2, 1, 0)])
        assert len(named_parts) < 10 < COMMITS
        assert parts <= named_parts, t
        assert deletes <= named_deletes, t


def test_live_snapshot_keeps_its_parts_until_dropped(tmp_path: Path) -> None:
    uri = (tmp_path / "db").as_uri()
    t = superfile.connect(uri).create_table("t", SCHEMA)
    t.append(_batch(0))
    old = t.checkout(t.version)
    old_parts = {p.path for p in old.snapshot().manifest.parts}
    for i in range(1, 10):
        t.append(_batch(i * 20))
    assert old_parts <= _cached_parts(t)  # a live snapshot names them
    assert old.count_rows() == 20
    assert old.to_arrow().column("key").to_pylist() == list(range(20))
    del old
    gc.collect()
    t.append(_batch(200))
    t.append(_batch(220))
    assert not old_parts & _cached_parts(t)
    assert t.count_rows() == 240


def test_parts_of_lost_races_are_not_kept(tmp_path: Path) -> None:
    """Two writers in two catalogs append in turn: each rebases on the other's versions, which it never makes a
    snapshot of, and loses some races; neither keeps the parts of those versions."""
    uri = (tmp_path / "db").as_uri()
    a = superfile.connect(uri).create_table("t", SCHEMA)
    b = superfile.connect(uri).open_table("t")
    for i in range(30):
        (a if i % 2 else b).append(_batch(i * 20))
    for t in (a, b):
        t.count_rows()  # a snapshot of the newest version
        named = {p.path for pin in t.files._recent for p in pin.manifest.parts}
        assert len(_cached_parts(t) - named) <= 2, t  # at most a part of its own last commit's attempts
    assert a.count_rows() == 600


def test_writer_keeps_the_json_of_its_latest_parts_entries_only(tmp_path: Path) -> None:
    """A writer that rebases over another catalog's compactions (the builder over its compaction process) encodes
    the entries of parts it did not write; their JSON, and the entries with it, are kept only while one of the
    parts it wrote last (the ones its next commits extend or rewrite) holds them. They were kept up to the
    cache's 4,096 entries, one or two more per commit: the soak's builder grew by about 31 KB a commit."""
    uri = (tmp_path / "db").as_uri()
    writer = superfile.connect(uri).create_table("t", SCHEMA)
    compactor = superfile.connect(uri).open_table("t")  # its own catalog and manifest store, as another process
    commits = 100
    for i in range(commits):
        writer.append(_batch(i * 20))
        if i % 10 == 9:
            compactor.optimize()
    writer.append(_batch(commits * 20))
    store = writer.files.manifests
    encoded = [entry for entry, _ in store._encoded.values()]
    recent = {e.path for n in range(8) for e in writer.checkout(writer.version - n).snapshot().entries()}
    assert len(encoded) <= 2 * len(recent) + 16 < commits, len(encoded)  # was one more per commit
    assert writer.count_rows() == (commits + 1) * 20
