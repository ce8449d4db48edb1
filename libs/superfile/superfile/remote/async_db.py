"""``AsyncRemoteConnection``: :class:`RemoteConnection` as coroutines, for
``await superfile.connect_async("http://...")``."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import AsyncCatalog
from superfile.options import PartitionSpec
from superfile.remote.async_client import AsyncGatewayClient
from superfile.remote.async_table import AsyncRemoteTable
from superfile.remote.handle import (
    create_namespace_call,
    create_table_call,
    drop_call,
    drop_namespace_call,
    namespaces_call,
    open_table_call,
    sql_call,
    tables_call,
)

__all__ = ["AsyncRemoteConnection"]


class AsyncRemoteConnection(AsyncCatalog):
    """The catalog behind a gateway, awaited: the methods, results and typed errors of
    :class:`superfile.remote.RemoteConnection`. Use it from one event loop (its connection pool belongs to
    the loop that opened it); ``async with`` closes it."""

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
        max_connections: int = 64,
    ) -> None:
        """As :class:`RemoteConnection`; ``max_connections``: requests in flight at once."""
        self.uri = uri.rstrip("/")
        self.client = AsyncGatewayClient(
            self.uri,
            api_key=api_key,
            timeout=timeout,
            headers=headers,
            max_retries=max_retries,
            max_connections=max_connections,
        )

    async def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table the API key can see, sorted."""
        return await self.client.call(tables_call(namespace))

    async def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create a namespace (its parent must exist); tables in it are named ``name.table``."""
        await self.client.call(create_namespace_call(name, exist_ok))

    async def list_namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace the API key can see, or those directly inside ``parent``; sorted."""
        return await self.client.call(namespaces_call(parent))

    async def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace."""
        await self.client.call(drop_namespace_call(name))

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
    ) -> AsyncRemoteTable:
        """Create a table from a schema (or from ``data``, whose schema it takes and which it appends)."""
        call, data = create_table_call(
            name,
            schema,
            data,
            fts_columns=fts_columns,
            vector_columns=vector_columns,
            tokenizer=tokenizer,
            partition=partition,
            consistency=consistency,
            exist_ok=exist_ok,
            options=options,
        )
        info = await self.client.call(call)
        table = AsyncRemoteTable(self.client, info)
        if data is not None and info.get("created", True):
            await table.append(data)
        return table

    async def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> AsyncRemoteTable:
        """As :meth:`RemoteConnection.open_table`."""
        opened = await self.client.call(open_table_call(name, version, as_of, consistency))
        return AsyncRemoteTable(self.client, *opened)

    async def drop_table(self, name: str) -> None:
        """Remove a table (never retried: a repeated drop after a lost answer would find no table)."""
        await self.client.call(drop_call(name))

    async def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """As :meth:`RemoteConnection.sql`."""
        return await self.client.call(sql_call(query, memory_limit_bytes, max_rows))

    async def aclose(self) -> None:
        """Close the keep-alive connections to the gateway."""
        await self.client.aclose()

    async def __aenter__(self) -> AsyncRemoteConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncRemoteConnection({self.uri!r})"
