"""Following rows by ``_id``: where a change's deletes apply when concurrent commits moved their rows.

Publish calls these on an attempt that finds the table changed under the change (``commit/publish.py``):

- :func:`follow` (a :class:`~superfile.commit.change.Rebase`): rows a change deletes that are no longer
  live where it staged that (the superfile was rewritten by ``optimize`` or restored away, or a concurrent
  update or delete removed the row there) are looked up by ``_id`` among the live rows of the manifest the
  attempt builds on. A row that is nowhere live was deleted concurrently; if this change's update replaced
  it, the replacement (a row of the change's own added superfiles with the same ``_id``) is deleted too,
  so an update of a concurrently deleted row adds nothing.
- :func:`carried` (a :class:`~superfile.commit.change.Carry`): rows deleted from a superfile a rewrite
  replaces, after the rewrite read it, are deleted from the rewrite's outputs (mapped through ``_id``).

Both read only the ``_id`` section of superfiles (:func:`read_ids`: one ranged read, checked against the
CRC-32 the manifest entry records) from the manifest store's storage, and the deletion vectors through the
store: this layer needs no table handle, so a change can be published from its description alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import pyroaring

from superfile.commit.change import Change, Deletion, StaleSuperfileError, bitmap_of, id_array, offsets_of
from superfile.errors import CorruptSuperfileError, ObjectNotFoundError, SuperfileMissingError
from superfile.format import SuperfileReader
from superfile.format.layout import IDS_SECTION
from superfile.manifest.model import ManifestList, SuperfileEntry
from superfile.manifest.store import ManifestStore, settle
from superfile.pools import query_pool

__all__ = ["carried", "follow", "holding", "live_offsets", "read_ids"]

T = TypeVar("T")
R = TypeVar("R")


def _map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` on the query pool (inline for a single item), as a snapshot's reads run."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    return list(query_pool().map(fn, items))


def read_ids(store: ManifestStore, entry: SuperfileEntry, offsets: np.ndarray | None = None) -> np.ndarray:
    """The ``_id`` of the rows at ``offsets`` of one superfile (default: every row), from its raw id section."""
    storage = store.storage
    name = f"{storage.uri.rstrip('/')}/{entry.path}"
    section = entry.sections.get(IDS_SECTION)
    try:
        if section is None:  # not recorded in the entry: open the superfile itself
            local = storage.local_path(entry.path)
            raw = SuperfileReader.open(local if local is not None else storage.read(entry.path), name=name).ids()
        else:
            data = storage.read_range(entry.path, section.offset, section.length)
            if zlib.crc32(data) != section.crc32:
                raise CorruptSuperfileError(name, f"section {IDS_SECTION!r} does not match its recorded crc32")
            raw = np.frombuffer(data, "<u8")
    except (FileNotFoundError, ObjectNotFoundError):
        raise SuperfileMissingError(entry.path, table=storage.uri) from None
    ids = np.asarray(raw, np.uint64)
    return ids if offsets is None else ids[offsets]


def _deleted(store: ManifestStore, entry: SuperfileEntry) -> pyroaring.AbstractBitMap:
    return store.load_deletes(entry.deletes.path) if entry.deletes is not None else pyroaring.FrozenBitMap()


def live_offsets(store: ManifestStore, entry: SuperfileEntry) -> np.ndarray:
    """Offsets of the rows of ``entry`` its deletion vector leaves live, ascending."""
    deleted = _deleted(store, entry)
    if not len(deleted):
        return np.arange(entry.rows, dtype=np.int64)
    return offsets_of(pyroaring.BitMap(deleted).flip(0, entry.rows))


def _may_hold(ids: np.ndarray, id_min: int, id_max: int) -> bool:
    """Whether some of ``ids`` (sorted) lie in ``[id_min, id_max]``."""
    return bool(np.searchsorted(ids, id_max, "right") > np.searchsorted(ids, id_min, "left"))


def holding(
    store: ManifestStore,
    entries: Sequence[SuperfileEntry],
    ids: np.ndarray,
    skip: Mapping[str, pyroaring.AbstractBitMap],
) -> list[Deletion]:
    """The rows of ``entries`` that are live (and not in ``skip``) and carry one of ``ids`` (sorted, unique),
    as deletions. Reads the ``_id`` section of the superfiles whose ``_id`` range holds one of them (after the
    uploads of this thread's commit are settled: ``entries`` may be the ones it adds)."""
    settle()

    def one(e: SuperfileEntry) -> Deletion:
        offsets = live_offsets(store, e)
        if e.path in skip and len(skip[e.path]):
            offsets = offsets[~np.isin(offsets, offsets_of(skip[e.path]))]
        found = read_ids(store, e, offsets)
        hit = np.isin(found, ids)
        return Deletion.of(e, offsets[hit], found[hit])

    return [d for d in _map(one, [e for e in entries if _may_hold(ids, e.id_min, e.id_max)]) if len(d.rows)]


def _live_entries(current: ManifestList, store: ManifestStore, ids: np.ndarray) -> list[SuperfileEntry]:
    """The superfiles of ``current`` with live rows whose ``_id`` range may hold one of ``ids`` (sorted)."""
    parts = [p for p in current.parts if p.live_rows and _may_hold(ids, p.id_min, p.id_max)]
    loaded = _map(lambda p: store.load_part(p, current.schema), parts)
    return [e for entries in loaded for e in entries if e.live_rows and _may_hold(ids, e.id_min, e.id_max)]


def follow(current: ManifestList, store: ManifestStore, change: Change, lost: np.ndarray) -> list[Deletion]:
    """Where rows ``change`` deletes (by ``_id``: ``lost``), no longer live where it staged that, are live in
    ``current``; for those deleted there by a concurrent commit, the replacements its updates staged."""
    assert change.rebase is not None
    ids = np.unique(lost)
    found = holding(store, _live_entries(current, store, ids), ids, {})
    moved = np.concatenate([d.ids_of(d.rows) for d in found]) if found else np.zeros(0, np.uint64)
    orphans = np.intersect1d(np.setdiff1d(ids, moved), id_array(change.rebase.replaced))
    if not len(orphans):
        return found
    staged = {p: d.rows for p, d in change.deletions.items()}
    return found + holding(store, change.added, orphans, staged)


def carried(
    read: SuperfileEntry, now: SuperfileEntry, change: Change, store: ManifestStore
) -> dict[str, pyroaring.BitMap]:
    """Rows of ``read`` (a superfile ``change`` removes, as it read it) deleted since (``now``: its entry in
    the manifest being built on), as deletions of the change's added superfiles. Without a carry, or when
    rows came back (a restore), the change is stale."""
    if read.deletes == now.deletes:
        return {}
    if change.carry is None:
        raise StaleSuperfileError(f"superfile {read.path!r} this change replaces was changed by a concurrent commit")
    before, after = _deleted(store, read), _deleted(store, now)
    if not before.issubset(after):
        raise StaleSuperfileError(f"rows of superfile {read.path!r} came back while it was rewritten")
    newly = pyroaring.BitMap(after) - before
    ids = read_ids(store, read, offsets_of(newly))
    out: dict[str, pyroaring.BitMap] = {}
    for entry in change.added:
        raw = change.carry.ids.get(entry.path)
        here = ids[(ids >= entry.id_min) & (ids <= entry.id_max)]
        file_ids = id_array(raw) if raw is not None else np.zeros(0, np.uint64)
        if not len(here) or not len(file_ids):
            continue
        pos = np.searchsorted(file_ids, here)
        pos = pos[(pos < len(file_ids)) & (file_ids[np.minimum(pos, len(file_ids) - 1)] == here)]
        if len(pos):
            out[entry.path] = pyroaring.BitMap(bitmap_of(np.unique(pos)))
    return out
