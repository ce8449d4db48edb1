"""The storage contract, run against every backend (memory, local disk, S3 via moto)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import boto3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    ObjectNotFoundError,
    PreconditionFailedError,
    ShortReadError,
    StorageError,
)
from superfile.io import Storage, from_uri, local
from superfile.io.local import LocalStorage
from superfile.io.s3 import _SIGNED_KEYS, S3Storage
from superfile_suite.faults import Faults, FaultyHttpProxy, Request

MiB = 1024 * 1024
RACERS = 8
BAD_KEYS = ["../x", "/x", "a/../b", "", "./a", "a//b", "a\\b", "a\0b", "a/"]


def _s3_uri(bucket: str, endpoint: str, prefix: str = "p", **options: object) -> str:
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in {"endpoint_url": endpoint, **options}.items())
    return f"s3://{bucket}/{prefix}?{query}"


# -- basic contract ---------------------------------------------------------


def test_roundtrip(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    assert isinstance(store, Storage)
    assert not store.exists("a/b.bin")
    etag = store.write("a/b.bin", b"hello")
    assert store.exists("a/b.bin")
    assert store.read("a/b.bin") == b"hello"
    assert store.read_with_etag("a/b.bin") == (b"hello", etag)
    assert store.size("a/b.bin") == 5
    [info] = store.list()
    assert (info.path, info.size) == ("a/b.bin", 5)
    assert abs(info.mtime - time.time()) < 600

    new_etag = store.write("a/b.bin", b"bye")
    assert store.read_with_etag("a/b.bin") == (b"bye", new_etag)
    store.delete("a/b.bin")
    assert not store.exists("a/b.bin")
    assert list(store.list()) == []
    store.delete("a/b.bin")  # deleting a missing key is a no-op


def test_missing_objects(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    for call in (store.read, store.read_with_etag, store.size, lambda p: store.read_range(p, 0, 1)):
        with pytest.raises(ObjectNotFoundError):
            call("nope")
    with pytest.raises(ObjectNotFoundError):
        store.write_if_match("nope", b"x", "some-etag")
    assert not store.exists("nope")


def test_list_is_a_key_prefix(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    for key in ["a/1", "a/2", "ab/3", "b/4", "a/deep/er/5"]:
        store.write(key, key.encode())
    paths = lambda prefix: [info.path for info in store.list(prefix)]  # noqa: E731
    assert paths("") == ["a/1", "a/2", "a/deep/er/5", "ab/3", "b/4"]
    assert paths("a/") == ["a/1", "a/2", "a/deep/er/5"]
    assert paths("a") == ["a/1", "a/2", "a/deep/er/5", "ab/3"]
    assert paths("a/de") == ["a/deep/er/5"]
    assert paths("zzz") == []
    assert {info.path: info.size for info in store.list("b")} == {"b/4": 3}


def test_folders_are_the_direct_children_holding_objects(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    for key in ["a/1", "a/deep/2", "ab/3", "top", "c/d/e"]:
        store.write(key, key.encode())
    assert store.folders() == ("a", "ab", "c")
    assert store.folders("a/") == ("deep",)
    assert store.folders("c/") == ("d",)
    assert store.folders("zzz/") == ()
    store.delete("ab/3")  # a folder is its objects: once they are gone, so is it (on disk too)
    assert store.folders() == ("a", "c")
    with pytest.raises(InvalidInputError):
        store.folders("a")  # not a folder
    with pytest.raises(InvalidInputError):
        store.folders("../")


def test_read_range_is_exact(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    data = bytes(range(256)) * 4
    store.write("r", data)
    assert store.read_range("r", 0, 10) == data[:10]
    assert store.read_range("r", 1000, 24) == data[1000:]
    assert store.read_range("r", 500, 0) == b""
    assert store.read_range("r", 1024, 0) == b""
    for offset, length in [(1000, 25), (1024, 1), (2000, 5), (1025, 0)]:
        with pytest.raises(ShortReadError):
            store.read_range("r", offset, length)
    with pytest.raises(InvalidInputError):
        store.read_range("r", -1, 5)
    with pytest.raises(InvalidInputError):
        store.read_range("r", 0, -5)


@pytest.mark.parametrize("backend", ["memory", "file"])
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), offset=st.integers(0, 400), length=st.integers(0, 400))
def test_read_range_matches_slicing(
    tmp_path_factory: pytest.TempPathFactory, backend: str, data: bytes, offset: int, length: int
) -> None:
    root = tmp_path_factory.getbasetemp() / "range-prop"
    store = from_uri("memory://range-prop" if backend == "memory" else f"file://{root}")
    store.write("k", data)
    if offset + length <= len(data):
        assert store.read_range("k", offset, length) == data[offset : offset + length]
    else:
        with pytest.raises(ShortReadError):
            store.read_range("k", offset, length)


# -- conditional writes -----------------------------------------------------


def test_write_if_absent(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    etag = store.write_if_absent("m/v1", b"first")
    with pytest.raises(PreconditionFailedError):
        store.write_if_absent("m/v1", b"second")
    assert store.read_with_etag("m/v1") == (b"first", etag)


def test_write_if_match(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    stale = store.write("head", b"v1")
    current = store.write("head", b"v2")
    with pytest.raises(PreconditionFailedError):
        store.write_if_match("head", b"v3", stale)
    assert store.read("head") == b"v2"
    newest = store.write_if_match("head", b"v3", current)
    assert store.read_with_etag("head") == (b"v3", newest)


def test_threads_racing_write_if_match(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    etag = store.write("head", b"start")
    barrier = threading.Barrier(RACERS)

    def race(i: int) -> bool:
        barrier.wait(timeout=30)
        try:
            store.write_if_match("head", f"writer-{i}".encode(), etag)
        except PreconditionFailedError:
            return False
        return True

    with ThreadPoolExecutor(RACERS) as pool:
        wins = list(pool.map(race, range(RACERS), timeout=60))
    assert sum(wins) == 1
    assert store.read("head") == f"writer-{wins.index(True)}".encode()


def test_threads_racing_write_if_absent(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    barrier = threading.Barrier(RACERS)

    def race(i: int) -> bool:
        barrier.wait(timeout=30)
        try:
            store.write_if_absent("once", f"writer-{i}".encode())
        except PreconditionFailedError:
            return False
        return True

    with ThreadPoolExecutor(RACERS) as pool:
        wins = list(pool.map(race, range(RACERS), timeout=60))
    assert sum(wins) == 1
    assert store.read("once") == f"writer-{wins.index(True)}".encode()


def _cas_in_process(uri: str, etag: str, index: int, barrier: object, results: object) -> None:
    store = from_uri(uri)
    barrier.wait(timeout=30)  # type: ignore[attr-defined]
    try:
        store.write_if_match("head", f"proc-{index}".encode(), etag)
        results.put((index, True))  # type: ignore[attr-defined]
    except PreconditionFailedError:
        results.put((index, False))  # type: ignore[attr-defined]


def test_processes_racing_write_if_match(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    etag = from_uri(uri).write("head", b"start")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_cas_in_process, args=(uri, etag, i, barrier, results)) for i in range(RACERS)]
    for proc in procs:
        proc.start()
    try:
        outcomes = dict(results.get(timeout=60) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    winners = [i for i, won in outcomes.items() if won]
    assert len(outcomes) == RACERS and len(winners) == 1
    assert from_uri(uri).read("head") == f"proc-{winners[0]}".encode()


# -- keys, children, paths --------------------------------------------------


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_cannot_escape_the_root(storage_uri: str, key: str) -> None:
    store = from_uri(storage_uri)
    calls = [
        lambda: store.read(key),
        lambda: store.read_range(key, 0, 1),
        lambda: store.size(key),
        lambda: store.exists(key),
        lambda: store.write(key, b"x"),
        lambda: store.write_if_absent(key, b"x"),
        lambda: store.write_if_match(key, b"x", "e"),
        lambda: store.delete(key),
        lambda: store.local_path(key),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError, match="escapes the storage root"):
            call()
    if key != "a/":  # a trailing slash is fine for a child prefix
        with pytest.raises(InvalidInputError, match="escapes the storage root"):
            store.child(key)
    assert list(store.list()) == []


def test_child_shares_objects(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    sub = store.child("tables/t1")
    etag = sub.write("data/x", b"payload")
    assert store.read_with_etag("tables/t1/data/x") == (b"payload", etag)
    assert [info.path for info in sub.list()] == ["data/x"]
    assert from_uri(sub.uri).read("data/x") == b"payload"
    assert sub.child("data").read("x") == b"payload"
    # a conditional write through the child sees writes through the parent
    store.write("tables/t1/data/x", b"changed")
    with pytest.raises(PreconditionFailedError):
        sub.write_if_match("data/x", b"stale", etag)


def test_local_path(storage_uri: str) -> None:
    store = from_uri(storage_uri)
    store.write("d/f", b"abc")
    path = store.local_path("d/f")
    if storage_uri.startswith("file://"):
        assert path is not None and Path(path).read_bytes() == b"abc"
    else:
        assert path is None


def test_memory_stores_are_shared_by_name() -> None:
    from_uri("memory://shared-by-name").write("k", b"v")
    assert from_uri("memory://shared-by-name").read("k") == b"v"
    assert not from_uri("memory://another-name").exists("k")


# -- local disk -------------------------------------------------------------


def test_local_leaves_no_temp_files_and_hides_strays(tmp_path: Path) -> None:
    store = LocalStorage(str(tmp_path / "root"))
    store.write("a/x", b"1")
    store.write_if_absent("a/y", b"2")
    store.write_if_match("a/x", b"3", store.read_with_etag("a/x")[1])
    with pytest.raises(PreconditionFailedError):
        store.write_if_absent("a/y", b"4")
    assert sorted(p.name for p in (tmp_path / "root" / "a").iterdir()) == ["x", "y"]
    (tmp_path / "root" / "a" / ".x.deadbeef.sftmp").write_bytes(b"crash leftover")
    assert [info.path for info in store.list()] == ["a/x", "a/y"]


@pytest.mark.parametrize("fsync", [True, False])
def test_local_unique_writes_and_staged_swaps(tmp_path: Path, fsync: bool) -> None:
    """A commit's fast path on local disk: ``write_unique`` creates like ``write_if_absent``; a staged write is
    swapped in like ``write_if_match`` (or refused on a stale etag, or discarded) and leaves no temp file."""
    store = LocalStorage(str(tmp_path / "root"), fsync=fsync)
    store.write_unique("a/new/x", b"1")  # its directory created
    with pytest.raises(PreconditionFailedError):
        store.write_unique("a/new/x", b"2")
    assert store.read("a/new/x") == b"1"
    etag = store.write("p", b"v1")
    stale = store.stage("p", b"v2")
    current = store.write_if_match("p", b"v3", etag)
    with pytest.raises(PreconditionFailedError):
        store.swap_staged(stale, etag)
    assert store.swap_staged(store.stage("p", b"v4"), current) == store.read_with_etag("p")[1]
    store.discard(store.stage("p", b"v5"))
    assert store.read("p") == b"v4"
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "root").rglob("*") if p.is_file()) == [
        "root/a/new/x",
        "root/p",
    ]


def test_local_etag_is_content_md5(tmp_path: Path) -> None:
    store = from_uri(f"file://{tmp_path}")
    assert store.write("k", b"abc") == "900150983cd24fb0d6963f7d28e17f72"
    assert store.read_with_etag("k")[1] == "900150983cd24fb0d6963f7d28e17f72"


def test_local_reads_whole_objects_of_every_size(tmp_path: Path) -> None:
    """A small object is read in one call, a larger one whole into a buffer: every byte either way, at the sizes
    around the switch; a directory is no object."""
    store = from_uri(f"file://{tmp_path}")
    rng = np.random.default_rng(9)
    for size in (0, 1, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 3 * 1024 * 1024 + 7):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        store.write(f"o/{size}", data)
        assert store.read(f"o/{size}") == data
    with pytest.raises(ObjectNotFoundError):
        store.read("o")


def _settled(path: Path) -> None:
    """Wait (bounded) until the file's inode last changed over the settling time ago."""
    deadline = time.monotonic() + 10
    while time.time() - path.stat().st_ctime <= local._SETTLED_S:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_local_settled_object_is_read_again_on_any_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small object whose file settled is served from one stat while the file is unchanged, and read again
    after a replacement of the same size, an in-place write, or a write with its old mtime put back."""
    store = LocalStorage(str(tmp_path))
    store.write("p", b"one")
    _settled(tmp_path / "p")
    assert store.read_with_etag("p") == (b"one", local._etag(b"one"))
    reads: list[str] = []
    real = store._read  # the file read itself (read_with_etag's path: target, key)
    monkeypatch.setattr(store, "_read", lambda target, path: reads.append(path) or real(target, path))
    assert store.read_with_etag("p")[0] == b"one"
    assert reads == []  # settled and unchanged: not read
    store.write("p", b"two")  # a temp file renamed over it, same size
    assert store.read_with_etag("p")[0] == b"two"
    _settled(tmp_path / "p")
    store.read_with_etag("p")
    old = (tmp_path / "p").stat()
    with open(tmp_path / "p", "r+b") as f:  # in place, as no writer of ours does, and the mtime put back
        f.write(b"six")
    os.utime(tmp_path / "p", ns=(old.st_atime_ns, old.st_mtime_ns))
    assert store.read_with_etag("p") == (b"six", local._etag(b"six"))
    store.delete("p")
    with pytest.raises(ObjectNotFoundError):
        store.read_with_etag("p")


def test_local_young_objects_are_read_each_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file changed within the settling time is read on every call, unchanged or not: a file system whose
    clock ticks coarsely may give a quick successor the same inode and times."""
    monkeypatch.setattr(local, "_SETTLED_S", 60.0)  # every file here is young
    store = LocalStorage(str(tmp_path))
    reads: list[str] = []
    real = store._read  # the file read itself (read_with_etag's path: target, key)
    monkeypatch.setattr(store, "_read", lambda target, path: reads.append(path) or real(target, path))
    for i in range(20):
        data = f"{i // 4:04d}".encode()
        if i % 4 == 0:
            store.write("p", data)
        assert store.read_with_etag("p") == (data, local._etag(data))
    assert len(reads) == 20


