"""``AsyncRemoteTable``: :class:`RemoteTable` as coroutines (``superfile.connect_async("http://...")``).

Each method sends the request ``RemoteTable``'s does (built once, in ``remote/handle.py``) through the async
client, so the arguments, results, request keys, retries and typed errors are the same; searches from one event
loop run concurrently. ``version`` and ``properties`` ask the gateway, so here they are coroutine methods.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import AsyncTable
from superfile.remote.async_client import AsyncGatewayClient
from superfile.remote.handle import RemoteHandle
from superfile.search.request import SearchRequest
from superfile.validate import DEFAULT_RETENTION

__all__ = ["AsyncRemoteTable"]


class AsyncRemoteTable(RemoteHandle, AsyncTable):
    """A table served by a gateway, awaited. Obtain one from :class:`superfile.remote.AsyncRemoteConnection`."""

    def __init__(self, client: AsyncGatewayClient, info: Mapping[str, Any], pinned: int | None = None) -> None:
        """The table a gateway described (``GET /tables/{name}``), pinned at ``pinned`` if given."""
        super().__init__(info, pinned)
        self._client = client

    async def version(self) -> int:
        """The latest version (once this handle's unwaited writes are visible), or the pinned one."""
        if self._pinned is not None:
            return self._pinned
        return await self._client.call(self._version_call())

    async def properties(self) -> dict[str, Any]:
        """Properties commits recorded (e.g. the event-log offsets the builder applied)."""
        return await self._client.call(self._properties_call())

    async def stats(self) -> dict[str, Any]:
        """Snapshot facts from the manifest, plus the gateway process's memory."""
        return await self._client.call(self._stats_call())

    async def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if none retained does)."""
        return await self._client.call(self._idempotency_call(idempotency_key))

    async def versions(self) -> list[dict[str, Any]]:
        """Every retained version (up to this handle's, if it is on a past one): number, time, operation, rows."""
        return await self._client.call(self._versions_call())

    async def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> AsyncRemoteTable:
        """A read-only handle on an earlier version (while it is retained), or on the version that was
        current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds)."""
        return AsyncRemoteTable(self._client, *await self._client.call(self._checkout_call(version, as_of)))

    async def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions (default to: the latest, or this handle's
        version), with ``_change`` ("insert"/"delete") and ``_id``; an update shows as both."""
        return await self._client.call(self._changes_call(from_version, to_version, columns))

    async def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """The rows (matching ``where``) with ``columns``, streamed from the gateway as Arrow."""
        return await self._client.call(self._scan_call(columns, where))

    async def count_rows(self, where: str | None = None) -> int:
        """How many rows (match ``where``), counted by the gateway."""
        return await self._client.call(self._count_call(where))

    async def search(self, request: SearchRequest) -> pa.Table:
        """Run one search on the gateway (``POST /tables/{name}/search/{kind}`` with the request's JSON)."""
        return await self._client.call(self._search_call(request))

    async def append(self, data: Any, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """As :meth:`RemoteTable.append`: every write carries a request key, so a retry never commits twice."""
        return await self._client.call(self._append_call(data, wait, idempotency_key))

    async def delete(self, where: str, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """As :meth:`RemoteTable.delete`."""
        return await self._client.call(self._delete_call(where, wait, idempotency_key))

    async def update(
        self, where: str, data: Any, *, wait: bool = True, idempotency_key: str | None = None
    ) -> int | None:
        """As :meth:`RemoteTable.update`."""
        return await self._client.call(self._update_call(where, data, wait, idempotency_key))

    async def restore(self, version: int, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """As :meth:`RemoteTable.restore`."""
        return await self._client.call(self._restore_call(version, wait, idempotency_key))

    async def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """Add nullable columns, or not-null ones with ``defaults`` (what existing rows read); the gateway
        commits it. Returns the version; this handle's ``schema`` and ``options`` follow."""
        return await self._client.call(self._add_columns_call(fields, defaults))

    async def rename_column(self, old: str, new: str) -> int:
        """Rename a column (metadata only); returns the version."""
        return await self._client.call(self._rename_column_call(old, new))

    async def drop_columns(self, names: str | Sequence[str]) -> int:
        """Drop columns and their indexes; returns the version."""
        return await self._client.call(self._drop_columns_call(names))

    async def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """Widen a column's type (values unchanged); returns the version."""
        return await self._client.call(self._alter_column_type_call(name, new_type))

    async def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """A full-text index on a string column, usable at once; the gateway builds it into older superfiles in
        the background."""
        return await self._client.call(self._create_fts_index_call(column, tokenizer))

    async def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """A vector index on a not-null vector column, usable at once (built into older superfiles in the
        background)."""
        return await self._client.call(self._create_vector_index_call(column, metric, index))

    async def drop_index(self, column: str) -> int:
        """Drop a column's full-text or vector index; returns the version."""
        return await self._client.call(self._drop_index_call(column))

    async def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """As :meth:`RemoteTable.optimize` (never retried)."""
        return await self._client.call(self._optimize_call(target_rows, target_bytes))

    async def cleanup(
        self,
        older_than: datetime.timedelta | float = DEFAULT_RETENTION,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """As :meth:`RemoteTable.cleanup` (never retried)."""
        return await self._client.call(self._cleanup_call(older_than, dry_run, safety_margin))

    def __repr__(self) -> str:
        return f"AsyncRemoteTable({self.name!r}{self._where()}, gateway={self._client.uri!r})"
