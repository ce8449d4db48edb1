"""Where a table's metadata lives in storage, and how it is read and published.

Layout below the table's prefix::

    _pointer.json                 current version -> manifest list (compare-and-swap)
    _sequence.json                next unassigned _id (compare-and-swap)
    _manifests/<v>-<uuid>.json    one manifest list per version (immutable)
    _manifests/parts/<uuid>.json.zst   manifest parts (immutable, shared between versions)
    _deletions/<uuid>.roar        deletion vectors (immutable)
    data/<uuid>.parquet           superfiles (immutable)
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyroaring

from superfile._lru import LRU
from superfile.errors import (
    ContentionError,
    ObjectNotFoundError,
    StorageError,
    TableNotFoundError,
)
from superfile.evolution import schema_id
from superfile.io import Storage, write_new
from superfile.manifest.model import ManifestList, PartRef, Pointer, SuperfileEntry

__all__ = ["POINTER", "ManifestStore", "backoff"]

POINTER = "_pointer.json"
SEQUENCE = "_sequence.json"


def _part_key(path: str, schema: pa.Schema) -> str:
    return f"{path}#{schema_id(schema)}"


def backoff(attempt: int, base: float = 0.005, cap: float = 0.5) -> None:
    """Full-jitter exponential backoff: spreads retrying writers apart."""
    time.sleep(random.uniform(0, min(cap, base * (2**attempt))))


class ManifestStore:
    """Reads and writes one table's manifests; caches immutable objects by path."""

    def __init__(self, storage: Storage, *, cache_size: int = 1024) -> None:
        self.storage = storage
        self._lists = LRU(64)
        self._parts = LRU(cache_size)
        self._deletes = LRU(cache_size)
        self.parts_fetched = 0

    # -- pointer and sequence -------------------------------------------------
    def read_pointer(self) -> tuple[Pointer, str]:
        try:
            data, etag = self.storage.read_with_etag(POINTER)
        except ObjectNotFoundError:
            raise TableNotFoundError(f"table at {self.storage.uri!r} does not exist") from None
        return Pointer.from_json(json.loads(data)), etag

    def create_pointer(self, pointer: Pointer) -> None:
        write_new(self.storage, POINTER, json.dumps(pointer.to_json()).encode())

    def swap_pointer(self, pointer: Pointer, etag: str) -> None:
        """Publish: raises PreconditionFailedError if another commit landed since ``etag`` was read."""
        try:
            self.storage.write_if_match(POINTER, json.dumps(pointer.to_json()).encode(), etag)
        except ObjectNotFoundError:
            raise TableNotFoundError(f"table at {self.storage.uri!r} was dropped") from None

    def init_sequence(self) -> None:
        self.storage.write(SEQUENCE, b'{"next_id": 0}')

    def reserve_ids(self, count: int, max_attempts: int) -> int:
        """Reserve ``count`` consecutive _ids; returns the first. Ids of failed commits are never reused."""
        for attempt in range(max_attempts):
            try:
                data, etag = self.storage.read_with_etag(SEQUENCE)
            except ObjectNotFoundError:
                raise TableNotFoundError(f"table at {self.storage.uri!r} does not exist") from None
            start = int(json.loads(data)["next_id"])
            try:
                self.storage.write_if_match(SEQUENCE, json.dumps({"next_id": start + count}).encode(), etag)
                return start
            except ObjectNotFoundError:
                raise TableNotFoundError(f"table at {self.storage.uri!r} was dropped") from None
            except StorageError:
                # Lost or refused: either way reserve afresh. A reservation that landed unseen only leaves
                # a gap in the _ids, never a reuse.
                backoff(attempt)
        raise ContentionError(f"could not reserve ids after {max_attempts} attempts: too many concurrent writers")

    # -- manifest lists --------------------------------------------------------
    def load_list(self, path: str) -> ManifestList:
        ml, _ = self._lists.get_or_load(path, lambda: ManifestList.from_json(json.loads(self.storage.read(path))))
        return ml

    @staticmethod
    def new_list_path(version: int) -> str:
        return f"_manifests/{version:020d}-{uuid.uuid4().hex}.json"

    def write_list(self, ml: ManifestList, path: str) -> None:
        write_new(self.storage, path, json.dumps(ml.to_json(), separators=(",", ":")).encode())

    # -- parts -----------------------------------------------------------------
    def load_part(self, ref: PartRef, schema: pa.Schema) -> list[SuperfileEntry]:
        """The part's entries as ``schema`` names their columns (cached per part and schema id: an evolved
        schema reads the same part under its own names)."""

        def fetch() -> list[SuperfileEntry]:
            raw = pa.CompressedInputStream(pa.BufferReader(self.storage.read(ref.path)), "zstd").read()
            return [SuperfileEntry.from_json(e, schema) for e in json.loads(raw)["entries"]]

        entries, fetched = self._parts.get_or_load(_part_key(ref.path, schema), fetch)
        if fetched:
            self.parts_fetched += 1
        return entries

    def write_part(self, entries: Sequence[SuperfileEntry], schema: pa.Schema) -> tuple[str, int]:
        raw = json.dumps({"entries": [e.to_json(schema) for e in entries]}, separators=(",", ":")).encode()
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, "zstd") as out:
            out.write(raw)
        data = sink.getvalue().to_pybytes()
        path = f"_manifests/parts/{uuid.uuid4().hex}.json.zst"
        write_new(self.storage, path, data)
        self._parts.get_or_load(_part_key(path, schema), lambda: list(entries))
        return path, len(data)

    # -- deletion vectors --------------------------------------------------------
    def load_deletes(self, path: str) -> pyroaring.FrozenBitMap:
        bm, _ = self._deletes.get_or_load(path, lambda: pyroaring.FrozenBitMap.deserialize(self.storage.read(path)))
        return bm

    def write_deletes(self, bitmap: pyroaring.AbstractBitMap) -> str:
        path = f"_deletions/{uuid.uuid4().hex}.roar"
        write_new(self.storage, path, bitmap.serialize())
        return path