def test_local_options(tmp_path: Path) -> None:
    store = from_uri(f"file://{tmp_path}?fsync=false")
    store.write("k", b"v")
    assert store.read("k") == b"v"
    with pytest.raises(InvalidOptionError):
        from_uri(f"file://{tmp_path}?fsync=maybe")


# -- S3 specifics -----------------------------------------------------------


def test_s3_options_are_coerced_and_checked(s3_endpoint: str, s3_bucket: str) -> None:
    store = from_uri(_s3_uri(s3_bucket, s3_endpoint, max_attempts="3", create_bucket="false"))
    assert isinstance(store, S3Storage)
    store.write("k", b"v")
    assert from_uri(store.uri).read("k") == b"v"  # the URI keeps the endpoint
    with pytest.raises(InvalidOptionError):
        from_uri(_s3_uri(s3_bucket, s3_endpoint, max_concurrency="lots"))
    with pytest.raises(InvalidOptionError):
        from_uri(_s3_uri(s3_bucket, s3_endpoint, multipart_chunk_size=1024))


def test_s3_create_bucket(s3_endpoint: str) -> None:
    bucket = f"sf-created-{uuid.uuid4().hex[:12]}"
    store = from_uri(_s3_uri(bucket, s3_endpoint, create_bucket="true"))
    store.write("k", b"v")
    again = from_uri(_s3_uri(bucket, s3_endpoint, create_bucket="true"))
    assert again.read("k") == b"v"


