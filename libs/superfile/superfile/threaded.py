"""The async API over an embedded catalog: each call runs the synchronous one in a worker thread
(``asyncio.to_thread``), so ``superfile.connect_async`` gives one awaitable API for every URI (``file://``,
``memory://``, ``s3://`` here; a gateway gets the httpx SDK, ``superfile.remote.AsyncRemoteConnection``).

The engine releases the GIL in its Arrow, Tantivy and vector kernels, so calls awaited together run in
parallel up to the default executor's threads. The wrapped objects do the work and raise the errors; these
classes only move the call off the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import AsyncCatalog, AsyncTable, Catalog, Table
from superfile.options import PartitionSpec, TableOptions
from superfile.search.request import SearchRequest
from superfile.validate import DEFAULT_RETENTION

__all__ = ["ThreadedCatalog", "ThreadedTable"]


class ThreadedTable(AsyncTable):
    """A :class:`Table` (a ``Supertable``) whose calls are awaited, each run in a worker thread."""

    def __init__(self, table: Table) -> None:
        self.name = table.name
        self.table = table  # the synchronous table, for what only it has (``transaction``, ``snapshot``)

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema, ``_id`` first."""
        return self.table.schema

    @property
    def options(self) -> TableOptions:
        """What the table was created with: full-text and vector columns, partitioning, consistency."""
        return self.table.options

    async def version(self) -> int:
        """The version reads see now (refreshing as the table's consistency policy says)."""
        return await asyncio.to_thread(lambda: self.table.version)

    async def properties(self) -> dict[str, Any]:
        """Properties commits recorded, as of this version."""
        return await asyncio.to_thread(lambda: self.table.properties)

    async def stats(self) -> dict[str, Any]:
        """Snapshot facts: rows, deleted rows, superfiles, bytes."""
        return await asyncio.to_thread(self.table.stats)

    async def versions(self) -> list[dict[str, Any]]:
        """Every retained version: number, time, operation, rows."""
        return await asyncio.to_thread(self.table.versions)

    async def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if no retained one did)."""
        return await asyncio.to_thread(self.table.idempotency_version, idempotency_key)

    async def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> ThreadedTable:
        """A read-only table at an earlier retained version, or at the version current at ``as_of``."""
        return ThreadedTable(await asyncio.to_thread(self.table.checkout, version, as_of=as_of))

    async def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """The rows (matching ``where``) with ``columns``."""
        return await asyncio.to_thread(self.table.to_arrow, columns, where)

    async def count_rows(self, where: str | None = None) -> int:
        """How many rows (match ``where``)."""
        return await asyncio.to_thread(self.table.count_rows, where)

    async def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions, with ``_change`` and ``_id``."""
        return await asyncio.to_thread(self.table.changes, from_version, to_version, columns=columns)

    async def search(self, request: SearchRequest) -> pa.Table:
        """Run one search: ``_id``, ``score`` and the projected columns, best first."""
        return await asyncio.to_thread(self.table.search, request)

    async def append(self, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """Add rows in one commit; returns its version (a repeated ``idempotency_key``: the first one's)."""
        return await asyncio.to_thread(self.table.append, data, idempotency_key=idempotency_key)

    async def delete(self, where: str, *, idempotency_key: str | None = None) -> int | None:
        """Delete every row matching the SQL predicate, in one commit."""
        return await asyncio.to_thread(self.table.delete, where, idempotency_key=idempotency_key)

    async def update(self, where: str, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """Replace the rows matching ``where`` 1:1 by ``data``, keeping their ``_id``."""
        return await asyncio.to_thread(self.table.update, where, data, idempotency_key=idempotency_key)

    async def restore(self, version: int, *, idempotency_key: str | None = None) -> int | None:
        """Publish a retained version's contents as the newest version."""
        return await asyncio.to_thread(self.table.restore, version, idempotency_key=idempotency_key)

    async def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """Add nullable columns, or not-null ones with defaults; returns the version."""
        return await asyncio.to_thread(self.table.add_columns, fields, defaults)

    async def rename_column(self, old: str, new: str) -> int:
        """Rename a column; returns the version."""
        return await asyncio.to_thread(self.table.rename_column, old, new)

    async def drop_columns(self, names: str | Sequence[str]) -> int:
        """Drop columns and their indexes; returns the version."""
        return await asyncio.to_thread(self.table.drop_columns, names)

    async def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """Widen a column's type; returns the version."""
        return await asyncio.to_thread(self.table.alter_column_type, name, new_type)

    async def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """A full-text index on a string column (built into older superfiles in the background)."""
        return await asyncio.to_thread(self.table.create_fts_index, column, tokenizer)

    async def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """A vector index on a vector column (built into older superfiles in the background)."""
        return await asyncio.to_thread(lambda: self.table.create_vector_index(column, metric=metric, index=index))

    async def drop_index(self, column: str) -> int:
        """Drop a column's full-text or vector index."""
        return await asyncio.to_thread(self.table.drop_index, column)

    async def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Merge small superfiles and drop deleted rows; returns counts and the version published."""
        return await asyncio.to_thread(self.table.optimize, target_rows, target_bytes=target_bytes)

    async def cleanup(
        self,
        older_than: datetime.timedelta | float = DEFAULT_RETENTION,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """Delete the files no version of the last ``older_than`` needs; returns what went."""
        return await asyncio.to_thread(self.table.cleanup, older_than, dry_run=dry_run, safety_margin=safety_margin)

    def __repr__(self) -> str:
        return f"ThreadedTable({self.table!r})"


class ThreadedCatalog(AsyncCatalog):
    """A :class:`Catalog` (a ``Connection``) whose calls are awaited, each run in a worker thread."""

    def __init__(self, catalog: Catalog) -> None:
        self.uri = catalog.uri
        self.catalog = catalog  # the synchronous connection, for what only it has (``upgrade_table`` ...)

    async def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table (or of those directly in ``namespace``), sorted."""
        return await asyncio.to_thread(self.catalog.table_names, namespace)

    async def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create a namespace (its parent must exist)."""
        await asyncio.to_thread(self.catalog.create_namespace, name, exist_ok=exist_ok)

    async def list_namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace, or those directly inside ``parent``; sorted."""
        return await asyncio.to_thread(self.catalog.list_namespaces, parent)

    async def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace."""
        await asyncio.to_thread(self.catalog.drop_namespace, name)

    async def create_table(
        self,
        name: str,
        schema: pa.Schema | None = None,
        data: Any = None,
        *,
        fts_columns: Sequence[str] | Mapping[str, str] = (),
        vector_columns: Mapping[str, Any] | None = None,
        tokenizer: str | Mapping[str, str] = "english",
        partition: str | Mapping[str, str] | PartitionSpec | None = None,
        consistency: str = "strong",
        exist_ok: bool = False,
        **options: Any,
    ) -> ThreadedTable:
        """Create a table from a schema (or from ``data``, whose schema it takes and which it appends)."""
        table = await asyncio.to_thread(
            lambda: self.catalog.create_table(
                name,
                schema,
                data,
                fts_columns=fts_columns,
                vector_columns=vector_columns,
                tokenizer=tokenizer,
                partition=partition,
                consistency=consistency,
                exist_ok=exist_ok,
                **options,
            )
        )
        return ThreadedTable(table)

    async def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> ThreadedTable:
        """A table at its latest version, or read-only at ``version`` or at the one current at ``as_of``."""
        table = await asyncio.to_thread(self.catalog.open_table, name, version, as_of=as_of, consistency=consistency)
        return ThreadedTable(table)

    async def drop_table(self, name: str) -> None:
        """Remove a table and its files."""
        await asyncio.to_thread(self.catalog.drop_table, name)

    async def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """Run one read-only SQL query over the tables and the search table functions."""
        return await asyncio.to_thread(
            self.catalog.sql, query, memory_limit_bytes=memory_limit_bytes, max_rows=max_rows
        )

    async def aclose(self) -> None:
        """Close the connection (stop its background maintenance)."""
        await asyncio.to_thread(self.catalog.close)

    async def __aenter__(self) -> ThreadedCatalog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"ThreadedCatalog({self.catalog!r})"
