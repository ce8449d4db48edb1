"""Readers of superfiles no live snapshot names are released (docs/storage.md, "Open superfiles"): after an
optimize and a cleanup replace and delete superfiles, the process maps none of the deleted files once it has
searched or committed again, in the process that ran them and in another that only reads the table (on object
storage: none of their disk-cache copies, which are removed); a search pinned on an older version still works,
and a reader in use is not closed under it. Their full-text extractions are removed after a grace period.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.format import archive
from superfile.format.reader import extraction_dir
from superfile.manifest.model import SuperfileEntry
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


def _extractions(t: Supertable, entries: list[SuperfileEntry]) -> list[Path]:
    """Where the full-text indexes of these superfiles are extracted for ``t`` (named after file and content)."""
    return [Path(extraction_dir(t.files.cache_dir, t.files.reader_name(e.path), e.footer_crc32)) for e in entries]


def _wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_extracted_indexes_of_released_superfiles_are_removed_after_a_grace_period(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streaming table makes a superfile a commit and compaction replaces them: each one's full-text
    extraction must go once no kept version names it, or the cache directory grows with every superfile the
    table ever had. Not at once: a search pinned on the previous version may still open it."""
    monkeypatch.setattr(archive, "REMOVAL_GRACE_S", 1.0)
    writer = _table_at(superfile.connect(f"file://{root}", cache_dir=str(tmp_path / "writer-cache")))
    reader = superfile.connect(f"file://{root}", cache_dir=str(tmp_path / "cache")).open_table("docs")
    _search(reader)
    old = _extractions(reader, reader.snapshot().entries())
    assert len(old) == 4 and all(p.is_dir() for p in old)
    _compact_and_clean(writer)
    _search(reader)  # the compacted version; the one before it, still kept, names the old superfiles
    writer.append(_batch(10 * BATCH))
    _search(reader)  # released now
    assert all(p.is_dir() for p in old)  # within the grace period
    assert _wait_until(lambda: not any(p.exists() for p in old))
    live = _extractions(reader, reader.snapshot().entries())
    assert all(p.is_dir() for p in live)
    _search(reader)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".stale-")]  # nothing left aside


def test_an_older_snapshot_extracts_a_removed_index_again(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index already open keeps working once its extraction is removed, and one opened afterwards (a
    time-travel search) is extracted again: the answers do not change."""
    monkeypatch.setattr(archive, "REMOVAL_GRACE_S", 0.0)
    t = _table(root)
    old = t.checkout(t.version)
    before = old.bm25_search("title", "supersonic wing", k=20)
    gone = _extractions(t, old.snapshot().entries())
    t.optimize(target_rows=4 * BATCH)
    t.append(_batch(10 * BATCH))
    _search(t)  # releases the old version's superfiles
    assert _wait_until(lambda: not any(p.exists() for p in gone))
    assert old.bm25_search("title", "supersonic wing", k=20).equals(before)
    fresh = superfile.connect(f"file://{root}").open_table("docs").checkout(old.version)
    assert fresh.bm25_search("title", "supersonic wing", k=20).equals(before)  # its readers extract them anew
    assert all(p.is_dir() for p in gone)


def test_an_extraction_removed_between_its_check_and_its_open_is_extracted_again(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal may land between a reader finding an extraction whole and tantivy opening it."""
    t = _table_at(superfile.connect(f"file://{root}", cache_dir=str(tmp_path / "cache")))
    real, raced = archive.extract, []

    def racing(blob: memoryview, path: str, source: str, *, skip: tuple[str, ...] = ()) -> list[tuple[str, int, int]]:
        files = real(blob, path, source, skip=skip)
        if not raced:
            raced.append(path)
            archive._remove(os.path.dirname(path))  # the superfile's extraction, as remove_later does
        return files

    monkeypatch.setattr(archive, "extract", racing)
    _search(t)
    assert raced and Path(raced[0]).is_dir()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_removes_its_own_releases_with_its_own_thread(tmp_path: Path) -> None:
    """A child forked while the parent's removal thread waits gets none of the parent's state (its thread
    does not exist there, its lock may be held): it starts its own, and removes what it releases."""
    parent_side, child_side = tmp_path / "parent", tmp_path / "child"
    parent_side.mkdir()
    child_side.mkdir()
    archive.remove_later([str(parent_side)], delay=3600.0)  # the parent's thread is up and waiting
    pid = os.fork()
    if pid == 0:  # the child: only archive's own code, no index or pool of the parent's
        code = 1
        try:
            archive.remove_later([str(child_side)], delay=0.0)
            if _wait_until(lambda: not child_side.exists(), timeout=10.0) and parent_side.exists():
                code = 0
        finally:
            os._exit(code)
    exited: list[int] = []

    def child_exited() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            exited.append(os.waitstatus_to_exitcode(status))
        return bool(done)

    if not _wait_until(child_exited, timeout=30.0):  # a child stuck on the parent's lock
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert exited == [0]
    assert parent_side.exists() and not child_side.exists()
