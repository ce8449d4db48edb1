"""Writes: append, update (rows as JSON or an Arrow IPC stream), delete, restore. In embedded mode they commit
here; in suite mode they are events on the table's log (``superfile_gateway.writes``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from superfile.errors import InvalidInputError
from superfile.remote.wire import ARROW_STREAM, from_ipc
from superfile.table import Supertable

from superfile_gateway.deps import GW, Auth, RequestKey, Wait
from superfile_gateway.models import DeleteRequest, RestoreRequest
from superfile_gateway.strict_json import loads
from superfile_gateway.writes import WriteResult

__all__ = ["router"]

router = APIRouter(tags=["writes"])


def _rows(request: Request, body: bytes) -> tuple[Any, dict[str, Any]]:
    """The rows of a write body (Arrow IPC stream, or JSON: a list of objects or ``{"rows": [...], ...}``)
    and the other JSON fields."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == ARROW_STREAM:
        return from_ipc(body), {}
    if ctype not in ("", "application/json"):
        raise InvalidInputError(f"unsupported content type {ctype!r}: send application/json or {ARROW_STREAM}")
    doc = loads(body)  # NaN and infinities refused, as in every JSON body
    if isinstance(doc, list):
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        rest = {k: v for k, v in doc.items() if k != "rows"}
        return doc["rows"], rest
    raise InvalidInputError('the body must be a JSON list of row objects or {"rows": [...]}')


_WRITE_BODY = {  # the body append and update read themselves: JSON rows or an Arrow IPC stream
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"type": "array", "items": {"type": "object"}},
                        {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object"}}}},
                    ]
                }
            },
            ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post("/tables/{name}/append", openapi_extra=_WRITE_BODY)
async def append(
    gw: GW,
    name: str,
    request: Request,
    p: Auth,
    wait: Wait = True,
    idempotency_key: Annotated[
        str | None, Query(description="a repeated key adds nothing (the first append's rows stay)")
    ] = None,
    request_key: RequestKey = None,
) -> Response:
    body = await request.body()
    if idempotency_key is not None and request_key is not None and idempotency_key != request_key:
        raise InvalidInputError("the idempotency_key parameter and the Idempotency-Key header differ")
    key = idempotency_key if idempotency_key is not None else request_key

    def run(table: Supertable) -> WriteResult:
        rows, rest = _rows(request, body)
        if rest:
            raise InvalidInputError(f"unknown fields in an append body: {sorted(rest)}")
        return gw.writes.append(table, rows, wait=wait, idempotency_key=key)

    return await run_in_threadpool(gw.write, p, name, "append", run)


@router.post("/tables/{name}/update", openapi_extra=_WRITE_BODY)
async def update(
    gw: GW,
    name: str,
    request: Request,
    p: Auth,
    wait: Wait = True,
    where: Annotated[str | None, Query(description="the predicate (required with an Arrow body)")] = None,
    request_key: RequestKey = None,
) -> Response:
    body = await request.body()

    def run(table: Supertable) -> WriteResult:
        rows, rest = _rows(request, body)
        predicate = rest.pop("where", where)
        if rest:
            raise InvalidInputError(f"unknown fields in an update body: {sorted(rest)}")
        if not isinstance(predicate, str):
            raise InvalidInputError('an update needs "where" (in the JSON body or as a query parameter)')
        return gw.writes.update(table, predicate, rows, wait=wait, idempotency_key=request_key)

    return await run_in_threadpool(gw.write, p, name, "update", run)


@router.post("/tables/{name}/delete")
def delete(
    gw: GW, name: str, req: DeleteRequest, p: Auth, wait: Wait = True, request_key: RequestKey = None
) -> Response:
    return gw.write(p, name, "delete", lambda t: gw.writes.delete(t, req.where, wait=wait, idempotency_key=request_key))


@router.post("/tables/{name}/restore")
def restore(
    gw: GW, name: str, req: RestoreRequest, p: Auth, wait: Wait = True, request_key: RequestKey = None
) -> Response:
    """Publish a retained version's contents as the newest version (suite mode: an event the builder
    applies in log order)."""
    return gw.write(
        p, name, "restore", lambda t: gw.writes.restore(t, req.version, wait=wait, idempotency_key=request_key)
    )
