"""The contract both ways of running Supertable keep: ``Catalog`` (a connection's tables) and ``Table`` (one
table's reads, searches, writes and history).

The embedded classes (``Connection``, ``Supertable``) and the HTTP SDK's (``RemoteConnection``,
``RemoteTable``) subclass these protocols, so mypy checks that each side has every method with a
compatible signature, and code written against them (SQL, the gateway, the builder, the shared API
test suite) runs on either. Every search is one :class:`SearchRequest` given to ``Table.search``; the
keyword methods here (``bm25_search`` ...) only build that value, once for both sides.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Self

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

__all__ = ["Catalog", "Table"]


class Table(Protocol):
    """One table. Reads use the snapshot the table's consistency policy picks; a table opened at a version
    (``checkout``) is read-only."""

    name: str

    # -- metadata -----------------------------------------------------------------
    @property
    def version(self) -> int: ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def options(self) -> TableOptions: ...

    @property
    def properties(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def versions(self) -> list[dict[str, Any]]: ...

    def idempotency_version(self, idempotency_key: str) -> int | None: ...

    def checkout(self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None) -> Table:
        """A read-only table at an earlier retained version, or at the version current at ``as_of``."""
        ...

    # -- reads --------------------------------------------------------------------
    def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table: ...

    def count_rows(self, where: str | None = None) -> int: ...

    def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table: ...

    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search: ``_id``, ``score`` and the projected columns, best first."""
        ...

    # -- the searches as keyword calls: each builds its SearchRequest -----------------
    def bm25_search(
        self, column: str, query: str, k: int = 10, *, mode: str = "any", projection: list[str] | None = None
    ) -> pa.Table:
        """BM25 top-k over a full-text column with table-wide statistics, highest score first.
        ``mode`` "any" matches rows with any query term, "all" only rows with every term."""
        return self.search(Bm25Search(column=column, query=query, k=k, mode=mode, projection=projection))

    def bm25_search_prefix(
        self, column: str, prefix: str, k: int = 10, *, projection: list[str] | None = None
    ) -> pa.Table:
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
    ) -> pa.Table:
        """Every row containing all (``and``) or any (``or``) of the tokens: unranked, score null. More
        matches than ``max_rows`` is a :class:`QueryLimitError` (raised before any row is read)."""
        return self.search(
            TokenMatch(column=column, tokens=tokens, mode=mode, projection=projection, max_rows=max_rows)
        )

    def exact_match(
        self, column: str, value: str, *, projection: list[str] | None = None, max_rows: int | None = None
    ) -> pa.Table:
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
    ) -> pa.Table:
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
    ) -> pa.Table:
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

    # -- writes: each returns the version that holds it (None when a remote write is not waited for) ---
    def append(self, data: Any, *, idempotency_key: str | None = None) -> int | None: ...

    def delete(self, where: str, *, idempotency_key: str | None = None) -> int | None: ...

    def update(self, where: str, data: Any, *, idempotency_key: str | None = None) -> int | None: ...

    def restore(self, version: int, *, idempotency_key: str | None = None) -> int | None: ...

    # -- maintenance --------------------------------------------------------------
    def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]: ...

    def cleanup(
        self,
        older_than: datetime.timedelta | float = ...,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]: ...


class Catalog(Protocol):
    """The tables below one root: a storage URI (embedded) or a gateway (remote)."""

    uri: str

    def table_names(self) -> list[str]: ...

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
    ) -> Table: ...

    def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> Table: ...

    def drop_table(self, name: str) -> None: ...

    def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
