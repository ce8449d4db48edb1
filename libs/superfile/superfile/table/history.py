"""Versions over time: which are retained, the version at a point in time, and restoring an old one.

The history (version, manifest path, time, operation, row counts) is a tail in
each manifest list and segments behind it (``manifest/log.py``), read only when
asked for. ``cleanup()`` removes the manifests of versions that fell out of its
retention window and first records the oldest version it keeps in
``_retention.json``; versions below it are listed no more and cannot be opened
(``VersionNotFoundError``), and the next history checkpoint leaves them out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from superfile.commit.idempotency import AlreadyCommitted, committed_version, record_new
from superfile.commit.publish import publish_with
from superfile.errors import ObjectNotFoundError, VersionNotFoundError
from superfile.manifest.log import next_history, oldest_retained
from superfile.manifest.model import FORMAT_VERSION, HistoryEntry, ManifestList, now_ms
from superfile.manifest.store import ManifestStore
from superfile.table.changes import id_delta
from superfile.table.snapshot import Snapshot
from superfile.validate import check_key, check_version

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["restore", "upgrade"]


def upgrade(store: ManifestStore) -> int:
    """Rewrite the table's current version in the current format, as one commit (operation ``upgrade``; the
    contents, properties and retained versions stay); returns the version in the current format. Format 1
    lists carried the whole history: the upgrade moves it to a checkpoint (``manifest/log.py``)."""
    pointer, etag = store.read_pointer()
    current = store.load_list(pointer.manifest)
    if current.format_version >= FORMAT_VERSION:
        return current.version

    def successor(current: ManifestList, current_path: str) -> ManifestList:
        version = current.version + 1
        path = store.new_list_path(version)
        entry = HistoryEntry(version, path, max(now_ms(), current.timestamp_ms), "upgrade", 0, 0, current.rows)
        tail, segment, depth = next_history(store.storage, current, entry)
        return replace(
            current,
            version=version,
            parent=current_path,
            timestamp_ms=entry.timestamp_ms,
            operation="upgrade",
            history_tail=tail,
            history_segment=segment,
            history_depth=depth,
            format_version=FORMAT_VERSION,
        )

    _, manifest = publish_with(
        store,
        current.table_uuid,
        successor,
        max_attempts=current.options.commit_max_attempts,
        base=(pointer, etag),
    )
    return manifest.version


def restore(table: Supertable, version: int, idempotency_key: str | None = None) -> int:
    """Publish the contents of a retained ``version`` as the newest version (operation ``restore``).

    Metadata only: the new manifest references the old version's manifest
    parts. Commit properties (log offsets, idempotency keys) stay those of the
    current version, so a log consumer does not re-apply what it already did.
    A commit that lands while the restore is staged is overwritten too (the
    restore rebuilds on it and still publishes the old contents). The history
    entry counts rows by ``_id``: added = ``_id``s live after but not before.
    A repeated ``idempotency_key`` publishes nothing and returns the version that committed it.
    """
    target_entry = table.history_entry(check_version(version))
    files = table.files
    store = files.manifests
    keys = [check_key(idempotency_key)] if idempotency_key is not None else []
    try:
        target = store.load_list(target_entry.manifest)
    except ObjectNotFoundError:
        raise VersionNotFoundError(f"table {table.name!r} version {version} is no longer retained") from None
    snap, pointer = table.writable_snapshot()
    done = committed_version(files.storage, snap.manifest.properties, keys)
    if done is not None:
        return done
    if snap.manifest.parts == target.parts:
        return snap.version
    target_snap = Snapshot(files, target_entry.manifest, target)

    def successor(current: ManifestList, current_path: str) -> ManifestList:
        # a cleanup that expired the target since it was read may be deleting its files: do not publish them
        if oldest_retained(files.storage) > target.version:
            raise VersionNotFoundError(f"table {table.name!r} version {version} is no longer retained")
        new_version = current.version + 1
        path = store.new_list_path(new_version)
        added, deleted = id_delta(Snapshot(files, current_path, current), target_snap)
        stamp = max(now_ms(), current.timestamp_ms)
        entry = HistoryEntry(new_version, path, stamp, "restore", added, deleted, target.rows)
        tail, segment, depth = next_history(files.storage, current, entry)
        return ManifestList(
            table_uuid=current.table_uuid,
            version=new_version,
            parent=current_path,
            timestamp_ms=entry.timestamp_ms,
            operation="restore",
            schema=current.schema,
            options=current.options,
            parts=target.parts,
            history_tail=tail,
            properties={**current.properties, **(record_new(files.storage, current, keys) if keys else {})},
            history_segment=segment,
            history_depth=depth,
        )

    try:
        path, manifest = publish_with(
            store,
            snap.manifest.table_uuid,
            successor,
            max_attempts=snap.manifest.options.commit_max_attempts,
            base=pointer,
        )
    except AlreadyCommitted as repeat:  # a concurrent request with the same key committed first
        return max(repeat.keys.values())
    table.advance(path, manifest)
    return manifest.version
