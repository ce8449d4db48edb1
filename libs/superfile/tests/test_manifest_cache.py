"""A long-running process holds the decoded manifest parts and deletion vectors of the table's two kept versions
only (``TableFiles.pinned``), not one per version it read: every small commit rewrites the open part under a new
name, and a reader that cached each one grew with the table's history (BENCHMARKS.md, "Soak"). A handle on an
older version still reads its parts, fetched again.
"""

from __future__ import annotations

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
    kept: list[Snapshot] = []
    for i in range(COMMITS):
        writer.append(_batch(i * 20))
        if i % 10 == 9:
            writer.delete(f"key = {i * 20}")  # a deletion vector, replaced by the next delete
        kept = [*kept[-1:], reader.snapshot()]
        assert kept[-1].version == writer.version
        assert reader.bm25_search("title", "wing", k=3).num_rows == 3
        assert reader.count_rows() == (i + 1) * 20 - (i + 1) // 10
    parts, deletes = _named(kept)
    assert len(parts) < 10 < COMMITS
    assert _cached_parts(reader) <= parts
    assert _cached_deletes(reader) <= deletes
    writer_kept = [writer.checkout(writer.version - 1).snapshot(), writer.snapshot()]
    parts, deletes = _named(writer_kept)
    assert _cached_parts(writer) <= parts
    assert _cached_deletes(writer) <= deletes


def test_older_version_reads_released_parts_again(tmp_path: Path) -> None:
    uri = (tmp_path / "db").as_uri()
    t = superfile.connect(uri).create_table("t", SCHEMA)
    t.append(_batch(0))
    old = t.checkout(t.version)
    for i in range(1, 10):
        t.append(_batch(i * 20))
    old_parts = {p.path for p in old.snapshot().manifest.parts}
    assert not old_parts & _cached_parts(t)  # released: no kept version names them
    assert old.count_rows() == 20
    assert old.to_arrow().column("key").to_pylist() == list(range(20))
    assert t.count_rows() == 200
