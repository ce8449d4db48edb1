"""With a query service (``SUPERFILE_QUERY_URL``): routes that send reads there, included ahead of (so in place
of) the embedded ones. The query service answers with those same routes, so the API and its documentation do not
change; scope, admission and ``wait_for`` stay here (``Gateway.forward``). ``/version`` is not forwarded: the
position a write's ``wait_for`` names belongs to this gateway's write path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from superfile_gateway.auth import Principal
from superfile_gateway.deps import GW, Auth
from superfile_gateway.gateway import Gateway

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


async def _send(gw: Gateway, request: Request, principal: Principal, name: str | None, kind: str) -> Response:
    body = await request.body()
    return await run_in_threadpool(gw.forward, request, body, principal, name, kind)


@router.post("/tables/{name}/search/{kind}")
async def search(gw: GW, name: str, kind: str, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, name, kind)


@router.post("/tables/{name}/scan")
async def scan(gw: GW, name: str, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, name, "scan")


@router.post("/tables/{name}/count")
async def count(gw: GW, name: str, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, name, "count")


@router.get("/tables/{name}")
async def describe(gw: GW, name: str, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, name, "describe")


@router.get("/tables")
async def list_tables(gw: GW, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, None, "list")


def _table_read(what: str) -> Callable[..., Awaitable[Response]]:
    async def read(gw: GW, name: str, request: Request, p: Auth) -> Response:
        return await _send(gw, request, p, name, what)

    return read


for _what in ("stats", "properties", "idempotency", "versions", "changes"):
    router.add_api_route(f"/tables/{{name}}/{_what}", _table_read(_what), methods=["GET"])


@router.post("/sql")
async def sql(gw: GW, request: Request, p: Auth) -> Response:
    return await _send(gw, request, p, None, "sql")
