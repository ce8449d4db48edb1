"""Publish: turn a staged change into a successor manifest and swing the pointer to it.

Optimistic concurrency: the change is applied to the manifest the pointer
named when it was read; if another commit swapped the pointer first, the
change is re-applied on top of the new manifest (the superfiles are already
built and uploaded, so a retry only rewrites metadata), with jittered backoff,
up to ``max_attempts`` times.

A :class:`~superfile.commit.change.Change` is a value (``commit/change.py``):
every attempt interprets it against the manifest it builds on, in this order:
the change's requirements are checked (``commit/requirements.py``; one that
fails aborts the commit), its idempotency keys are recorded
(``commit/idempotency.py``; one already there aborts it with
``AlreadyCommitted``), and its superfiles and deletes are applied.

Re-applying is a rebase, not a blind replay. Deletes name rows by offset in a
superfile *and* by ``_id``: when the superfile is gone from the newer manifest
(an ``optimize`` rewrote it) or the row is no longer live there (a concurrent
update moved it), the live row carrying that ``_id`` is found and the delete
applies to it (``Change.rebase``, ``commit/rebase.py``). A rewrite
(``optimize``) that finds rows newly deleted from its inputs moves those
deletes onto its outputs (``Change.carry``).

A lost answer never commits twice: objects are created with ``io.write_new``
(a retry that meets its own bytes is success), and a pointer swap that failed
is first looked for in the history before anything is re-applied
(``publish_with``); see docs/reliability.md.

An attempt's new objects (parts, deletion vectors, the list, and the superfiles of a writer's commit) are
uploaded concurrently (``manifest.store.uploads``) and settled, every one written and fsynced, before the
pointer swap: docs/reliability.md, "A commit's writes, in order".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pyroaring

from superfile.commit.change import Change, Deletion, StaleSuperfileError
from superfile.commit.idempotency import record_new
from superfile.commit.rebase import carried, follow
from superfile.commit.requirements import check_all
from superfile.errors import (
    CommitStateUnknownError,
    ContentionError,
    StorageError,
    TableNotFoundError,
)
from superfile.evolution import field_id, schema_id
from superfile.manifest.log import newest_first, next_history
from superfile.manifest.model import (
    DeletionRef,
    HistoryEntry,
    ManifestList,
    PartRef,
    Pointer,
    SuperfileEntry,
    now_ms,
)
from superfile.manifest.store import ManifestStore, PreparedPointer, backoff, settle, uploads
from superfile.manifest.summary import extended_ref, part_ref

__all__ = ["Change", "Deletion", "StaleSuperfileError", "apply_change", "locate", "publish", "publish_with"]


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


def locate(
    current: ManifestList, store: ManifestStore, touched: list[SuperfileEntry]
) -> dict[str, tuple[int, SuperfileEntry]]:
    """Where each touched superfile is in ``current``: (part index, entry as it is now); absent if gone.
    Only parts whose summaries may hold one are loaded."""
    wanted = {e.path: e for e in touched}
    found: dict[str, tuple[int, SuperfileEntry]] = {}
    for idx, ref in enumerate(current.parts):
        if len(found) == len(wanted):
            break
        if not any(_may_hold(ref, e) for p, e in wanted.items() if p not in found):
            continue
        for e in store.load_part(ref, current.schema):
            if e.path in wanted:
                found[e.path] = (idx, e)
    return found


def _part(store: ManifestStore, ml: ManifestList, partition: str | None, entries: list[SuperfileEntry]) -> PartRef:
    path, size = store.write_part(entries, ml.schema)
    return _sealed_if_full(ml, part_ref(path, partition, entries, size))


def _extended(store: ManifestStore, ml: ManifestList, ref: PartRef, new: list[SuperfileEntry]) -> PartRef:
    """The open part ``ref`` with ``new`` entries added: only they are encoded and summarized."""
    final = ref.entry_count + len(new) >= ml.options.manifest_part_max_entries
    path, size = store.extend_part(ref, new, ml.schema, final=final)
    return _sealed_if_full(ml, extended_ref(ref, path, new, size))


def _sealed_if_full(ml: ManifestList, ref: PartRef) -> PartRef:
    opts = ml.options
    sealed = ref.entry_count >= opts.manifest_part_max_entries or ref.byte_size >= opts.manifest_part_max_bytes
    return replace(ref, sealed=sealed)


def _rebase(
    current: ManifestList,
    change: Change,
    store: ManifestStore,
    pending: dict[str, pyroaring.BitMap],
    own: dict[str, pyroaring.BitMap],
    added_paths: set[str],
) -> dict[str, tuple[int, SuperfileEntry]]:
    """Point ``pending`` (this change's deletes of existing superfiles, by path) at where the rows are live in
    ``current``; rows found in this change's own superfiles go to ``own``. Returns where pending paths are."""
    staged = change.deletions
    where = locate(current, store, [staged[p].entry for p in pending])
    lost: list[np.ndarray] = []
    for path in list(pending):
        rows = pending[path]
        if path not in where:  # the superfile was rewritten (optimize) or restored away
            if change.rebase is None:
                raise StaleSuperfileError(
                    f"superfile {path!r} this change deletes from was removed by a concurrent commit"
                )
            lost.append(staged[path].ids_of(rows))
            del pending[path]
            continue
        now = where[path][1]
        if change.rebase is not None and now.deletes is not None and now.deletes != staged[path].entry.deletes:
            gone = rows & store.load_deletes(now.deletes.path)  # deleted there since staged (a delete or update)
            if len(gone):
                lost.append(staged[path].ids_of(gone))
                rows -= gone
                if not len(rows):
                    del pending[path]
    if not lost or change.rebase is None:
        return where
    moved: dict[str, SuperfileEntry] = {}
    for d in follow(current, store, change, np.concatenate(lost)):
        target = own if d.entry.path in added_paths else pending
        target.setdefault(d.entry.path, pyroaring.BitMap()).update(d.rows)
        if d.entry.path not in added_paths and d.entry.path not in where:
            moved[d.entry.path] = d.entry
    where.update(locate(current, store, list(moved.values())))
    return where


def apply_change(current: ManifestList, current_path: str, change: Change, store: ManifestStore) -> ManifestList:
    """The successor of ``current`` with ``change`` applied; writes new parts and deletion vectors."""
    version = current.version + 1
    # recorded on every attempt, against the manifest it builds on: raises AlreadyCommitted if one is there
    derived = record_new(store.storage, current, list(change.record_keys)) if change.record_keys else {}
    if change.schema is not None:
        return _evolved(current, current_path, change, store, derived)
    sid = schema_id(current.schema)
    # superfiles staged under an older schema (a schema change landed meanwhile) keep their own column names
    # in the file; their entries are keyed by the current names, like every entry this manifest reads
    added = [replace(e if e.schema_id == sid else e.as_of(current.schema), added_version=version) for e in change.added]
    added_paths = {e.path for e in added}
    rows_deleted = 0
    # copies: a retried attempt starts again from the change as staged
    pending = {p: pyroaring.BitMap(d.rows) for p, d in change.deletions.items() if len(d.rows)}
    own = {p: pending.pop(p) for p in list(pending) if p in added_paths}  # deletes of rows it adds
    removed = dict(change.removed)
    moved_here: dict[str, pyroaring.BitMap] = {}  # deletes carried from removed superfiles onto added ones

    slots: list[PartRef | None] = list(current.parts)
    where = _rebase(current, change, store, pending, own, added_paths) if pending else {}
    where.update(locate(current, store, list(removed.values())) if removed else {})
    if len(removed) > sum(p in where for p in removed):
        raise StaleSuperfileError(
            f"{sum(p not in where for p in removed)} superfile(s) this change replaces were removed by a "
            "concurrent commit"
        )
    for idx in sorted({idx for p, (idx, _) in where.items() if p in pending or p in removed}):
        ref = current.parts[idx]
        rewritten = []
        for e in store.load_part(ref, current.schema):
            if e.path in removed:
                for onto, moved in carried(removed.pop(e.path), e, change, store).items():
                    moved_here.setdefault(onto, pyroaring.BitMap()).update(moved)
                continue
            if e.path in pending:
                e, n = _with_deletes(e, pending.pop(e.path), store)
                rows_deleted += n
            rewritten.append(e)
        if rewritten:
            slots[idx] = replace(_part(store, current, ref.partition, rewritten), sealed=ref.sealed)
        else:
            slots[idx] = None  # every superfile of the part was replaced
    for i, e in enumerate(added):
        if e.path in own or e.path in moved_here:
            mine = own.get(e.path, pyroaring.BitMap())
            rows_deleted += len(mine)  # carried deletes were counted by the commit that made them
            added[i], _ = _with_deletes(e, pyroaring.BitMap(mine) | moved_here.get(e.path, pyroaring.BitMap()), store)
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
                parts[open_idx] = _extended(store, current, ref, new)
                continue
            parts[open_idx] = replace(ref, sealed=True)
        for start in range(0, len(new), cap):
            parts.append(_part(store, current, partition, new[start : start + cap]))

    manifest_path = store.new_list_path(version)
    rows = sum(p.live_rows for p in parts)
    timestamp = max(now_ms(), current.timestamp_ms)  # never before its parent: as_of lookups stay monotonic
    entry = HistoryEntry(version, manifest_path, timestamp, change.operation, change.rows_added, rows_deleted, rows)
    tail, segment, depth = next_history(store.storage, current, entry)
    return ManifestList(
        table_uuid=current.table_uuid,
        version=version,
        parent=current_path,
        timestamp_ms=entry.timestamp_ms,
        operation=change.operation,
        schema=current.schema,
        options=current.options,
        parts=tuple(parts),
        history_tail=tail,
        properties={**current.properties, **change.properties, **derived},
        history_segment=segment,
        history_depth=depth,
    )


def _evolved(
    current: ManifestList, current_path: str, change: Change, store: ManifestStore, derived: dict[str, object]
) -> ManifestList:
    """The successor of ``current`` with the schema and options of a schema change: metadata only. Part
    summaries move to the new column names (by field id); parts and superfiles are not touched."""
    assert change.schema is not None
    if change.added or change.deletions or change.removed:
        raise ValueError("a schema change carries no rows")
    new = change.schema.schema
    ids = {field_id(f): f.name for f in new if field_id(f)}
    names = {f.name: ids[field_id(f)] for f in current.schema if field_id(f) in ids}
    version = current.version + 1
    path = store.new_list_path(version)
    rows = current.rows
    entry = HistoryEntry(version, path, max(now_ms(), current.timestamp_ms), change.operation, 0, 0, rows)
    tail, segment, depth = next_history(store.storage, current, entry)
    return replace(
        current,
        version=version,
        parent=current_path,
        timestamp_ms=entry.timestamp_ms,
        operation=change.operation,
        schema=new,
        options=change.schema.options,
        parts=tuple(p.renamed(names) for p in current.parts),
        history_tail=tail,
        properties={**current.properties, **change.properties, **derived},
        history_segment=segment,
        history_depth=depth,
    )


def publish(
    store: ManifestStore, change: Change, *, max_attempts: int, base: tuple[Pointer, str] | None = None
) -> tuple[str, ManifestList]:
    """Commit ``change``; returns the new manifest's path and the manifest. Raises ContentionError when
    every attempt lost the race."""

    def successor(current: ManifestList, current_path: str) -> ManifestList:
        check_all(change.requires, current)  # raises RequirementFailedError: nothing is committed
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
    the next version if the pointer still names ``current``; otherwise it is rebuilt on the newer one.

    A swap that fails may still have landed: its answer was lost, or the storage client retried it and the
    retry met the pointer our own first try had moved (412). So every failed swap is resolved before it is
    retried: if the history since the swap's base names a manifest this commit wrote, that attempt is the
    commit (re-applying would commit twice). A swap whose answer was lost while the pointer still names its
    base may land later: it stays a candidate for every later check. When storage cannot be read to decide,
    or the last attempt's fate is open, :class:`CommitStateUnknownError` says what to look for.
    """
    written: dict[str, ManifestList] = {}  # manifests whose swap failed but may have landed
    # Bases of failed swaps no pointer read has settled yet: until the pointer is read past them (or names
    # ours), a lost answer or a 412 from the client's retry of our own swap may hide a landed commit.
    open_bases: set[str] = set()
    for attempt in range(max_attempts):
        try:
            pointer, etag = base if base is not None else store.read_pointer()
            base = None
            if written:  # every pointer read is checked: a swap whose answer was lost may have landed since
                landed = _in_history(store, written, pointer)
                if landed is not None:
                    return landed, written[landed]
                if pointer.manifest not in open_bases:  # read past them, without ours: none landed or can
                    open_bases.clear()
            if pointer.table_uuid != table_uuid:
                raise TableNotFoundError("the table was dropped and re-created while this change was staged")
            prepared: PreparedPointer | None = None
            with uploads():  # this attempt's parts, deletion vectors, list (and pointer's temp file) concurrently
                current = store.load_list(pointer.manifest)
                ml = successor(current, pointer.manifest)
                path = ml.history_tail[-1].manifest
                store.write_list(ml, path)
                prepared = store.prepare_pointer(Pointer(ml.version, path, ml.table_uuid))
                settle()  # with the superfiles of an enclosing writer's block: all durable before the swap
        except StorageError as err:
            if prepared is not None:
                store.discard_pointer(prepared)
            if not open_bases:
                raise  # every earlier swap is settled as not landed: nothing committed
            return _resolve(store, written, open_bases, f"storage failed while retrying: {err}", err)
        try:
            store.swap_pointer(prepared, etag)
            return path, ml
        except TableNotFoundError:
            raise
        except StorageError:
            written[path] = ml
            open_bases.add(pointer.manifest)
        if attempt + 1 < max_attempts:
            backoff(attempt)
    lost = ContentionError(
        f"commit lost the publish race {max_attempts} times; too many concurrent writers on this table"
    )
    if written:
        return _resolve(store, written, open_bases, "its last pointer swap got no answer and has not landed yet", lost)
    raise lost


_RESOLVE_ATTEMPTS = 6  # reads of the pointer and history to decide a failed swap (about 1.5 s of backoff)


def _in_history(store: ManifestStore, written: dict[str, ManifestList], pointer: Pointer) -> str | None:
    """Which of ``written`` the history up to ``pointer`` names (None: none of them)."""
    if pointer.manifest in written:
        return pointer.manifest
    oldest = min(ml.version for ml in written.values())
    if pointer.version < oldest:
        return None
    for entry in newest_first(store.storage, store.load_list(pointer.manifest)):  # reads back only this far
        if entry.version < oldest:
            break
        if entry.manifest in written:
            return entry.manifest
    return None


def _resolve(
    store: ManifestStore, written: dict[str, ManifestList], open_bases: set[str], why: str, failure: Exception
) -> tuple[str, ManifestList]:
    """The commit's outcome once no more attempts are made: one of ``written`` if it landed; ``failure`` when
    none can land any more (nothing committed); CommitStateUnknownError when one still may, or when storage
    cannot be read to tell."""
    for attempt in range(_RESOLVE_ATTEMPTS):
        try:
            pointer, _ = store.read_pointer()
            landed = _in_history(store, written, pointer)
        except TableNotFoundError:
            raise
        except StorageError as err:
            if attempt + 1 == _RESOLVE_ATTEMPTS:
                raise _unknown(store, written, f"{why}; then storage failed: {err}") from err
            backoff(attempt, base=0.05, cap=1.0)
            continue
        if landed is not None:
            return landed, written[landed]
        if pointer.manifest in open_bases:
            raise _unknown(store, written, why)
        raise failure
    raise AssertionError("unreachable")


def _unknown(store: ManifestStore, written: dict[str, ManifestList], why: str) -> CommitStateUnknownError:
    path, ml = next(reversed(written.items()))
    return CommitStateUnknownError(
        f"commit state unknown for table {store.storage.uri!r}: {why}. It committed if the table's history "
        f"names manifest {path!r} (as version {ml.version} or later); retry with the same idempotency key to "
        "commit it at most once",
        table=store.storage.uri,
        manifest=path,
        version=ml.version,
    )
