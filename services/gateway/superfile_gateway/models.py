"""Request bodies (pydantic): they validate the JSON shape (422) and document the API in OpenAPI."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Bm25Request",
    "CleanupRequest",
    "CountRequest",
    "CreateTableRequest",
    "DeleteRequest",
    "ExactMatchRequest",
    "HybridRequest",
    "OptimizeRequest",
    "PartitionModel",
    "PrefixRequest",
    "RestoreRequest",
    "ScanRequest",
    "SqlRequest",
    "TokenMatchRequest",
    "VectorRequest",
    "VectorSpec",
]


class _Body(BaseModel):
    # strict: JSON true is not the number 1, 2.0 is not a count, "5" is not a number (422 otherwise)
    model_config = ConfigDict(extra="forbid", strict=True)


class VectorSpec(_Body):
    dim: int
    metric: Literal["cosine", "l2", "dot"] = "cosine"
    index: dict[str, Any] = Field(default_factory=dict)


class PartitionModel(_Body):
    column: str
    transform: str = "identity"


class CreateTableRequest(_Body):
    """A table: ``schema`` as JSON fields or ``schema_ipc`` (base64 Arrow IPC schema, exact types), plus options."""

    name: str
    schema_: list[dict[str, Any]] | None = Field(
        None,
        alias="schema",
        description='[{"name": "title", "type": "string"}, {"name": "embedding", "type": "vector[384]"}, ...]',
    )
    schema_ipc: str | None = None
    fts_columns: list[str] | dict[str, str] = Field(default_factory=list)
    vector_columns: dict[str, int | VectorSpec] = Field(default_factory=dict)
    tokenizer: str | dict[str, str] = "english"
    partition: str | PartitionModel | None = None
    consistency: str = "strong"
    exist_ok: bool = False
    options: dict[str, Any] = Field(default_factory=dict, description="further TableOptions fields")


class Bm25Request(_Body):
    column: str
    query: str
    k: int = 10
    mode: str = "any"
    projection: list[str] | None = None


class PrefixRequest(_Body):
    column: str
    prefix: str
    k: int = 10
    projection: list[str] | None = None


class TokenMatchRequest(_Body):
    column: str
    tokens: str | list[str]
    mode: str = "and"
    projection: list[str] | None = None
    max_rows: int | None = Field(default=None, ge=1, description="at most this many rows (the gateway caps it)")


class ExactMatchRequest(_Body):
    column: str
    value: str
    projection: list[str] | None = None
    max_rows: int | None = Field(default=None, ge=1, description="at most this many rows (the gateway caps it)")


class VectorRequest(_Body):
    column: str
    vector: list[float]
    k: int = 10
    nprobe: int | None = None
    rerank: int | None = None
    filter: dict[str, Any] | None = Field(None, description='{"column": ..., "query": ..., "mode": "any"|"all"}')
    where: str | None = None
    projection: list[str] | None = None


class HybridRequest(_Body):
    """BM25 and vector kNN fused by reciprocal rank (the ``hybrid_search`` SQL table function)."""

    text_column: str
    query: str
    vector_column: str
    vector: list[float]
    k: int = 10
    projection: list[str] | None = None


class ScanRequest(_Body):
    columns: list[str] | None = None
    where: str | None = None


class CountRequest(_Body):
    where: str | None = None


class DeleteRequest(_Body):
    where: str


class SqlRequest(_Body):
    query: str
    memory_limit_bytes: int | None = Field(default=None, ge=1, description="tighter than the gateway's own limit")
    max_rows: int | None = Field(default=None, ge=1, description="tighter than the gateway's own cap")


class OptimizeRequest(_Body):
    """Compaction's target size: rows, or bytes (not both); neither means the table's ``max_rows_per_superfile``."""

    target_rows: int | None = Field(default=None, strict=True)
    target_bytes: int | None = Field(default=None, strict=True)


class CleanupRequest(_Body):
    """Garbage collection: keep what versions of the last ``older_than`` seconds need (default 7 days), and
    every file younger than ``safety_margin`` seconds (default: the window)."""

    older_than: float | None = Field(
        default=None, strict=True, description="retention window in seconds (default 604800: 7 days)"
    )
    safety_margin: float | None = Field(
        default=None, strict=True, description="unreferenced files younger than this stay (default: older_than)"
    )
    dry_run: bool = Field(default=False, strict=True)


class RestoreRequest(_Body):
    version: int = Field(strict=True)