def test_s3_multipart_write(s3_endpoint: str, s3_bucket: str) -> None:
    store = from_uri(_s3_uri(s3_bucket, s3_endpoint, multipart_threshold=5 * MiB, multipart_chunk_size=5 * MiB))
    data = os.urandom(12 * MiB)
    etag = store.write("big.bin", data)
    assert etag.startswith('"') and etag.endswith('-3"'), etag  # three parts: 5 + 5 + 2 MiB
    assert store.read_with_etag("big.bin") == (data, etag)
    assert store.read_range("big.bin", 5 * MiB - 10, 20) == data[5 * MiB - 10 : 5 * MiB + 10]
    small = store.write("small.bin", data[: 5 * MiB - 1])
    assert "-" not in small


def _part_two(request: Request) -> bool:
    return request.method == "PUT" and "partNumber=2" in request.path


def _gets(request: Request) -> bool:
    return request.method == "GET"


def test_s3_failed_multipart_is_aborted(s3_endpoint: str, s3_bucket: str) -> None:
    # One part at a time, no retries: the connection dies in the middle of part two.
    with FaultyHttpProxy(s3_endpoint, Faults(cut_upload=1.0, match=_part_two)) as proxy:
        store = from_uri(
            _s3_uri(
                s3_bucket,
                proxy.endpoint,
                multipart_threshold=5 * MiB,
                multipart_chunk_size=5 * MiB,
                max_concurrency=1,
                max_attempts=1,
            )
        )
        with pytest.raises(StorageError):
            store.write("big.bin", os.urandom(12 * MiB))
        assert proxy.faults.injected == 1
    direct = boto3.client("s3", endpoint_url=s3_endpoint)
    assert direct.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert not from_uri(_s3_uri(s3_bucket, s3_endpoint)).exists("big.bin")


