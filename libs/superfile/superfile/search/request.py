"""A search as one value: what the table handle, the SQL table functions, the SDK and the gateway pass.

Each kind is a frozen dataclass whose fields are exactly the JSON body of its REST route
(``POST /tables/{name}/search/{kind}``), so one definition gives the Python signature, the wire
format and the gateway's request schema. ``to_json``/``from_json`` round-trip a request through JSON
(``kind`` names the class). This module is pure data: the SDK imports it without the engine, and the
searcher (``table/search.py``) executes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from superfile.errors import InvalidInputError, InvalidOptionError, InvalidVectorError

__all__ = [
    "KINDS",
    "Bm25Search",
    "ExactMatch",
    "HybridSearch",
    "PrefixSearch",
    "SearchRequest",
    "TokenMatch",
    "VectorSearch",
]


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")


def _plain(column: object, vector: Any) -> Any:
    """A query vector as JSON numbers (numpy arrays included); the searcher checks its length and values."""
    try:
        return np.asarray(vector, dtype=np.float64).tolist()
    except (TypeError, ValueError):
        raise InvalidVectorError(f"query vector for {column!r} must be a list of numbers") from None


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """One search over a table's snapshot; ``projection`` names the columns returned beside ``_id`` and
    ``score`` (default: every column)."""

    kind: ClassVar[str]

    projection: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON body (plus ``kind``): lists and numbers only."""
        body: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            body[f.name] = getattr(self, f.name)
        if "vector" in body:
            body["vector"] = _plain(body.get("vector_column", body.get("column")), body["vector"])
        return body

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SearchRequest:
        """The request ``data`` describes; a typed error for an unknown kind or field, or a missing one."""
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"a search request is a JSON object, got {type(data).__name__}")
        kind = data.get("kind")
        cls = KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise InvalidInputError(f"unknown search kind {kind!r}; kinds: {sorted(KINDS)}")
        return cls.of(data)

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> SearchRequest:
        """This kind's request from its JSON body (``kind`` may be present)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(body) - names - {"kind"})
        if unknown:
            raise InvalidInputError(f"{cls.kind} search: unknown fields {unknown}; fields: {sorted(names)}")
        try:
            return cls(**{k: v for k, v in body.items() if k != "kind"})
        except TypeError as e:  # a required field missing
            raise InvalidInputError(f"{cls.kind} search: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Bm25Search(SearchRequest):
    """BM25 top-k over a full-text column with table-wide statistics; ``mode`` "any" matches rows with any
    query term, "all" only rows with every term."""

    kind: ClassVar[str] = "bm25"
    column: str
    query: str
    k: int = 10
    mode: str = "any"


@dataclass(frozen=True, kw_only=True)
class PrefixSearch(SearchRequest):
    """BM25 top-k with the query expanded as a term prefix (its most frequent expansions)."""

    kind: ClassVar[str] = "prefix"
    column: str
    prefix: str
    k: int = 10


@dataclass(frozen=True, kw_only=True)
class TokenMatch(SearchRequest):
    """Every row holding all (``and``) or any (``or``) of the tokens, unranked; more than ``max_rows`` is a
    QueryLimitError."""

    kind: ClassVar[str] = "token_match"
    column: str
    tokens: str | list[str]
    mode: str = "and"
    max_rows: int | None = None

    def __post_init__(self) -> None:
        _positive("max_rows", self.max_rows)


@dataclass(frozen=True, kw_only=True)
class ExactMatch(SearchRequest):
    """Every row whose stored value equals ``value`` exactly; more than ``max_rows`` is a QueryLimitError."""

    kind: ClassVar[str] = "exact_match"
    column: str
    value: str
    max_rows: int | None = None

    def __post_init__(self) -> None:
        _positive("max_rows", self.max_rows)


@dataclass(frozen=True, kw_only=True)
class VectorSearch(SearchRequest):
    """k nearest rows by the column's metric (score = distance). ``filter`` ({"column", "query", "mode"}) and
    ``where`` (a SQL predicate) restrict the candidates inside the ranking; ``nprobe`` and ``rerank`` trade
    recall for speed."""

    kind: ClassVar[str] = "vector"
    column: str
    vector: list[float]
    k: int = 10
    nprobe: int | None = None
    rerank: int | None = None
    filter: dict[str, Any] | None = None
    where: str | None = None


@dataclass(frozen=True, kw_only=True)
class HybridSearch(SearchRequest):
    """BM25 and vector kNN on one snapshot fused by reciprocal rank; score higher is better."""

    kind: ClassVar[str] = "hybrid"
    text_column: str
    query: str
    vector_column: str
    vector: list[float]
    k: int = 10


KINDS: dict[str, type[SearchRequest]] = {
    c.kind: c for c in (Bm25Search, PrefixSearch, TokenMatch, ExactMatch, VectorSearch, HybridSearch)
}
