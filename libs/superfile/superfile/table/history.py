"""Versions over time: which are retained, the version at a point in time, and restoring an old one.

Every manifest list carries the table's whole history (version, manifest
path, time, operation, row counts). ``cleanup()`` removes the manifests of
versions that fell out of its retention window and first records the oldest
version it keeps in ``_retention.json``; versions below it are listed no more
and cannot be opened (``VersionNotFoundError``).
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

import pyroaring

from superfile.commit.publish import publish_with
from superfile.errors import InvalidInputError, ObjectNotFoundError, VersionNotFoundError
from superfile.io import Storage
from superfile.manifest.model import HistoryEntry, ManifestList, SuperfileEntry, now_ms
from superfile.manifest.store import ManifestStore

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["RETENTION", "entries_by_path", "oldest_retained", "restore", "row_delta", "set_oldest_retained", "to_ms"]

RETENTION = "_retention.json"


def oldest_retained(storage: Storage) -> int:
    """The oldest version cleanup has not expired (1 if cleanup never ran)."""
    try:
        return int(json.loads(storage.read(RETENTION))["oldest_version"])
    except ObjectNotFoundError:
        return 1


def set_oldest_retained(storage: Storage, version: int) -> None:
    """Raise the retention mark (never lowers it: a slower concurrent cleanup may have computed less)."""
    if version > oldest_retained(storage):
        storage.write(RETENTION, json.dumps({"oldest_version": version, "at_ms": now_ms()}).encode())


def to_ms(as_of: datetime.datetime | int | float) -> int:
    """A point in time as epoch milliseconds: an aware datetime, a naive one (taken as UTC), or epoch ms."""
    if isinstance(as_of, datetime.datetime):
        if as_of.tzinfo is None:
            as_of = as_of.replace(tzinfo=datetime.UTC)
        return int(as_of.timestamp() * 1000)
    if isinstance(as_of, int | float) and not isinstance(as_of, bool):
        return int(as_of)
    raise InvalidInputError(f"as_of must be a datetime or epoch milliseconds, got {as_of!r}")


def entries_by_path(
    store: ManifestStore, ml: ManifestList, skip_parts: frozenset[str] = frozenset()
) -> dict[str, SuperfileEntry]:
    """Every superfile entry of a version by path, except those in the parts named in ``skip_parts``."""
    return {e.path: e for p in ml.parts if p.path not in skip_parts for e in store.load_part(p, ml.schema)}


def _deleted(store: ManifestStore, entry: SuperfileEntry) -> pyroaring.AbstractBitMap:
    return store.load_deletes(entry.deletes.path) if entry.deletes else pyroaring.FrozenBitMap()


def row_delta(store: ManifestStore, old: ManifestList, new: ManifestList) -> tuple[int, int]:
    """(rows visible in ``new`` but not ``old``, rows visible in ``old`` but not ``new``), by physical row."""
    shared = frozenset(p.path for p in old.parts) & frozenset(p.path for p in new.parts)
    a, b = entries_by_path(store, old, shared), entries_by_path(store, new, shared)
    added = sum(e.live_rows for p, e in b.items() if p not in a)
    deleted = sum(e.live_rows for p, e in a.items() if p not in b)
    for path in a.keys() & b.keys():
        if a[path].deletes != b[path].deletes:
            da, db = (_deleted(store, e) for e in (a[path], b[path]))
            added += len(da - db)
            deleted += len(db - da)
    return added, deleted


def restore(table: Supertable, version: int) -> int:
    """Publish the contents of a retained ``version`` as the newest version (operation ``restore``).

    Metadata only: the new manifest references the old version's manifest
    parts. Commit properties (log offsets, idempotency keys) stay those of the
    current version, so a log consumer does not re-apply what it already did.
    A commit that lands while the restore is staged is overwritten too (the
    restore rebuilds on it and still publishes the old contents).
    """
    target_entry = table._history_entry(version)
    store = table._files.manifests
    try:
        target = store.load_list(target_entry.manifest)
    except ObjectNotFoundError:
        raise VersionNotFoundError(f"table {table.name!r} version {version} is no longer retained") from None
    snap, pointer = table._writable_snapshot()
    if snap.manifest.parts == target.parts:
        return snap.version

    def successor(current: ManifestList, current_path: str) -> ManifestList:
        new_version = current.version + 1
        path = store.new_list_path(new_version)
        added, deleted = row_delta(store, current, target)
        entry = HistoryEntry(new_version, path, now_ms(), "restore", added, deleted, target.rows)
        return ManifestList(
            table_uuid=current.table_uuid,
            version=new_version,
            parent=current_path,
            timestamp_ms=entry.timestamp_ms,
            operation="restore",
            schema=current.schema,
            options=current.options,
            parts=target.parts,
            history=(*current.history, entry),
            properties=dict(current.properties),
        )

    path, manifest = publish_with(
        store,
        snap.manifest.table_uuid,
        successor,
        max_attempts=snap.manifest.options.commit_max_attempts,
        base=pointer,
    )
    table._published(path, manifest)
    return manifest.version
