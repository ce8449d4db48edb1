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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from superfile.commit.idempotency import PREFIX as KEYS_PREFIX
from superfile.commit.idempotency import block_paths
from superfile.errors import InvalidOptionError, ObjectNotFoundError, ReadOnlyTableError
from superfile.io import ObjectInfo
from superfile.manifest.log import (
    SEGMENTS,
    full_history,
    newest_first,
    oldest_retained,
    segment_chain,
    set_oldest_retained,
)
from superfile.manifest.model import HistoryEntry, ManifestList
from superfile.pools import query_pool
from superfile.validate import DEFAULT_RETENTION, check_seconds

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["DEFAULT_RETENTION", "cleanup", "retained_versions"]

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


class _Marker:
    """The set of paths reachable from the versions marked so far; each manifest part is read once."""

    def __init__(self, table: Supertable) -> None:
        self.store = table.files.manifests
        self.paths: set[str] = set()

    def version(self, h: HistoryEntry) -> None:
        if h.manifest in self.paths:
            return
        try:
            ml = self.store.load_list(h.manifest)
        except ObjectNotFoundError:
            return  # expired by a concurrent cleanup
        self.manifest(h.manifest, ml)

    def manifest(self, path: str, ml: ManifestList) -> None:
        self.paths.add(path)
        self.paths.update(block_paths(ml.properties))
        for segment, _ in segment_chain(self.store.storage, ml):
            if segment in self.paths:
                break  # the rest of the chain is marked (lists share their older segments)
            self.paths.add(segment)
        fresh = [p for p in ml.parts if p.path not in self.paths]
        self.paths.update(p.path for p in fresh)
        for entries in query_pool().map(lambda p: self.store.load_part(p, ml.schema), fresh):
            for e in entries:
                self.paths.add(e.path)
                if e.deletes is not None:
                    self.paths.add(e.deletes.path)


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