@pytest.mark.parametrize("fault", ["truncate", "reset"])
def test_s3_reads_survive_transient_faults(s3_endpoint: str, s3_bucket: str, fault: str) -> None:
    data = os.urandom(300_000)
    etag = from_uri(_s3_uri(s3_bucket, s3_endpoint)).write("obj", data)
    with FaultyHttpProxy(s3_endpoint, Faults(**{fault: 1.0}, limit=1, match=_gets)) as proxy:
        store = from_uri(_s3_uri(s3_bucket, proxy.endpoint))
        assert store.read_range("obj", 1000, 200_000) == data[1000:201_000]
        assert proxy.faults.injected == 1 and proxy.faults.counts["requests"] >= 2
    with FaultyHttpProxy(s3_endpoint, Faults(**{fault: 1.0}, limit=1, match=_gets)) as proxy:
        store = from_uri(_s3_uri(s3_bucket, proxy.endpoint))
        assert store.read_with_etag("obj") == (data, etag)
        assert proxy.faults.injected == 1


def test_s3_reads_give_up_after_bounded_attempts(s3_endpoint: str, s3_bucket: str) -> None:
    data = os.urandom(100_000)
    from_uri(_s3_uri(s3_bucket, s3_endpoint)).write("obj", data)
    with FaultyHttpProxy(s3_endpoint, Faults(truncate=1.0, match=_gets)) as proxy:
        store = from_uri(_s3_uri(s3_bucket, proxy.endpoint, max_attempts=3))
        started = time.monotonic()
        with pytest.raises(ShortReadError):
            store.read_range("obj", 0, 50_000)
        assert time.monotonic() - started < 10
        assert proxy.faults.injected == 3


