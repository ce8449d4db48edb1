"""Readers of superfiles no live snapshot names are released (docs/storage.md, "Open superfiles"): after an
optimize and a cleanup replace and delete superfiles, the process maps none of the deleted files once it has
searched or committed again, in the process that ran them and in another that only reads the table (on object
storage: none of their disk-cache copies, which are removed); a search pinned on an older version still works,
and a reader in use is not closed under it.
"""

from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.table import Supertable
from superfile.table import evolve as evolve_module

DIM = 32
WORDS = ["boundary", "layer", "supersonic", "flutter", "wing", "shock", "wave", "heat", "flow", "plate"]
SCHEMA = pa.schema(
    [pa.field("key", pa.int64()), pa.field("title", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM), False)]
)
BATCH = 3000  # rows an append: superfiles of ~0.5 MB, memory-mapped (past READ_WHOLE_BYTES)


@pytest.fixture(autouse=True)
def no_background(monkeypatch: pytest.MonkeyPatch) -> None:
    """No index-creation rewrite runs behind a test's back."""
    monkeypatch.setattr(evolve_module, "index_in_background", lambda table: None)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "db"


def _batch(start: int) -> pa.Table:
    rng = np.random.default_rng(start)
    titles = [" ".join(rng.choice(WORDS, 4)) + f" doc{i}" for i in range(start, start + BATCH)]
    vecs = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    return pa.table(
        {
            "key": pa.array(np.arange(start, start + BATCH), pa.int64()),
            "title": titles,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM),
        },
        schema=SCHEMA,
    )


def _search(t: Supertable) -> None:
    """Every search kind that opens readers and builds per-snapshot state (unions, analyses)."""
    assert t.bm25_search("title", "supersonic wing", k=5).num_rows == 5
    assert t.vector_search("vec", np.ones(DIM, np.float32), k=5).num_rows == 5
    assert t.count_rows("key >= 10") > 0


def deleted_mapped(under: Path) -> dict[str, int]:
    """Bytes (the mappings' sizes) of deleted files under ``under`` this process still maps, per file
    (``/proc/self/smaps``)."""
    found: dict[str, int] = {}
    current: str | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            name = head[5] if len(head) == 6 else ""
            current = name if name.endswith("(deleted)") and name.startswith(str(under)) else None
        elif current is not None and line.startswith("Size:"):
            found[current] = found.get(current, 0) + int(line.split()[1]) * 1024
    return found


def _table(root: Path) -> Supertable:
    return _table_at(superfile.connect(f"file://{root}"))


def _table_at(db: superfile.Connection) -> Supertable:
    t = db.create_table(
        "docs",
        SCHEMA,
        fts_columns=["title"],
        vector_columns={"vec": {"dim": DIM, "metric": "cosine"}},
        level0_max_rows=0,  # every append indexed: the unions are built over them
    )
    for i in range(4):
        t.append(_batch(i * BATCH))
    return t


def _compact_and_clean(t: Supertable) -> int:
    """Replace every superfile (optimize) and delete the old ones (cleanup, no retention); files removed."""
    assert t.optimize(target_rows=4 * BATCH)["superfiles_removed"] == 4
    removed = t.cleanup(datetime.timedelta(0), safety_margin=datetime.timedelta(0))
    assert removed["removed"]["superfiles"] == 4
    return int(removed["files_removed"])


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
def test_the_process_that_compacts_and_cleans_up_unmaps_the_deleted_superfiles(root: Path) -> None:
    t = _table(root)
    _search(t)
    assert not deleted_mapped(root)
    _compact_and_clean(t)
    _search(t)
    gc.collect()  # nothing may depend on it: checked before and after
    assert deleted_mapped(root) == {}


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
def test_a_reader_that_never_wrote_unmaps_them_once_a_newer_version_no_longer_names_them(root: Path) -> None:
    writer = _table(root)
    reader = superfile.connect(f"file://{root}").open_table("docs")  # its own files and readers, as a gateway
    _search(reader)
    _compact_and_clean(writer)
    _search(reader)  # the compacted version; the version before it still names the old superfiles
    writer.append(_batch(10 * BATCH))
    _search(reader)  # a version whose previous one does not name them either
    assert deleted_mapped(root) == {}
    gc.collect()
    assert deleted_mapped(root) == {}


def test_an_older_snapshot_still_reads_and_a_reader_in_use_is_not_closed(root: Path) -> None:
    t = _table(root)
    old = t.checkout(t.version)
    _search(old)
    entry = old.snapshot().entries()[0]
    in_use = old.snapshot().open(entry)  # held across the release, as a running search holds it
    t.optimize(target_rows=4 * BATCH)
    t.append(_batch(10 * BATCH))
    _search(t)  # released: the old version's superfiles are in neither of the two newest
    assert not t.files.is_open(entry)
    assert in_use.read(["key"]).num_rows == entry.rows
    _search(old)  # reopened while the files exist
    assert old.count_rows() == 4 * BATCH
    assert t.count_rows() == 5 * BATCH


def mapped_files(under: Path) -> set[str]:
    """Files under ``under`` this process maps, deleted or not (``/proc/self/maps``)."""
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(str(under)):
            found.add(parts[5].removesuffix(" (deleted)"))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_on_object_storage_the_disk_cache_copies_of_released_superfiles_are_unmapped_and_removed(
    s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/db?endpoint_url={quote(s3_endpoint, safe='')}"
    cache = tmp_path / "cache"
    writer = _table_at(superfile.connect(uri, cache_dir=str(tmp_path / "writer-cache")))
    reader = superfile.connect(uri, cache_dir=str(cache)).open_table("docs")  # as the gateway: its own cache
    _search(reader)
    old = {e.path for e in reader.snapshot().entries()}
    assert mapped_files(cache)
    _compact_and_clean(writer)
    _search(reader)  # the compacted version: the one before it, still kept, names the old superfiles
    writer.append(_batch(10 * BATCH))
    _search(reader)
    files, disk = reader.files, reader.files.disk_cache
    assert disk is not None
    live = {disk.path(files.storage, e.path) for e in reader.snapshot().entries()}
    assert mapped_files(Path(disk.directory)) <= live
    assert not any(os.path.exists(disk.path(files.storage, path)) for path in old)
    # nor the index files extracted from them (named after the superfile) under the cache directory
    names = {Path(path).name for path in old}
    assert not [f for f in mapped_files(cache) if any(name in f for name in names)]
