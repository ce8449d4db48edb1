"""Schema evolution (write scope): add, rename, retype and drop columns, create and drop full-text and vector
indexes. Each is one commit of metadata, which the gateway makes itself in both modes, as it does ``optimize``
(``docs/schema.md``, "Suite mode"); each answers the table's new description (``GET /tables/{name}``) with
the version that holds the change. Column names in paths are one URL-encoded segment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path
from pydantic import BaseModel, ConfigDict, Field
from superfile.errors import InvalidInputError
from superfile.evolution import default_of, plain_field
from superfile.remote.wire import parse_type, schema_from_b64, schema_from_json
from superfile.table import Supertable

from superfile_gateway.auth import Principal
from superfile_gateway.deps import GW, Auth
from superfile_gateway.gateway import Gateway

__all__ = ["router"]

router = APIRouter(tags=["schema"])

Column = Annotated[str, Path(description="the column's name (URL-encoded)")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AddColumnsRequest(_Body):
    """New columns: ``columns`` as JSON fields with ``defaults`` by name, or ``schema_ipc`` (a base64 Arrow IPC
    schema, exact types; a default in a field's ``superfile.default`` metadata, as the SDK sends it)."""

    columns: list[dict[str, Any]] | None = Field(
        None, description='[{"name": "tag", "type": "string"}, {"name": "n", "type": "int64", "nullable": false}]'
    )
    defaults: dict[str, Any] = Field(default_factory=dict, description='values existing rows read: {"n": 0}')
    schema_ipc: str | None = None


class AlterColumnRequest(_Body):
    """Exactly one change: ``name`` (rename), or the widened type as ``type`` (``int64``, ``large_string``,
    ...) or ``type_ipc`` (a base64 Arrow IPC schema of one field of that type)."""

    name: str | None = None
    type: str | None = None
    type_ipc: str | None = None


class DropColumnsRequest(_Body):
    columns: list[str]


class CreateIndexRequest(_Body):
    """A full-text index (``kind`` fts, with ``tokenizer``) or a vector index (``kind`` vector, with ``metric``
    and ``index`` parameters) on an existing column; built into older superfiles in the background."""

    column: str
    kind: Literal["fts", "vector"]
    tokenizer: str = "english"
    metric: Literal["cosine", "l2", "dot"] = "cosine"
    index: dict[str, Any] = Field(default_factory=dict)


def _evolve(gw: Gateway, p: Principal, name: str, op: str, run: Callable[[Supertable], int]) -> dict[str, Any]:
    """Run one schema change on the table (write scope) and describe the table as it left it."""

    def change(table: Supertable) -> dict[str, Any]:
        version = run(table)
        return {**gw.describe(table), "version": version}

    return gw.maintain(p, name, op, change)


@router.post("/tables/{name}/columns")
def add_columns(gw: GW, name: str, req: AddColumnsRequest, p: Auth) -> dict[str, Any]:
    """Add nullable columns, or not-null ones with defaults (what the rows already in the table read)."""
    if (req.columns is None) == (req.schema_ipc is None):
        raise InvalidInputError("give the new columns as columns (JSON fields) or schema_ipc, not both")
    if req.schema_ipc is not None:
        if req.defaults:
            raise InvalidInputError("with schema_ipc, defaults travel in the fields' metadata")
        given = schema_from_b64(req.schema_ipc)
        defaults = {f.name: value.as_py() for f in given if (value := default_of(f)) is not None}
        fields = [plain_field(f) for f in given]
    else:
        fields, defaults = list(schema_from_json(req.columns)), req.defaults
    return _evolve(gw, p, name, "add_columns", lambda t: t.add_columns(fields, defaults))


@router.patch("/tables/{name}/columns/{column:path}")
def alter_column(gw: GW, name: str, column: Column, req: AlterColumnRequest, p: Auth) -> dict[str, Any]:
    """Rename a column (``name``) or widen its type (``type`` / ``type_ipc``)."""
    given = [k for k in ("name", "type", "type_ipc") if getattr(req, k) is not None]
    if len(given) != 1:
        raise InvalidInputError("give exactly one of name (a rename), type or type_ipc (a new type)")
    if req.name is not None:
        new_name = req.name
        return _evolve(gw, p, name, "rename_column", lambda t: t.rename_column(column, new_name))
    if req.type_ipc is not None:
        typed = schema_from_b64(req.type_ipc)
        if len(typed) != 1:
            raise InvalidInputError("type_ipc must be a schema of exactly one field")
        new_type = typed.field(0).type
    else:
        assert req.type is not None
        new_type = parse_type(req.type)
    return _evolve(gw, p, name, "alter_column_type", lambda t: t.alter_column_type(column, new_type))


@router.delete("/tables/{name}/columns/{column:path}")
def drop_column(gw: GW, name: str, column: Column, p: Auth) -> dict[str, Any]:
    """Drop one column (and its index)."""
    return _evolve(gw, p, name, "drop_columns", lambda t: t.drop_columns([column]))


@router.post("/tables/{name}/columns/drop")
def drop_columns(gw: GW, name: str, req: DropColumnsRequest, p: Auth) -> dict[str, Any]:
    """Drop several columns in one commit."""
    return _evolve(gw, p, name, "drop_columns", lambda t: t.drop_columns(req.columns))


@router.post("/tables/{name}/indexes")
def create_index(gw: GW, name: str, p: Auth, req: Annotated[CreateIndexRequest, Body()]) -> dict[str, Any]:
    """Create a full-text or vector index on an existing column."""
    if req.kind == "fts":
        return _evolve(gw, p, name, "create_index", lambda t: t.create_fts_index(req.column, req.tokenizer))
    return _evolve(
        gw, p, name, "create_index", lambda t: t.create_vector_index(req.column, metric=req.metric, index=req.index)
    )


@router.delete("/tables/{name}/indexes/{column:path}")
def drop_index(gw: GW, name: str, column: Column, p: Auth) -> dict[str, Any]:
    """Drop a column's full-text or vector index (the column stays)."""
    return _evolve(gw, p, name, "drop_index", lambda t: t.drop_index(column))