def _client_gets(store: Storage) -> list[str]:
    """The keys of the GetObject calls made through ``store``'s S3 client from now on (botocore's own hook)."""
    assert isinstance(store, S3Storage)
    keys: list[str] = []
    store._client.meta.events.register("before-call.s3.GetObject", lambda params, **_: keys.append(params["url_path"]))
    return keys


def test_s3_read_with_etag_reads_each_new_version_without_a_client_call(s3_endpoint: str, s3_bucket: str) -> None:
    """The per-query pointer read goes through a presigned URL on the client's connections (a third of the CPU
    of a client call): it still answers the object as it is now, with S3's etag."""
    store = from_uri(_s3_uri(s3_bucket, s3_endpoint))
    gets = _client_gets(store)
    direct = boto3.client("s3", endpoint_url=s3_endpoint)
    for version in range(5):
        etag = store.write("_pointer.json", f'{{"version": {version}}}'.encode())
        data, seen = store.read_with_etag("_pointer.json")
        assert (data, seen) == (f'{{"version": {version}}}'.encode(), etag)
        assert seen == direct.get_object(Bucket=s3_bucket, Key="p/_pointer.json")["ETag"]
    assert gets == []
    with pytest.raises(ObjectNotFoundError):  # a refusal (here a 404) is the client call's to answer
        store.read_with_etag("missing.json")
    assert len(gets) == 1


def test_s3_read_with_etag_falls_back_to_the_client_when_refused(s3_endpoint: str, s3_bucket: str) -> None:
    etag = from_uri(_s3_uri(s3_bucket, s3_endpoint)).write("_pointer.json", b"{}")
    with FaultyHttpProxy(s3_endpoint, Faults(refuse=1.0, limit=1, match=_gets)) as proxy:
        store = from_uri(_s3_uri(s3_bucket, proxy.endpoint))
        gets = _client_gets(store)
        assert store.read_with_etag("_pointer.json") == (b"{}", etag)  # the 503 answers the presigned GET
        assert proxy.faults.injected == 1 and len(gets) == 1
        assert store.read_with_etag("_pointer.json") == (b"{}", etag)  # signed afresh, no client call
        assert len(gets) == 1


def test_s3_presigned_reads_keep_a_bounded_number_of_urls(s3_endpoint: str, s3_bucket: str) -> None:
    store = from_uri(_s3_uri(s3_bucket, s3_endpoint))
    assert isinstance(store, S3Storage)
    for i in range(100):  # a long-running writer reads each object its conditional puts lost to, once
        etag = store.write(f"o{i}", b"x")
        assert store.read_with_etag(f"o{i}") == (b"x", etag)
    assert 0 < len(store._signed) <= _SIGNED_KEYS
