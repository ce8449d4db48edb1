"""``RemoteTable``: a table behind a gateway, with the methods, arguments and result types of ``Supertable``.

Writes wait for visibility by default and return the version, like embedded
ones. ``wait=False`` returns as soon as the gateway accepted the write (in
suite mode: once the event log acknowledged it) and returns None; the handle
then remembers the write's position and passes it as ``wait_for`` on its next
read, so that read sees the write (read-your-writes) without every write
paying for the wait. What each method sends is built in ``remote/handle.py``,
shared with ``AsyncRemoteTable``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import Table
from superfile.remote.client import GatewayClient
from superfile.remote.handle import RemoteHandle
from superfile.search.request import SearchRequest
from superfile.validate import DEFAULT_RETENTION

__all__ = ["RemoteTable"]


class RemoteTable(RemoteHandle, Table):
    """A table served by a gateway. Obtain one from :class:`superfile.remote.RemoteConnection`."""

    def __init__(self, client: GatewayClient, info: Mapping[str, Any], pinned: int | None = None) -> None:
        """The table a gateway described (``GET /tables/{name}``), pinned at ``pinned`` if given."""
        super().__init__(info, pinned)
        self._client = client

    # -- metadata -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The latest version (once this handle's unwaited writes are visible), or the pinned one."""
        if self._pinned is not None:
            return self._pinned
        return self._client.call(self._version_call())

    @property
    def properties(self) -> dict[str, Any]:
        """Properties commits recorded (e.g. the event-log offsets the builder applied)."""
        return self._client.call(self._properties_call())

    def stats(self) -> dict[str, Any]:
        """Snapshot facts from the manifest, plus the gateway process's memory."""
        return self._client.call(self._stats_call())

    def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if none retained does)."""
        return self._client.call(self._idempotency_call(idempotency_key))

    def versions(self) -> list[dict[str, Any]]:
        """Every retained version (up to this handle's, if it is on a past one): number, time, operation, rows."""
        return self._client.call(self._versions_call())

    def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> RemoteTable:
        """A read-only handle on an earlier version (while it is retained), or on the version that was
        current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds)."""
        return RemoteTable(self._client, *self._client.call(self._checkout_call(version, as_of)))

    def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions (default to: the latest, or this handle's
        version), with ``_change`` ("insert"/"delete") and ``_id``; an update shows as both."""
        return self._client.call(self._changes_call(from_version, to_version, columns))

    # -- reads ----------------------------------------------------------------------------
    def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """The rows (matching ``where``) with ``columns``, streamed from the gateway as Arrow."""
        return self._client.call(self._scan_call(columns, where))

    def count_rows(self, where: str | None = None) -> int:
        """How many rows (match ``where``), counted by the gateway."""
        return self._client.call(self._count_call(where))

    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search on the gateway (``POST /tables/{name}/search/{kind}`` with the request's JSON)."""
        return self._client.call(self._search_call(request))

    # -- writes ---------------------------------------------------------------------------
    def append(self, data: Any, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Add rows; returns the version that includes them (None with ``wait=False`` in suite mode).
        A repeated ``idempotency_key`` adds nothing (embedded mode returns the first append's version).
        Every write travels with a request key (this one, or a fresh one per call), so the SDK's own retries
        after a lost answer never commit twice; give a key to make *your* retries safe too."""
        return self._client.call(self._append_call(data, wait, idempotency_key))

    def delete(self, where: str, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Delete every row matching the SQL predicate; returns the version (see ``append`` for ``wait`` and
        ``idempotency_key``)."""
        return self._client.call(self._delete_call(where, wait, idempotency_key))

    def update(self, where: str, data: Any, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Replace the rows matching ``where`` 1:1 by ``data``, keeping their ``_id``; returns the version."""
        return self._client.call(self._update_call(where, data, wait, idempotency_key))

    def restore(self, version: int, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Publish a retained version's contents as the newest version; returns that version (see ``append``
        for ``wait``; in suite mode the builder applies it in log order)."""
        return self._client.call(self._restore_call(version, wait, idempotency_key))

    # -- schema evolution -----------------------------------------------------------------
    def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """Add nullable columns, or not-null ones with ``defaults`` (what existing rows read); the gateway
        commits it. Returns the version; this handle's ``schema`` and ``options`` follow."""
        return self._client.call(self._add_columns_call(fields, defaults))

    def rename_column(self, old: str, new: str) -> int:
        """Rename a column (metadata only); returns the version."""
        return self._client.call(self._rename_column_call(old, new))

    def drop_columns(self, names: str | Sequence[str]) -> int:
        """Drop columns and their indexes; returns the version."""
        return self._client.call(self._drop_columns_call(names))

    def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """Widen a column's type (values unchanged); returns the version."""
        return self._client.call(self._alter_column_type_call(name, new_type))

    def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """A full-text index on a string column, usable at once; the gateway builds it into older superfiles in
        the background."""
        return self._client.call(self._create_fts_index_call(column, tokenizer))

    def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """A vector index on a not-null vector column, usable at once (built into older superfiles in the
        background)."""
        return self._client.call(self._create_vector_index_call(column, metric, index))

    def drop_index(self, column: str) -> int:
        """Drop a column's full-text or vector index; returns the version."""
        return self._client.call(self._drop_index_call(column))

    # -- maintenance ----------------------------------------------------------------------
    def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Compact: merge small superfiles per partition into ones of about ``target_rows`` rows (or sized from
        ``target_bytes``) and drop deleted rows; the gateway runs it. Returns counts and the version published."""
        return self._client.call(self._optimize_call(target_rows, target_bytes))

    def cleanup(
        self,
        older_than: datetime.timedelta | float = DEFAULT_RETENTION,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """Delete files no version of the last ``older_than`` (a timedelta or seconds) needs; returns files and
        bytes removed. Files younger than ``safety_margin`` (default: the window) are kept; the gateway refuses
        a margin below its minimum (``SUPERFILE_CLEANUP_MIN_AGE_S``)."""
        return self._client.call(self._cleanup_call(older_than, dry_run, safety_margin))

    def __repr__(self) -> str:
        return f"RemoteTable({self.name!r}{self._where()}, gateway={self._client.uri!r})"
