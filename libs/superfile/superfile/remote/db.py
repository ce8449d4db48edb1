"""``RemoteConnection``: the Connection API against a gateway, for ``superfile.connect("http://...")``."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import Catalog
from superfile.options import PartitionSpec
from superfile.remote.client import GatewayClient
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
from superfile.remote.table import RemoteTable

__all__ = ["RemoteConnection"]


class RemoteConnection(Catalog):
    """The catalog behind a gateway. Same methods and result types as :class:`superfile.Connection`.

    Results travel as Arrow IPC streams; errors come back as the same typed
    exceptions (``superfile.errors``), plus :mod:`superfile.remote.errors` for
    what only HTTP has (401, 403, 413, 504, unreachable gateway).
    """

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
    ) -> None:
        """``api_key``: the gateway's API key (default: ``SUPERFILE_API_KEY`` from the environment).
        ``timeout``: seconds to wait for each answer. ``max_retries``: how often a request that is safe to
        repeat (a read, or a write with its request key) is sent again after no answer, a 429, 502 or 503,
        with jittered backoff (``Retry-After`` when the gateway gives it). Creating, dropping, optimizing and
        cleaning up are never repeated."""
        self.uri = uri.rstrip("/")
        self.client = GatewayClient(
            self.uri, api_key=api_key, timeout=timeout, headers=headers, max_retries=max_retries
        )

    # -- catalog ------------------------------------------------------------------------
    def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table the API key can see (or of those directly in ``namespace``), sorted."""
        return self.client.call(tables_call(namespace))

    def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create a namespace (its parent must exist); tables in it are named ``name.table``."""
        self.client.call(create_namespace_call(name, exist_ok))

    def list_namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace the API key can see, or those directly inside ``parent``; sorted."""
        return self.client.call(namespaces_call(parent))

    def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace."""
        self.client.call(drop_namespace_call(name))

    def create_table(
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
    ) -> RemoteTable:
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
        info = self.client.call(call)
        table = RemoteTable(self.client, info)
        if data is not None and info.get("created", True):
            table.append(data)
        return table

    def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> RemoteTable:
        """A handle on a table at its latest version, or read-only at an earlier ``version`` or at the version
        that was current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds; the gateway
        resolves it once, and the handle then stays on that version).

        ``consistency`` is not taken: the gateway reads with the table's own
        policy, and ``wait_for`` positions give read-your-writes.
        """
        return RemoteTable(self.client, *self.client.call(open_table_call(name, version, as_of, consistency)))

    def drop_table(self, name: str) -> None:
        """Remove a table (never retried: a repeated drop after a lost answer would find no table)."""
        self.client.call(drop_call(name))

    def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """Run one read-only SQL query (tables the API key cannot read do not exist for it), within the
        gateway's limits, tightened by ``memory_limit_bytes`` and ``max_rows``."""
        return self.client.call(sql_call(query, memory_limit_bytes, max_rows))

    def close(self) -> None:
        """Close the keep-alive connections to the gateway."""
        self.client.close()

    def __enter__(self) -> RemoteConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteConnection({self.uri!r})"
