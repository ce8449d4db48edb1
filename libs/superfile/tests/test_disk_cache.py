"""The disk cache: superfiles of a table on S3 are read from local, memory-mapped copies within a budget."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np
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
    assert again.disk_cache is not None and again.disk_cache.fetches == 0
    assert conn.disk_cache is not None and conn.disk_cache.fetches == 4


def test_budget_keeps_the_most_recently_used_copies(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    sizes = [e.size for e in superfile.connect(uri, cache_budget_bytes=0).open_table("t")._snapshot.entries()]
    budget = max(sizes) * 2 + min(sizes) // 2  # room for two copies, not three
    conn = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=budget)
    table = conn.open_table("t")
    entries = sorted(table._snapshot.entries(), key=lambda e: e.id_min)
    for entry in entries:  # opened one after another: the oldest copies make room
        table._files.open(entry)
    cache = conn.disk_cache
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
    assert fresh.disk_cache is not None and fresh.disk_cache.fetches >= 3


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
    assert conn.disk_cache is not None and conn.disk_cache.fetches == 1


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


def test_copies_arriving_at_once_are_mapped_and_the_last_one_stays(tmp_path: Path) -> None:
    """Each arrival makes room by evicting the others. Four downloads finishing together must neither evict a
    copy before its reader maps it (the reader would fall back to memory, as seen in CI) nor each
    evict the rest, leaving none: every reader gets its mapping, and one copy stays within a budget of one."""
    storage = from_uri(f"memory://{uuid.uuid4().hex}")
    blobs = {f"k{i}": os.urandom(1000 + i) for i in range(4)}
    for key, blob in blobs.items():
        storage.write(key, blob)
    cache = DiskCache(str(tmp_path / "superfiles"), 1)
    together = threading.Barrier(len(blobs), timeout=30)
    read = storage.read

    def read_together(key: str) -> bytes:
        data = read(key)
        together.wait()  # every download finishes at once
        return data

    storage.read = read_together  # type: ignore[method-assign]
    opened: dict[str, bytes] = {}

    def open_one(key: str) -> None:
        _, mapped = cache.open(storage, key, len(blobs[key]))
        opened[key] = mapped.to_pybytes()

    for _ in range(5):  # bounded: each round races four arrivals
        for path in _copies(tmp_path):
            path.unlink()
        opened.clear()
        threads = [threading.Thread(target=open_one, args=(key,)) for key in blobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert opened == blobs
        assert len(_copies(tmp_path)) == 1


def test_local_and_memory_tables_and_a_zero_budget_use_no_cache(s3_table: tuple[str, pa.Table], tmp_path: Path) -> None:
    uri, rows = s3_table
    off = superfile.connect(uri, cache_dir=str(tmp_path), cache_budget_bytes=0)
    assert off.open_table("t").to_arrow(["id", "text"]).sort_by("id") == rows
    assert off.disk_cache is None and not (tmp_path / "superfiles").exists()
    assert off.open_table("t").stats()["cache_budget_bytes"] == 0
    for local in (f"file://{tmp_path / 'store'}", f"memory://{uuid.uuid4().hex}"):
        assert superfile.connect(local, cache_dir=str(tmp_path)).disk_cache is None


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
    cache = conn.disk_cache
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


def test_a_copy_checked_while_an_eviction_lists_keeps_its_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each download ends in an eviction pass, which lists the directory and then forgets the checks of the
    copies that are gone. A copy that arrived (from another process) and was checked by a thread here after that
    listing is not gone: it keeps its check, so its next reopen is not checked whole again (a race seen in CI:
    four superfiles opened by two threads, one of them reopened and hashed whole)."""
    import superfile.io.cache as cache_module

    storage = from_uri(f"memory://{uuid.uuid4().hex}")
    for key in ("a", "b", "gone"):
        storage.write(key, os.urandom(100))
    cache = DiskCache(str(tmp_path), 1 << 20)
    gone = cache.fetch(storage, "gone", 100)
    cache.mark_verified(gone)
    os.unlink(gone)  # another process evicted it
    listed = os.scandir

    def scandir(path: str) -> list[os.DirEntry[str]]:
        entries = list(listed(path))
        monkeypatch.setattr(cache_module.os, "scandir", listed)
        Path(cache.path(storage, "b")).write_bytes(storage.read("b"))  # another process, after the listing ...
        cache.mark_verified(cache.fetch(storage, "b", 100))  # ... and a thread here opens and checks it
        return entries

    a = cache.fetch(storage, "a", 100)
    monkeypatch.setattr(cache_module.os, "scandir", scandir)
    cache.evict(keep=a)
    b = cache.path(storage, "b")
    assert cache.verified(b), "the copy checked after the listing lost its check"
    assert gone not in cache._verified, "a copy gone before the listing is still remembered"


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


CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield" / "docs.parquet"


@pytest.fixture
def s3_vector_table(s3_endpoint: str, s3_bucket: str) -> tuple[str, int]:
    """Cranfield (text, 384-d vectors, a bitmap-indexed label) five times over, in 4 superfiles of a few
    MiB each on S3; the URI and the superfiles' total size."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    docs = pq.read_table(CRANFIELD, columns=["id", "title", "text", "embedding"])
    rows = pa.concat_tables([docs] * 5)
    rows = rows.set_column(0, "id", pa.array(range(rows.num_rows), pa.int64()))
    rows = rows.append_column("label", pc.cast(pc.bit_wise_and(rows["id"], 7), pa.string()))
    uri = _s3_uri(s3_endpoint, s3_bucket)
    table = superfile.connect(uri, cache_budget_bytes=0).create_table(
        "v",
        schema=rows.schema,
        fts_columns=["text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
        max_rows_per_superfile=rows.num_rows // 4,
    )
    table.append(rows)
    return uri, sum(e.size for e in table._snapshot.entries())


def _answers(db: superfile.Connection) -> list[pa.Table]:
    t = db.open_table("v")
    q = pa.array(np.linspace(-1, 1, 384, dtype=np.float32))
    return [
        t.bm25_search("text", "supersonic boundary layer", k=10, projection=["id", "title"]),
        t.bm25_search("text", "supersonic boundary layer", k=10),
        t.bm25_search_prefix("text", "hyperson", k=10),
        t.token_match("text", "shock wave", mode="all", projection=["id"]),
        t.vector_search("embedding", q, k=10, projection=["id", "title"]),
        t.vector_search("embedding", q, k=10, where="label = '3'", projection=["id"]),
        t.hybrid_search("text", "heat transfer", "embedding", q, k=10),
        t.to_arrow(["id", "title", "label"], where="label = '5' AND id < 3000"),
        pa.table({"n": [t.count_rows("label IN ('1', '2')")]}),
        db.sql("SELECT b._id, v.label FROM bm25_search('v', 'text', 'wing', 5) b JOIN v ON b._id = v._id"),
    ]


def test_unverified_cold_reads_fetch_only_the_ranges_used(s3_vector_table: tuple[str, int], tmp_path: Path) -> None:
    uri, total = s3_vector_table
    want = _answers(superfile.connect(uri, cache_budget_bytes=0))
    conn = superfile.connect(uri, cache_dir=str(tmp_path), verify_checksums=False)
    cache = conn.disk_cache
    assert cache is not None
    cache.prefetch = False  # only what is read
    t = conn.open_table("v")
    assert t.bm25_search("text", "supersonic boundary layer", k=10, projection=["id", "title"]) == want[0]
    assert 0 < cache.ranged_bytes < total / 2  # footers, full-text sections, a few row groups: no vectors
    assert [a.to_pylist() for a in _answers(conn)] == [a.to_pylist() for a in want]
    assert cache.fetches == 0 and cache.usage() == (0, 0)  # nothing kept without the background fill


def test_unverified_cold_copies_fill_in_the_background(s3_vector_table: tuple[str, int], tmp_path: Path) -> None:
    uri, _ = s3_vector_table
    want = [a.to_pylist() for a in _answers(superfile.connect(uri, cache_budget_bytes=0))]
    conn = superfile.connect(uri, cache_dir=str(tmp_path), verify_checksums=False)
    assert [a.to_pylist() for a in _answers(conn)] == want
    cache, storage = conn.disk_cache, conn.open_table("v")._files.storage
    assert cache is not None
    entries = conn.open_table("v")._snapshot.entries()
    deadline = time.monotonic() + 60
    while not all(cache.resident(storage, e.path) for e in entries) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.fetches == len(entries) == 4
    # the filled copies are whole: a verifying reader in a new connection opens them without a download
    verified = superfile.connect(uri, cache_dir=str(tmp_path))
    assert [a.to_pylist() for a in _answers(verified)] == want
    assert verified.disk_cache is not None and verified.disk_cache.fetches == 0
    assert [a.to_pylist() for a in _answers(conn)] == want  # the first readers, now on whole copies


def test_verifying_readers_download_whole_copies(s3_vector_table: tuple[str, int], tmp_path: Path) -> None:
    uri, _ = s3_vector_table
    conn = superfile.connect(uri, cache_dir=str(tmp_path))
    conn.open_table("v").bm25_search("text", "wing", k=3)
    assert conn.disk_cache is not None and conn.disk_cache.ranged_bytes == 0 and conn.disk_cache.fetches == 4


def test_concurrent_unverified_cold_readers_agree(s3_vector_table: tuple[str, int], tmp_path: Path) -> None:
    """Threads reading a cold table by ranges at once, while the background fills run, all see whole data."""
    from concurrent.futures import ThreadPoolExecutor

    uri, _ = s3_vector_table
    want = [a.to_pylist() for a in _answers(superfile.connect(uri, cache_budget_bytes=0))]
    conn = superfile.connect(uri, cache_dir=str(tmp_path), verify_checksums=False)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: [a.to_pylist() for a in _answers(conn)], range(4)))
    assert all(g == want for g in got)


def test_a_copy_reopened_past_the_open_budget_is_not_checked_whole_again(
    s3_table: tuple[str, pa.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the open-superfile budget every read reopens its superfiles. The first open of a copy checks it
    whole (every section's checksum); a reopen checks the footer against the manifest only, unless the copy
    was discarded (found damaged) and downloaded again."""
    import zlib

    from superfile.table.snapshot import open_readers, set_open_budget

    uri, rows = s3_table
    hashed: list[int] = []
    crc32 = zlib.crc32

    def counting(data: object, value: int = 0) -> int:
        hashed.append(len(memoryview(data)))  # type: ignore[arg-type]
        return crc32(data, value)  # type: ignore[arg-type]

    monkeypatch.setattr(zlib, "crc32", counting)
    limits = open_readers().limits
    set_open_budget(1, limits[1])  # every open evicts the others: each read reopens its superfiles
    try:
        table = superfile.connect(uri, cache_dir=str(tmp_path)).open_table("t")
        sizes = [e.size for e in table._snapshot.entries()]
        copies = sum(sizes)
        assert table.to_arrow(["id", "text"]).sort_by("id") == rows
        first = sum(hashed)
        assert first >= copies * 0.9  # the first opens read every copy whole
        hashed.clear()
        for _ in range(3):
            assert table.to_arrow(["id", "text"]).sort_by("id") == rows
        assert hashed and max(hashed) < min(sizes) / 4  # footers and the like: no copy hashed whole
        assert sum(hashed) < copies  # three reads, twelve reopens, less than one first read hashed
        hashed.clear()
        cache, storage = table.files.disk_cache, table.files.storage
        assert cache is not None
        entry = table._snapshot.entries()[0]
        assert cache.verified(cache.path(storage, entry.path))
        cache.discard(storage, entry.path)  # found damaged: the next download is checked whole again
        assert not cache.verified(cache.fetch(storage, entry.path, entry.size))
    finally:
        set_open_budget(*limits)


