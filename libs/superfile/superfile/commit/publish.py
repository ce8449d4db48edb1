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

__all__ = ["Change", "Deletion", "StaleSuperfileError", "apply_change", "publish", "publish_with"]


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
    # Superfiles this change replaces (optimize), by path, as the change read them.
    removed: dict[str, SuperfileEntry] = field(default_factory=dict)
    # Maps rows newly deleted (concurrently) from a removed superfile to deletions of added superfiles,
    # so a delete that raced the rewrite still applies; without it such a race is a StaleSuperfileError.
    carry: Callable[[SuperfileEntry, pyroaring.BitMap], dict[str, pyroaring.BitMap]] | None = None
    # Properties computed against the manifest being built on, on every attempt; may raise to abort.
    derive_properties: Callable[[ManifestList], dict[str, Any]] | None = None

    @property
    def rows_added(self) -> int:
        """Rows the change adds to the table's content (a rewrite that keeps the content adds none)."""
        return sum(e.rows for e in self.added) - sum(e.live_rows for e in self.removed.values())

    def is_empty(self) -> bool:
        return (
            not self.added
            and not self.removed
            and not any(len(d.rows) for d in self.deletions.values())
            and not self.properties
        )


def _with_deletes(
    entry: SuperfileEntry, rows: pyroaring.AbstractBitMap, store: ManifestStore
) -> tuple[SuperfileEntry, int]:
    old = store.load_deletes(entry.deletes.path) if entry.deletes else pyroaring.FrozenBitMap()
    merged = pyroaring.BitMap(old) | rows
    newly = len(merged) - len(old)
    if not newly:
        return entry, 0
    return replace(entry, deletes=DeletionRef(store.write_deletes(merged), len(merged))), newly


def _carry(
    read: SuperfileEntry,
    now: SuperfileEntry,
    change: Change,
    store: ManifestStore,
    carried: dict[str, pyroaring.BitMap],
) -> None:
    """Deletes that landed on a removed superfile after the change read it, moved onto the added superfiles."""
    if read.deletes == now.deletes:
        return
    before = store.load_deletes(read.deletes.path) if read.deletes else pyroaring.FrozenBitMap()
    after = store.load_deletes(now.deletes.path) if now.deletes else pyroaring.FrozenBitMap()
    if change.carry is None or not before.issubset(after):  # no mapping, or rows came back (a restore)
        raise StaleSuperfileError(f"superfile {read.path!r} this change replaces was changed by a concurrent commit")
    for path, rows in change.carry(read, pyroaring.BitMap(after - before)).items():
        carried.setdefault(path, pyroaring.BitMap()).update(rows)


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
    derived = change.derive_properties(current) if change.derive_properties is not None else {}
    added = [replace(e, added_version=version) for e in change.added]
    rows_deleted = 0
    pending = {p: d for p, d in change.deletions.items() if len(d.rows)}
    own = {e.path: pending.pop(e.path).rows for e in added if e.path in pending}  # deletes of rows it adds
    removed = dict(change.removed)
    carried: dict[str, pyroaring.BitMap] = {}

    slots: list[PartRef | None] = list(current.parts)
    if pending or removed:
        for idx, ref in enumerate(current.parts):
            touched = [d.entry for d in pending.values()] + list(removed.values())
            if not any(_may_hold(ref, e) for e in touched):
                continue
            entries = store.load_part(ref, current.schema)
            if not any(e.path in pending or e.path in removed for e in entries):
                continue
            rewritten = []
            for e in entries:
                if e.path in removed:
                    _carry(removed.pop(e.path), e, change, store, carried)
                    continue
                if e.path in pending:
                    e, n = _with_deletes(e, pending.pop(e.path).rows, store)
                    rows_deleted += n
                rewritten.append(e)
            if rewritten:
                slots[idx] = replace(_part(store, current, ref.partition, rewritten), sealed=ref.sealed)
            else:
                slots[idx] = None  # every superfile of the part was replaced
        if pending or removed:
            raise StaleSuperfileError(
                f"{len(pending) + len(removed)} superfile(s) this change deletes from or replaces were removed "
                "by a concurrent commit"
            )
    for i, e in enumerate(added):
        if e.path in own or e.path in carried:
            mine = own.get(e.path, pyroaring.BitMap())
            rows_deleted += len(mine)  # carried deletes were counted by the commit that made them
            added[i], _ = _with_deletes(e, pyroaring.BitMap(mine) | carried.get(e.path, pyroaring.BitMap()), store)
    parts = [p for p in slots if p is not None]

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
        properties={**current.properties, **change.properties, **derived},
    )


def publish(
    store: ManifestStore, change: Change, *, max_attempts: int, base: tuple[Pointer, str] | None = None
) -> tuple[str, ManifestList]:
    """Commit ``change``; returns the new manifest's path and the manifest. Raises ContentionError when
    every attempt lost the race."""

    def successor(current: ManifestList, current_path: str) -> ManifestList:
        if change.precondition is not None:
            change.precondition(current)
        return apply_change(current, current_path, change, store)

    return publish_with(store, change.table_uuid, successor, max_attempts=max_attempts, base=base)


def publish_with(
    store: ManifestStore,
    table_uuid: str,
    successor: Callable[[ManifestList, str], ManifestList],
    *,
    max_attempts: int,
    base: tuple[Pointer, str] | None = None,
) -> tuple[str, ManifestList]:
    """The guarded commit: ``successor(current, current_path)`` (which writes what it references) becomes
    the next version if the pointer still names ``current``; otherwise it is rebuilt on the newer one."""
    for attempt in range(max_attempts):
        pointer, etag = base if base is not None else store.read_pointer()
        base = None
        if pointer.table_uuid != table_uuid:
            raise TableNotFoundError("the table was dropped and re-created while this change was staged")
        current = store.load_list(pointer.manifest)
        ml = successor(current, pointer.manifest)
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
