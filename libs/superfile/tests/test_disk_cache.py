"""The disk cache: superfiles of a table on S3 are read from local, memory-mapped copies within a budget."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pytest
import superfile
from superfile.errors import InvalidOptionError
from superfile.io import from_uri
from superfile.io.cache import DiskCache


def _rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "text": pa.array([f"row {i} of the cached table" for i in range(start, start + n)]),
        }
    )


def _s3_uri(endpoint: str, bucket: str) -> str:
    return f"s3://{bucket}/{uuid.uuid4().hex[:8]}?endpoint_url={quote(endpoint, safe='')}"


@pytest.fixture
def s3_table(s3_endpoint: str, s3_bucket: str) -> tuple[str, pa.Table]:
    """A table of 4 superfiles on S3 (written without a cache) and its rows."""
    uri = _s3_uri(s3_endpoint, s3_bucket)
    writer = superfile.connect(uri, cache_budget_bytes=0)
    table = writer.create_table("t", schema=_rows(0, 1).schema, fts_columns=["text"])
    for start in range(0, 400, 100):
        table.append(_rows(start, 100))
    return uri, pa.concat_tables([_rows(s, 100) for s in range(0, 400, 100)])


def _copies(cache_dir: Path) -> list[Path]:
    return sorted(p for p in (cache_dir / "superfiles").iterdir() if not p.name.endswith(".part"))


def test_remote_superfiles_are_read_from_local_copies(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    conn = superfile.connect(uri, cache_dir=str(tmp_path))
    table = conn.open_table("t")
    assert table.to_arrow(["id", "text"]).sort_by("id") == rows
    sizes = sorted(e.size for e in table._snapshot.entries())
    assert sorted(p.stat().st_size for p in _copies(tmp_path)) == sizes
    stats = table.stats()
    assert stats["cache_resident_superfiles"] == 4 and stats["cache_resident_bytes"] == sum(sizes)
    assert stats["cache_budget_bytes"] > 0
    # another connection (as another process would) opens the copies without fetching anything
    again = superfile.connect(uri, cache_dir=str(tmp_path))
    assert again.open_table("t").to_arrow(["id", "text"]).sort_by("id") == rows
    assert again._disk_cache is not None and again._disk_cache.fetches == 0
    assert conn._disk_cache is not None and conn._disk_cache.fetches == 4


def test_budget_keeps_the_most_recently_used_copies(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    sizes = [e.size for e in superfile.connect(uri, cache_budget_bytes=0).open_table("t")._snapshot.entries()]
    budget = max(sizes) * 2 + min(sizes) // 2  # room for two copies, not three
    conn = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=budget)
    table = conn.open_table("t")
    entries = sorted(table._snapshot.entries(), key=lambda e: e.id_min)
    for entry in entries:  # opened one after another: the oldest copies make room
        table._files.open(entry)
    cache = conn._disk_cache
    assert cache is not None
    files, used = cache.usage()
    assert files == 2 and used <= budget
    assert [cache.resident(table._files.storage, e.path) for e in entries] == [False, False, True, True]
    # readers opened from evicted copies keep their mapping: the whole table still reads right
    assert table.to_arrow(["id", "text"]).sort_by("id") == rows
    assert table.bm25_search("text", "row", k=5).num_rows == 5


def test_a_copy_removed_under_an_open_reader_costs_a_fetch_only(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    conn = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=1)  # every fetch evicts the rest
    table = conn.open_table("t")
    assert table.to_arrow(["id", "text"]).sort_by("id") == rows
    assert len(_copies(tmp_path)) == 1
    assert table.bm25_search("text", "cached", k=400).num_rows == 400  # full-text indexes of evicted copies still open
    fresh = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=1)
    assert fresh.open_table("t").to_arrow(["id"]).num_rows == 400
    assert fresh._disk_cache is not None and fresh._disk_cache.fetches >= 3


def test_a_damaged_copy_is_fetched_again(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    superfile.connect(uri, cache_dir=str(tmp_path)).open_table("t").to_arrow(["id"])
    victim = _copies(tmp_path)[0]
    with open(victim, "r+b") as f:  # flip a byte in the data region
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    conn = superfile.connect(uri, cache_dir=str(tmp_path))
    assert conn.open_table("t").to_arrow(["id", "text"]).sort_by("id") == rows
    assert conn._disk_cache is not None and conn._disk_cache.fetches == 1


def test_concurrent_opens_fetch_once(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, _ = s3_table
    cache = DiskCache(str(tmp_path / "c"), 1 << 30)
    storage = from_uri(uri).child("t")
    key = next(i.path for i in storage.list("data/"))
    size = storage.size(key)
    paths: list[str] = []
    threads = [threading.Thread(target=lambda: paths.append(cache.fetch(storage, key, size))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(paths) == 8 and len(set(paths)) == 1 and cache.fetches == 1
    assert Path(paths[0]).read_bytes() == storage.read(key)


def test_local_and_memory_tables_and_a_zero_budget_use_no_cache(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    off = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=0)
    assert off.open_table("t").to_arrow(["id", "text"]).sort_by("id") == rows
    assert off._disk_cache is None and not (tmp_path / "superfiles").exists()
    assert off.open_table("t").stats()["cache_budget_bytes"] == 0
    for local in (f"file://{tmp_path / 'store'}", f"memory://{uuid.uuid4().hex}"):
        assert superfile.connect(local, cache_dir=str(tmp_path))._disk_cache is None


@pytest.mark.parametrize("budget", [-1, "1GB", True, 1.5])
def test_invalid_budget_is_a_typed_error(budget: object) -> None:
    with pytest.raises(InvalidOptionError):
        superfile.connect(f"memory://{uuid.uuid4().hex}", cache_budget_bytes=budget)


def test_stale_partial_downloads_are_swept(tmp_path: Path) -> None:
    cache = DiskCache(str(tmp_path), 1 << 20)
    stale, recent = tmp_path / "x.abc.part", tmp_path / "y.def.part"
    stale.write_bytes(b"half")
    recent.write_bytes(b"half")
    os.utime(stale, (0, 0))
    cache.evict()
    assert not stale.exists() and recent.exists()
    assert cache.usage() == (0, 0)


def _rss_of(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (Linux /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if not line[:1].isupper():  # a mapping's header line ("start-end perms offset dev inode path")
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_memory_budget_advises_the_coldest_mappings_out(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    sizes = [e.size for e in superfile.connect(uri, cache_budget_bytes=0).open_table("t")._snapshot.entries()]
    budget = max(sizes) * 2 + min(sizes) // 2  # two mappings resident, not three
    conn = superfile.connect(uri, cache_dir=str(tmp_path), cache_memory_bytes=budget)
    table = conn.open_table("t")
    cache = conn._disk_cache
    assert cache is not None and cache.memory_budget_bytes == budget
    entries = sorted(table._snapshot.entries(), key=lambda e: e.id_min)
    for entry in entries:  # each open checks every byte (verify), so its whole mapping is resident
        table._files.open(entry)
    copies = [Path(cache.path(table._files.storage, e.path)) for e in entries]
    resident = [_rss_of(p) for p in copies]
    assert resident[0] == 0 and resident[1] == 0, resident  # the two least recently used: advised out
    assert resident[2] > 0 and resident[3] > 0, resident
    assert cache.advised == 2 and cache.mapped_bytes() <= budget
    # their files stayed on disk: using them again faults the pages back in, with no download
    assert table.to_arrow(["id", "text"]).sort_by("id") == rows
    assert cache.fetches == 4 and cache.mapped_bytes() <= budget
    assert sum(_rss_of(p) for p in copies) <= budget + 4 * 4096 * 16  # within a few pages of readahead


def test_invalid_memory_budget_is_a_typed_error(s3_endpoint: str, s3_bucket: str) -> None:
    with pytest.raises(InvalidOptionError):
        superfile.connect(_s3_uri(s3_endpoint, s3_bucket), cache_memory_bytes=0)


def test_large_objects_are_fetched_in_ranges(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import superfile.io.cache as cache_module

    monkeypatch.setattr(cache_module, "_WHOLE", 1000)
    monkeypatch.setattr(cache_module, "_CHUNK", 300)
    storage = from_uri(f"memory://{uuid.uuid4().hex}")
    for size in (999, 1000, 1001, 2500):
        data = os.urandom(size)
        storage.write(f"o{size}", data)
        copy = DiskCache(str(tmp_path), 1 << 20).fetch(storage, f"o{size}", size)
        assert Path(copy).read_bytes() == data


def test_a_cache_directory_that_fails_falls_back_to_memory(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    conn = superfile.connect(uri, cache_dir=str(tmp_path))
    (tmp_path / "superfiles").rmdir()
    (tmp_path / "superfiles").write_text("not a directory any more")  # every write below it now fails
    assert conn.open_table("t").to_arrow(["id", "text"]).sort_by("id") == rows
    assert conn.disk_cache is not None and conn.disk_cache.fetches == 0
    with pytest.raises(InvalidOptionError, match="cannot keep the disk cache"):
        superfile.connect(uri, cache_dir=str(tmp_path))  # a directory that cannot be made is a clear error