def test_mapped_copies_past_the_bytes_budget_stay_open(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, opened_readers: list[str]
) -> None:
    """A disk-cache copy is mapped: its reader is charged a handle and its metadata, not its size, so a bytes
    budget below half the table's size keeps all four superfiles open across reads."""
    from superfile.table.snapshot import open_readers, set_open_budget

    uri = _s3_uri(s3_endpoint, s3_bucket)
    rng = np.random.default_rng(5)
    writer = superfile.connect(uri, cache_budget_bytes=0).create_table("t", schema=_rows(0, 1).schema)
    for start in range(0, 20_000, 5_000):  # superfiles of ~0.5 MB of random words: mapped, and past their footers
        words = rng.integers(0, 1 << 30, (5_000, 4)).astype(str)
        writer.append(
            pa.table({"id": pa.array(range(start, start + 5_000), pa.int64()), "text": [" ".join(w) for w in words]})
        )
    limits = open_readers().limits
    table = superfile.connect(uri, cache_dir=str(tmp_path)).open_table("t")
    entries = table._snapshot.entries()
    held = sum(table.files.open(e).held()[0] for e in entries)  # their metadata
    assert len(entries) == 4 and held < sum(e.size for e in entries) / 2
    expected = table.to_arrow(["id", "text"]).sort_by("id")
    table.files._readers.discard(lambda key: False)  # closed again: the reads below open them
    opened_readers.clear()
    set_open_budget(held + 1024, limits[1])  # room for all four as charged; not for their sizes
    try:
        for _ in range(3):
            assert table.to_arrow(["id", "text"]).sort_by("id") == expected
            assert table.count_rows("id % 1000 = 7") == 20
        assert len(opened_readers) == len(set(opened_readers)) == 4  # each opened once
    finally:
        set_open_budget(*limits)
