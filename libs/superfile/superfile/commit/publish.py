"""Publish: turn a staged change into a successor manifest and swing the pointer to it.

Optimistic concurrency: the change is applied to the manifest the pointer
named when it was read; if another commit swapped the pointer first, the
change is re-applied on top of the new manifest (the superfiles are already
built and uploaded, so a retry only rewrites metadata), with jittered backoff,
up to ``max_attempts`` times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyroaring

from superfile.errors import ContentionError, PreconditionFailedError, TableNotFoundError
from superfile.manifest.model import (
    DeletionRef,
    HistoryEntry,
    ManifestList,
    PartRef,
    Pointer,
    SuperfileEntry,
    now_ms,
)
from superfile.manifest.store import ManifestStore, backoff
from superfile.manifest.summary import part_ref

__all__ = ["Change", "Deletion", "StaleSuperfileError", "apply_change", "publish"]


class StaleSuperfileError(ContentionError):
    """A superfile the change deletes from was removed by a concurrent commit."""


@dataclass
class Deletion:
    """Row offsets newly deleted from one superfile."""

    entry: SuperfileEntry
    rows: pyroaring.BitMap


@dataclass
class Change:
    """Everything one commit publishes."""

    table_uuid: str
    operation: str
    added: list[SuperfileEntry] = field(default_factory=list)
    deletions: dict[str, Deletion] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    # Runs against the manifest being built on; may raise to abort (e.g. an idempotency check).
    precondition: Callable[[ManifestList], None] | None = None

    @property
    def rows_added(self) -> int:
        return sum(e.rows for e in self.added)

    def is_empty(self) -> bool:
        return not self.added and not any(len(d.rows) for d in self.deletions.values()) and not self.properties


def _with_deletes(
    entry: SuperfileEntry, rows: pyroaring.AbstractBitMap, store: ManifestStore
) -> tuple[SuperfileEntry, int]:
    old = store.load_deletes(entry.deletes.path) if entry.deletes else pyroaring.FrozenBitMap()
    merged = pyroaring.BitMap(old) | rows
    newly = len(merged) - len(old)
    if not newly:
        return entry, 0
    return replace(entry, deletes=DeletionRef(store.write_deletes(merged), len(merged))), newly


def _may_hold(ref: PartRef, entry: SuperfileEntry) -> bool:
    return ref.partition == entry.partition and ref.id_min <= entry.id_min and entry.id_max <= ref.id_max


def _part(store: ManifestStore, ml: ManifestList, partition: str | None, entries: list[SuperfileEntry]) -> PartRef:
    path, size = store.write_part(entries, ml.schema)
    ref = part_ref(path, partition, entries, size)
    opts = ml.options
    sealed = len(entries) >= opts.manifest_part_max_entries or size >= opts.manifest_part_max_bytes
    return replace(ref, sealed=sealed)


def apply_change(current: ManifestList, current_path: str, change: Change, store: ManifestStore) -> ManifestList:
    """The successor of ``current`` with ``change`` applied; writes new parts and deletion vectors."""
    version = current.version + 1
    added = [replace(e, added_version=version) for e in change.added]
    rows_deleted = 0
    pending = {p: d for p, d in change.deletions.items() if len(d.rows)}
    for i, e in enumerate(added):  # deletes of rows this same change adds
        if e.path in pending:
            added[i], n = _with_deletes(e, pending.pop(e.path).rows, store)
            rows_deleted += n

    parts = list(current.parts)
    if pending:
        for idx, ref in enumerate(parts):
            if not any(_may_hold(ref, d.entry) for d in pending.values()):
                continue
            entries = store.load_part(ref, current.schema)
            if not any(e.path in pending for e in entries):
                continue
            rewritten = []
            for e in entries:
                if e.path in pending:
                    e, n = _with_deletes(e, pending.pop(e.path).rows, store)
                    rows_deleted += n
                rewritten.append(e)
            parts[idx] = replace(_part(store, current, ref.partition, rewritten), sealed=ref.sealed)
        if pending:
            raise StaleSuperfileError(
                f"{len(pending)} superfile(s) this change deletes from were removed by a concurrent commit"
            )

    by_partition: dict[str | None, list[SuperfileEntry]] = defaultdict(list)
    for e in added:
        by_partition[e.partition].append(e)
    cap = current.options.manifest_part_max_entries
    for partition, new in by_partition.items():
        open_idx = next(
            (i for i in range(len(parts) - 1, -1, -1) if parts[i].partition == partition and not parts[i].sealed),
            None,
        )
        if open_idx is not None:
            ref = parts[open_idx]
            if ref.entry_count + len(new) <= cap:
                parts[open_idx] = _part(store, current, partition, store.load_part(ref, current.schema) + new)
                continue
            parts[open_idx] = replace(ref, sealed=True)
        for start in range(0, len(new), cap):
            parts.append(_part(store, current, partition, new[start : start + cap]))

    manifest_path = store.new_list_path(version)
    rows = sum(p.live_rows for p in parts)
    entry = HistoryEntry(version, manifest_path, now_ms(), change.operation, change.rows_added, rows_deleted, rows)
    return ManifestList(
        table_uuid=current.table_uuid,
        version=version,
        parent=current_path,
        timestamp_ms=entry.timestamp_ms,
        operation=change.operation,
        schema=current.schema,
        options=current.options,
        parts=tuple(parts),
        history=(*current.history, entry),
        properties={**current.properties, **change.properties},
    )


def publish(
    store: ManifestStore, change: Change, *, max_attempts: int, base: tuple[Pointer, str] | None = None
) -> tuple[str, ManifestList]:
    """Commit ``change``; returns the new manifest's path and the manifest. Raises ContentionError when
    every attempt lost the race."""
    for attempt in range(max_attempts):
        pointer, etag = base if base is not None else store.read_pointer()
        base = None
        if pointer.table_uuid != change.table_uuid:
            raise TableNotFoundError("the table was dropped and re-created while this change was staged")
        current = store.load_list(pointer.manifest)
        if change.precondition is not None:
            change.precondition(current)
        ml = apply_change(current, pointer.manifest, change, store)
        path = ml.history[-1].manifest
        store.write_list(ml, path)
        try:
            store.swap_pointer(Pointer(ml.version, path, ml.table_uuid), etag)
            return path, ml
        except PreconditionFailedError:
            # A retried conditional put whose first response was lost reports 412 although it won:
            # the pointer then names our own manifest, and re-applying would commit twice.
            if store.read_pointer()[0].manifest == path:
                return path, ml
            backoff(attempt)
    raise ContentionError(
        f"commit lost the publish race {max_attempts} times; too many concurrent writers on this table"
    )
