"""Garbage collection: delete the files no retained version needs.

Retained versions: every version committed inside the window
(``older_than`` before now), the version that was current when the window
opened (a reader may have opened it then), and always the current one. A
file is deleted only if no retained version references it (manifest lists,
history segments, manifest parts, superfiles, deletion vectors, idempotency
key blocks) *and*
it is older than the safety margin (by default the window itself): an
in-flight commit's files (flushed superfiles of a long transaction, an
optimize's outputs, a publish attempt's parts) are unreferenced until it
publishes, and young, so they stay. The margin must exceed the longest
commit: ``older_than=0`` without a margin can delete a running commit's
files (the gateway refuses windows below an hour for that reason).

Commits that publish while cleanup runs build on the current version, whose
files are marked; cleanup re-reads the pointer after listing and marks any
newer version before deleting. A ``restore`` re-checks the retention mark
(raised before listing) in its publish, so it does not publish a version
cleanup expired; only a restore that checked just before the mark moved and
publishes after cleanup's last pointer read can still race: restore versions
well inside the window.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from superfile._lru import LRU
from superfile.commit.idempotency import PREFIX as KEYS_PREFIX
from superfile.commit.idempotency import block_paths
from superfile.errors import InvalidOptionError, ObjectNotFoundError, ReadOnlyTableError
from superfile.io import ObjectInfo
from superfile.manifest.log import (
    SEGMENTS,
    full_history,
    newest_first,
    oldest_retained,
    segment_paths,
    set_oldest_retained,
)
from superfile.manifest.model import HistoryEntry, ManifestList
from superfile.pools import query_pool
from superfile.validate import DEFAULT_RETENTION, check_seconds

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["DEFAULT_RETENTION", "cleanup", "retained_versions"]

T = TypeVar("T")

# listing prefix -> kind reported; the first matching prefix wins
_KINDS = (
    ("_manifests/parts/", "manifest_parts"),
    (SEGMENTS, "history_segments"),
    ("_manifests/", "manifests"),
    ("data/", "superfiles"),
    ("_deletions/", "deletion_vectors"),
    (KEYS_PREFIX, "idempotency_blocks"),
)


def retained_versions(history: Sequence[HistoryEntry], cutoff_ms: int, oldest: int) -> list[HistoryEntry]:
    """Versions committed at or after the cutoff, plus the one current at the cutoff (and never below
    ``oldest``, the versions an earlier cleanup already expired)."""
    live = [h for h in history if h.version >= oldest]
    inside = [h for h in live if h.timestamp_ms >= cutoff_ms]
    before = [h for h in live if h.timestamp_ms < cutoff_ms]
    return before[-1:] + inside


# manifest list or part (by storage and path) -> what it names. Both are immutable, so a process that cleans
# up every minute (the builder) reads each retained version's list and part once, not on every run: decoding
# them again was most of a cleanup (5.3 s a run at 300 retained versions of 20-row commits, then 12 ms:
# bench/cleanup_bench.py). Those of expired versions go at the end of each cleanup (_Marker.forget_unmarked)
_NAMES = LRU(8192)


class _Names(NamedTuple):
    """What a manifest list names: its idempotency key blocks, its parts, its newest history segment."""

    blocks: tuple[str, ...]
    parts: tuple[str, ...]
    segment: str | None


def _list_names(ml: ManifestList) -> _Names:
    return _Names(tuple(block_paths(ml.properties)), tuple(p.path for p in ml.parts), ml.history_segment)


class _Marker:
    """The set of paths reachable from the versions marked so far; each manifest part is read once. The parts
    of the versions marked are read together (:meth:`parts`): one hand-off to the pool, not one per version."""

    def __init__(self, table: Supertable) -> None:
        self.store = table.files.manifests
        self.storage = self.store.storage
        self.paths: set[str] = set()
        self._parts: list[str] = []  # marked, what they name not yet

    def _cached(self, path: str, load: Callable[[], T]) -> T:
        value, _ = _NAMES.get_or_load(f"{self.storage.uri}\0{path}", load)
        return cast(T, value)

    def forget_unmarked(self) -> None:
        """Drop this table's cached lists and parts that no version marked now names: expired, they are never
        marked again (else a table cleaned up every minute filled the cache with them)."""
        prefix = f"{self.storage.uri}\0"
        _NAMES.discard(lambda key: not key.startswith(prefix) or key[len(prefix) :] in self.paths)

    def version(self, h: HistoryEntry) -> None:
        if h.manifest in self.paths:
            return
        try:
            names = self._cached(h.manifest, lambda: _list_names(self.store.load_list(h.manifest)))
        except ObjectNotFoundError:
            return  # expired by a concurrent cleanup
        self.paths.add(h.manifest)
        self.paths.update(names.blocks)
        for segment in segment_paths(self.storage, names.segment):
            if segment in self.paths:
                break  # the rest of the chain is marked (lists share their older segments)
            self.paths.add(segment)
        fresh = [p for p in names.parts if p not in self.paths]
        self.paths.update(fresh)
        self._parts += fresh

    def parts(self) -> None:
        """Mark what the parts of the versions marked so far name."""
        parts, self._parts = self._parts, []
        for paths in query_pool().map(lambda p: self._cached(p, lambda: self.store.part_paths(p)), parts):
            self.paths.update(paths)


def _kind(path: str) -> str | None:
    return next((kind for prefix, kind in _KINDS if path.startswith(prefix)), None)


def cleanup(
    table: Supertable,
    older_than: datetime.timedelta | float | int = DEFAULT_RETENTION,
    *,
    dry_run: bool = False,
    safety_margin: datetime.timedelta | float | int | None = None,
) -> dict[str, Any]:
    """Delete unreachable files older than the window and the margin (see the module docstring); returns
    counts and bytes."""
    window = check_seconds("older_than", older_than)
    margin = window if safety_margin is None else check_seconds("safety_margin", safety_margin)
    if not isinstance(dry_run, bool):
        raise InvalidOptionError(f"dry_run must be a bool, got {dry_run!r}")
    if table.pinned:
        raise ReadOnlyTableError(f"table {table.name!r} is open at a version; open it without one to clean up")
    storage = table.files.storage
    store = table.files.manifests
    started = time.time()
    cutoff_ms = int((started - window) * 1000)
    files_before_ms = int((started - margin) * 1000)
    pointer, _ = store.read_pointer()
    current = store.load_list(pointer.manifest)
    oldest = oldest_retained(storage)
    retained = retained_versions(full_history(storage, current), cutoff_ms, oldest)
    if not dry_run:  # before listing: a restore publishing from now on sees the mark (history.restore)
        set_oldest_retained(storage, retained[0].version)
    marker = _Marker(table)
    for h in retained:
        marker.version(h)
    marker.parts()
    listed: list[ObjectInfo] = [
        info for prefix, _ in _KINDS[1:] for info in storage.list(prefix) if _kind(info.path) is not None
    ]
    seen = current.version
    while True:  # mark versions committed while we listed
        pointer, _ = store.read_pointer()
        if pointer.version <= seen:
            break
        newer = store.load_list(pointer.manifest)
        for h in newest_first(storage, newer):
            if h.version <= seen:
                break
            marker.version(h)
        seen = newer.version
    marker.parts()
    marker.forget_unmarked()
    doomed = [i for i in listed if i.path not in marker.paths and i.mtime * 1000 < files_before_ms]
    removed = {kind: 0 for _, kind in _KINDS}
    for info in doomed:
        removed[_kind(info.path) or ""] += 1
    incomplete = 0
    if not dry_run:
        list(query_pool().map(lambda info: storage.delete(info.path), doomed))
        table.files.release([i.path for i in doomed if _kind(i.path) == "superfiles"])  # unmap what is gone
        # what killed writers left half written (temp files, multipart uploads), by the same margin
        incomplete = storage.purge_incomplete(files_before_ms / 1000)
    return {
        "oldest_version": retained[0].version,
        "retained_versions": len(retained),
        "files_removed": len(doomed),
        "bytes_removed": sum(i.size for i in doomed),
        "removed": removed,
        "incomplete_removed": incomplete,
        "dry_run": dry_run,
    }
