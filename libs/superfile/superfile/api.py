"""The contract both ways of running Supertable keep: ``Catalog`` (a connection's tables) and ``Table`` (one
table's reads, searches, writes and history), and its awaitable twin ``AsyncCatalog``/``AsyncTable``
(``superfile.connect_async``).

The embedded classes (``Connection``, ``Supertable``) and the HTTP SDK's (``RemoteConnection``,
``RemoteTable``) subclass these protocols, so mypy checks that each side has every method with a
compatible signature, and code written against them (SQL, the gateway, the builder, the shared API
test suite) runs on either. Every search is one :class:`SearchRequest` given to ``Table.search``; the
keyword methods here (``bm25_search`` ...) only build that value, once for both sides and both ways of
calling (:class:`Searches`: the sync table's ``search`` returns rows, the async one's an awaitable of them).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

import pyarrow as pa

from superfile.options import PartitionSpec, TableOptions
from superfile.search.request import (
    Bm25Search,
    ExactMatch,
    HybridSearch,
    PrefixSearch,
    SearchRequest,
    TokenMatch,
    VectorSearch,
)

__all__ = ["AsyncCatalog", "AsyncTable", "Catalog", "Searches", "Table"]

R = TypeVar("R", covariant=True)


class Searches(Protocol[R]):
    """The searches as keyword calls, each building its :class:`SearchRequest` for ``search``. ``R`` is what
    ``search`` returns: rows for :class:`Table`, an awaitable of rows for :class:`AsyncTable`, so both get
    these methods from one definition (``await table.bm25_search(...)`` on an async table)."""

    def search(self, request: SearchRequest) -> R:
        """Run one search: ``_id``, ``score`` and the projected columns, best first."""
        ...

    def bm25_search(
        self, column: str, query: str, k: int = 10, *, mode: str = "any", projection: list[str] | None = None
    ) -> R:
        """BM25 top-k over a full-text column with table-wide statistics, highest score first.
        ``mode`` "any" matches rows with any query term, "all" only rows with every term."""
        return self.search(Bm25Search(column=column, query=query, k=k, mode=mode, projection=projection))

    def bm25_search_prefix(self, column: str, prefix: str, k: int = 10, *, projection: list[str] | None = None) -> R:
        """BM25 top-k where the query is expanded as a term prefix (the most frequent expansions)."""
        return self.search(PrefixSearch(column=column, prefix=prefix, k=k, projection=projection))

    def token_match(
        self,
        column: str,
        tokens: str | list[str],
        mode: str = "and",
        *,
        projection: list[str] | None = None,
        max_rows: int | None = None,
    ) -> R:
        """Every row containing all (``and``) or any (``or``) of the tokens: unranked, score null. More
        matches than ``max_rows`` is a :class:`QueryLimitError` (raised before any row is read)."""
        return self.search(
            TokenMatch(column=column, tokens=tokens, mode=mode, projection=projection, max_rows=max_rows)
        )

    def exact_match(
        self, column: str, value: str, *, projection: list[str] | None = None, max_rows: int | None = None
    ) -> R:
        """Every row whose stored value equals ``value`` exactly (index-pruned, then compared raw); more
        than ``max_rows`` is a :class:`QueryLimitError`."""
        return self.search(ExactMatch(column=column, value=value, projection=projection, max_rows=max_rows))

    def vector_search(
        self,
        column: str,
        vector: Any,
        k: int = 10,
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
        filter: dict[str, str] | None = None,
        where: str | None = None,
        projection: list[str] | None = None,
    ) -> R:
        """k nearest rows by the column's metric, nearest first (score = distance).

        ``filter`` ({"column", "query", "mode"}) and ``where`` (a SQL predicate)
        restrict the candidates inside the ranking: the k returned are the
        nearest rows that satisfy them. ``nprobe`` (clusters probed) and
        ``rerank`` (exactly re-scored candidates) trade recall for speed.
        """
        return self.search(
            VectorSearch(
                column=column,
                vector=vector,
                k=k,
                nprobe=nprobe,
                rerank=rerank,
                filter=filter,
                where=where,
                projection=projection,
            )
        )

    def hybrid_search(
        self,
        text_column: str,
        query: str,
        vector_column: str,
        vector: Any,
        k: int = 10,
        *,
        projection: list[str] | None = None,
    ) -> R:
        """BM25 and vector kNN on one snapshot fused by reciprocal rank (as the ``hybrid_search`` SQL table
        function), best first: ``_id``, ``score`` (higher is better), the projected columns."""
        return self.search(
            HybridSearch(
                text_column=text_column,
                query=query,
                vector_column=vector_column,
                vector=vector,
                k=k,
                projection=projection,
            )
        )


class Table(Searches[pa.Table], Protocol):
    """One table. Reads use the snapshot the table's consistency policy picks; a table opened at a version
    (``checkout``) is read-only."""

    name: str

    # -- metadata -----------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version reads see now (a checked-out table: its own)."""
        ...

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema, ``_id`` first."""
        ...

    @property
    def options(self) -> TableOptions:
        """What the table was created with: full-text and vector columns, partitioning, consistency."""
        ...

    @property
    def properties(self) -> dict[str, Any]:
        """Properties commits recorded (the builder's log offsets, the idempotency ledger), as of this version."""
        ...

    def stats(self) -> dict[str, Any]:
        """Snapshot facts (rows, deleted rows, superfiles, bytes), for sizing and deciding on ``optimize``."""
        ...

    def versions(self) -> list[dict[str, Any]]:
        """Every retained version: number, time, operation, rows added, deleted and in all."""
        ...

    def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if no retained one did): how a
        writer unsure whether its write landed finds out without writing again."""
        ...

    def checkout(self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None) -> Table:
        """A read-only table at an earlier retained version, or at the version current at ``as_of``."""
        ...

    # -- reads --------------------------------------------------------------------
    def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """The rows (those matching the SQL predicate ``where``), with ``columns`` or every column."""
        ...

    def count_rows(self, where: str | None = None) -> int:
        """How many rows (match ``where``), from the index and deletion vectors where they suffice."""
        ...

    def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions, with ``_change`` and ``_id``: a change
        feed to keep a copy in step without reading the table again."""
        ...

    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search: ``_id``, ``score`` and the projected columns, best first."""
        ...

    # -- writes: each returns the version that holds it (None when a remote write is not waited for) ---
    def append(self, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """Add rows (any Arrow stream, a pandas/polars frame, a list of dicts) in one commit; a repeated
        ``idempotency_key`` adds nothing and returns the first commit's version."""
        ...

    def delete(self, where: str, *, idempotency_key: str | None = None) -> int | None:
        """Delete every row matching the SQL predicate, in one commit."""
        ...

    def update(self, where: str, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """Replace the rows matching ``where`` 1:1 by ``data``, keeping their ``_id``, in one commit."""
        ...

    def restore(self, version: int, *, idempotency_key: str | None = None) -> int | None:
        """Publish a retained version's contents as the newest version (itself undoable)."""
        ...

    # -- schema evolution: each one commit of metadata, returning its version (docs/schema.md) -------------
    def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """Add columns at the end: nullable, or not null with a value in ``defaults`` that the rows already in
        the table (and appends leaving the column out) read. Nothing is rewritten."""
        ...

    def rename_column(self, old: str, new: str) -> int:
        """Rename a column; its indexes and partitioning follow it. Older versions keep the old name."""
        ...

    def drop_columns(self, names: str | Sequence[str]) -> int:
        """Drop columns with their indexes (not ``_id``, not the partition column); older versions keep them."""
        ...

    def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """Widen a column's type without changing any value (a wider int or float, int32 -> float64,
        string -> large_string, ...); anything else is a SchemaChangeError."""
        ...

    def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """A full-text index on a string column, usable at once: superfiles written before it are searched
        exactly until a background rewrite (or ``optimize``) builds it into them."""
        ...

    def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """A vector index on a not-null ``fixed_size_list<float32>[dim]`` column under ``metric`` (``index``:
        index parameters), usable at once, built into older superfiles in the background."""
        ...

    def drop_index(self, column: str) -> int:
        """Drop a column's full-text or vector index; the column and its values stay."""
        ...

    # -- maintenance --------------------------------------------------------------
    def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Merge small superfiles and drop deleted rows, so searches open fewer files; returns counts."""
        ...

    def cleanup(
        self,
        older_than: datetime.timedelta | float = ...,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """Delete the files no version of the last ``older_than`` needs, to reclaim storage; returns what
        went (``dry_run``: what would)."""
        ...


class Catalog(Protocol):
    """The tables below one root: a storage URI (embedded) or a gateway (remote)."""

    uri: str

    def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table (a remote caller: every table its API key can see), sorted; ``team.docs`` is
        table ``docs`` of namespace ``team``. With ``namespace``: the tables directly in it."""
        ...

    def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create a namespace (``team``, or ``team.search`` inside an existing ``team``)."""
        ...

    def list_namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace, or those directly inside ``parent``; full dotted names, sorted."""
        ...

    def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace (NamespaceNotEmptyError while it holds tables or namespaces)."""
        ...

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
    ) -> Table:
        """Create a table from a schema (or from ``data``, whose schema it takes and which it appends)."""
        ...

    def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> Table:
        """A table at its latest version, or read-only at ``version`` or at the one current at ``as_of``."""
        ...

    def drop_table(self, name: str) -> None:
        """Remove a table and its files."""
        ...

    def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """Run one read-only SQL query over the tables and the search table functions."""
        ...

    def close(self) -> None:
        """Release what the connection holds (background work, connection pools)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class AsyncTable(Searches[Awaitable[pa.Table]], Protocol):
    """:class:`Table` as coroutines (``superfile.connect_async``): the same methods, arguments, results and
    errors, awaited. What reads the table is a coroutine, so ``version`` and ``properties`` are methods here
    (``await table.version()``); ``schema`` and ``options`` are known once the table is open."""

    name: str

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema, ``_id`` first."""
        ...

    @property
    def options(self) -> TableOptions:
        """What the table was created with: full-text and vector columns, partitioning, consistency."""
        ...

    async def version(self) -> int:
        """As :attr:`Table.version`."""
        ...

    async def properties(self) -> dict[str, Any]:
        """As :attr:`Table.properties`."""
        ...

    async def stats(self) -> dict[str, Any]:
        """As :meth:`Table.stats`."""
        ...

    async def versions(self) -> list[dict[str, Any]]:
        """As :meth:`Table.versions`."""
        ...

    async def idempotency_version(self, idempotency_key: str) -> int | None:
        """As :meth:`Table.idempotency_version`."""
        ...

    async def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> AsyncTable:
        """As :meth:`Table.checkout` (a coroutine: resolving ``as_of`` reads the table's history)."""
        ...

    async def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """As :meth:`Table.to_arrow`."""
        ...

    async def count_rows(self, where: str | None = None) -> int:
        """As :meth:`Table.count_rows`."""
        ...

    async def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """As :meth:`Table.changes`."""
        ...

    async def search(self, request: SearchRequest) -> pa.Table:
        """Run one search: ``_id``, ``score`` and the projected columns, best first."""
        ...

    async def append(self, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """As :meth:`Table.append`."""
        ...

    async def delete(self, where: str, *, idempotency_key: str | None = None) -> int | None:
        """As :meth:`Table.delete`."""
        ...

    async def update(self, where: str, data: Any, *, idempotency_key: str | None = None) -> int | None:
        """As :meth:`Table.update`."""
        ...

    async def restore(self, version: int, *, idempotency_key: str | None = None) -> int | None:
        """As :meth:`Table.restore`."""
        ...

    async def add_columns(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
    ) -> int:
        """As :meth:`Table.add_columns`."""
        ...

    async def rename_column(self, old: str, new: str) -> int:
        """As :meth:`Table.rename_column`."""
        ...

    async def drop_columns(self, names: str | Sequence[str]) -> int:
        """As :meth:`Table.drop_columns`."""
        ...

    async def alter_column_type(self, name: str, new_type: pa.DataType) -> int:
        """As :meth:`Table.alter_column_type`."""
        ...

    async def create_fts_index(self, column: str, tokenizer: str = "english") -> int:
        """As :meth:`Table.create_fts_index`."""
        ...

    async def create_vector_index(
        self, column: str, *, metric: str = "cosine", index: Mapping[str, Any] | None = None
    ) -> int:
        """As :meth:`Table.create_vector_index`."""
        ...

    async def drop_index(self, column: str) -> int:
        """As :meth:`Table.drop_index`."""
        ...

    async def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """As :meth:`Table.optimize`."""
        ...

    async def cleanup(
        self,
        older_than: datetime.timedelta | float = ...,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """As :meth:`Table.cleanup`."""
        ...


class AsyncCatalog(Protocol):
    """:class:`Catalog` as coroutines; ``async with`` closes it (``aclose``)."""

    uri: str

    async def table_names(self, namespace: str | None = None) -> list[str]:
        """As :meth:`Catalog.table_names`."""
        ...

    async def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """As :meth:`Catalog.create_namespace`."""
        ...

    async def list_namespaces(self, parent: str | None = None) -> list[str]:
        """As :meth:`Catalog.list_namespaces`."""
        ...

    async def drop_namespace(self, name: str) -> None:
        """As :meth:`Catalog.drop_namespace`."""
        ...

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
    ) -> AsyncTable:
        """As :meth:`Catalog.create_table`."""
        ...

    async def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> AsyncTable:
        """As :meth:`Catalog.open_table`."""
        ...

    async def drop_table(self, name: str) -> None:
        """As :meth:`Catalog.drop_table`."""
        ...

    async def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """As :meth:`Catalog.sql`."""
        ...

    async def aclose(self) -> None:
        """As :meth:`Catalog.close`, awaiting the connection pool's shutdown."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...
