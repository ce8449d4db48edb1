"""Request bodies (pydantic): they validate the JSON shape (422) and document the API in OpenAPI.

The search bodies are not written here: ``search_body`` generates each from its ``superfile.search.request``
dataclass, whose fields are exactly the body (``SEARCH_BODIES``: kind -> model).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model
from superfile.search.request import KINDS, SearchRequest

__all__ = [
    "SEARCH_BODIES",
    "CleanupRequest",
    "CountRequest",
    "CreateTableRequest",
    "DeleteRequest",
    "OptimizeRequest",
    "PartitionModel",
    "RestoreRequest",
    "ScanRequest",
    "SqlRequest",
    "VectorSpec",
    "search_body",
]


# strict: JSON true is not the number 1, 2.0 is not a count, "5" is not a number (422 otherwise)
_STRICT = ConfigDict(extra="forbid", strict=True)


class _Body(BaseModel):
    model_config = _STRICT


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


_FIELDS: dict[str, Callable[[], Any]] = {  # what a body adds to its dataclass's fields, by field name
    "max_rows": lambda: Field(ge=1, description="at most this many rows (the gateway caps it)"),
}


def search_body(cls: type[SearchRequest]) -> type[BaseModel]:
    """The strict body model of one search kind: the dataclass's fields with their types and defaults (its own
    fields first, then those every search has), its docstring as the description, named as the hand-written
    models were (``bm25`` -> ``Bm25Request``), so the OpenAPI document keeps its names."""
    hints = get_type_hints(cls)
    common = {f.name for f in dataclasses.fields(SearchRequest)}
    fields: dict[str, Any] = {}
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name in common):
        annotation = hints[f.name]
        if f.name in _FIELDS:
            annotation = Annotated[annotation, _FIELDS[f.name]()]
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (annotation, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (annotation, Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (annotation, ...)
    name = "".join(part.capitalize() for part in cls.kind.split("_")) + "Request"
    model: type[BaseModel] = create_model(
        name, __config__=_STRICT, __doc__=inspect.cleandoc(cls.__doc__ or ""), __module__=__name__, **fields
    )
    return model


SEARCH_BODIES: dict[str, type[BaseModel]] = {kind: search_body(cls) for kind, cls in KINDS.items()}
"""Each search kind's body model (``POST /tables/{name}/search/{kind}``)."""
