"""What the commit protocol promises when answers are lost or storage forgets (docs/reliability.md): create-only
writes that meet their own bytes, request keys on every write kind, typed errors for missing superfiles,
and cleanup of what killed writers leave behind. The fault-injection runs are in tests/faults/."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
import superfile
from superfile.errors import PreconditionFailedError, StorageError, SuperfileMissingError
from superfile.io import Storage, from_uri, write_new
from superfile.manifest.store import POINTER

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string())])


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "text": [f"row {i}" for i in ids]}, schema=SCHEMA)


def test_write_new_meets_its_own_bytes_as_success_and_other_bytes_as_a_conflict(storage_uri: str) -> None:
    storage = from_uri(storage_uri)
    etag = write_new(storage, "a/obj", b"mine")
    assert write_new(storage, "a/obj", b"mine") == etag  # a retry after a lost answer
    with pytest.raises(PreconditionFailedError):
        write_new(storage, "a/obj", b"theirs")
    assert storage.read("a/obj") == b"mine"


def test_keyed_delete_update_and_restore_commit_once(storage_uri: str) -> None:
    t = superfile.connect(storage_uri).create_table("t", SCHEMA)
    v_rows = t.append(_rows([1, 2, 3, 4]))
    v_update = t.update("id = 1", _rows([10]), idempotency_key="u")
    v_delete = t.delete("id = 2", idempotency_key="d")
    v_restore = t.restore(v_rows, idempotency_key="r")
    assert (v_update, v_delete, v_restore) == (v_rows + 1, v_rows + 2, v_rows + 3)
    # the same requests again (a client retrying after a lost answer): nothing changes
    assert t.update("id = 1", _rows([10]), idempotency_key="u") == v_update
    assert t.delete("id = 2", idempotency_key="d") == v_delete
    assert t.restore(v_rows, idempotency_key="r") == v_restore
    assert t.version == v_restore and sorted(t.to_arrow(["id"]).column("id").to_pylist()) == [1, 2, 3, 4]
    assert t.delete("id = 3", idempotency_key="u") == v_update  # a key is a key, whatever write it named


def test_racing_requests_with_one_key_commit_once(tmp_path: Path) -> None:
    """Two handles send the same keyed delete and the same keyed restore at once (the first attempt still
    running while its retry starts): each commits once, both callers get its version."""
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table("t", SCHEMA).append(_rows(list(range(100))))
    handles = [superfile.connect(uri).open_table("t") for _ in range(4)]
    start = threading.Barrier(len(handles))
    answers: list[int] = []

    def send(i: int) -> None:
        start.wait()
        answers.append(handles[i].delete("id < 50", idempotency_key="the-delete"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(handles))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    fresh = superfile.connect(uri).open_table("t")
    assert [v["operation"] for v in fresh.versions()].count("delete") == 1
    assert len(set(answers)) == 1 and answers[0] == fresh.version and fresh.count_rows() == 50


def test_a_missing_superfile_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    t = superfile.connect(uri).create_table("t", SCHEMA, fts_columns=["text"])
    t.append(_rows([1, 2]))
    [superfile_path] = [p for p in (tmp_path / "t" / "data").iterdir() if p.suffix == ".parquet"]
    superfile_path.unlink()
    fresh = superfile.connect(uri).open_table("t")
    for read in (lambda: fresh.to_arrow(), lambda: fresh.bm25_search("text", "row", k=5)):
        with pytest.raises(SuperfileMissingError) as caught:
            read()
        assert isinstance(caught.value, StorageError) and caught.value.http_status == 503
        assert caught.value.path == f"data/{superfile_path.name}" and superfile_path.name in str(caught.value)


def test_cleanup_removes_temp_files_killed_writers_left(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    t = superfile.connect(uri).create_table("t", SCHEMA)
    t.append(_rows([1]))
    old = tmp_path / "t" / "data" / ".abc.parquet.0123456789abcdef.sftmp"
    young = tmp_path / "t" / "_manifests" / ".x.json.fedcba9876543210.sftmp"
    for path in (old, young):
        path.write_bytes(b"half written")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert t.cleanup(3600, dry_run=True)["incomplete_removed"] == 0 and old.exists()
    result = t.cleanup(3600)
    assert result["incomplete_removed"] == 1 and not old.exists() and young.exists()
    assert t.count_rows() == 1


def test_cleanup_aborts_multipart_uploads_killed_writers_left(s3_endpoint: str, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/tables?endpoint_url={s3_endpoint}"
    t = superfile.connect(uri).create_table("t", SCHEMA)
    t.append(_rows([1]))
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_multipart_upload(Bucket=s3_bucket, Key="tables/t/data/killed.parquet")
    # (moto reports every upload as initiated in 2010, so the margin's age check is exercised on file:// only)
    assert t.cleanup(0, safety_margin=0)["incomplete_removed"] == 1
    assert not client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert t.count_rows() == 1


class _LateSwap:
    """Storage whose first pointer swap gets no answer and reaches the store only at the ``lands_at``-th
    pointer read after it (a request still in flight), if the pointer has not moved meanwhile (else the
    server would refuse it)."""

    def __init__(self, inner: Storage, lands_at: int) -> None:
        self._inner = inner
        self._lands_at = lands_at
        self._pending: tuple[str, bytes, str] | None = None
        self._reads_since = 0
        self.held = self.landed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        if path == POINTER and not self.held:
            self.held += 1
            self._pending = (path, data, etag)
            raise StorageError("no answer: the swap is still in flight")
        return self._inner.write_if_match(path, data, etag)

    def child(self, prefix: str) -> _LateSwap:
        self.table = _LateSwap(self._inner.child(prefix), self._lands_at)  # the table's storage, held here
        return self.table

    def read_with_etag(self, path: str) -> tuple[bytes, str]:
        if path == POINTER and self._pending is not None:
            self._reads_since += 1
            if self._reads_since == self._lands_at:
                pending, self._pending = self._pending, None
                with contextlib.suppress(PreconditionFailedError):
                    self._inner.write_if_match(*pending)
                    self.landed += 1
        return self._inner.read_with_etag(path)


@pytest.mark.parametrize("lands_at", [1, 2, 3])
def test_a_swap_that_lands_late_commits_once(lands_at: int) -> None:
    """Whenever the unanswered swap reaches the store, among the writer's later reads, the append commits
    exactly once: it finds its own manifest instead of re-applying on top of it."""
    uri = f"memory://late-{lands_at}"
    superfile.connect(uri).create_table("t", SCHEMA).append(_rows([0]))
    storage = _LateSwap(from_uri(uri), lands_at)
    t = superfile.Connection(uri, storage=storage).open_table("t")
    version = t.append(_rows([1, 2]))
    fresh = superfile.connect(uri).open_table("t")
    assert storage.table.held == 1 and fresh.version == version
    assert sorted(fresh.to_arrow(["id"]).column("id").to_pylist()) == [0, 1, 2]
    assert [v["operation"] for v in fresh.versions()].count("append") == 2
