"""With a query service (``SUPERFILE_QUERY_URL``): routes that send reads there, included ahead of (so in place
of) the embedded ones. The query service answers with those same routes, so the API and its documentation do not
change; scope, admission and ``wait_for`` stay here (``Gateway.forward``). ``/version`` is not forwarded: the
position a write's ``wait_for`` names belongs to this gateway's write path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from superfile.errors import SuperfileError

from superfile_gateway.auth import Principal, refuse_keys_in_url
from superfile_gateway.deps import GW, Auth, caller
from superfile_gateway.errors import error_of
from superfile_gateway.gateway import Gateway

__all__ = ["ForwardFirst", "router"]

router = APIRouter(include_in_schema=False)


async def _send(gw: Gateway, request: Request, principal: Principal, name: str | None, kind: str) -> Response:
    body = await request.body()
    return await run_in_threadpool(gw.forward, request, body, principal, name, kind)


_SEARCH = "/tables/{name}/search/{kind}"


@router.post(_SEARCH)
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


class ForwardFirst:
    """The forwarding gateway's search route (``POST /tables/{name}/search/{kind}``, ``routes/forward.py``) ahead of
    FastAPI's routing: a pure ASGI layer inside ``Guard`` (which still limits the body and counts the request under
    the route's path). Every search a client sends goes this way, so it skips the router and the dependency
    machinery: the same steps with the same functions (the caller's key, ``Gateway.forward``: scope, admission,
    ``wait_for``, the query service's answer), and an error answered as the app's handlers answer it. A request
    whose key is refused goes to the app, which answers it as it answers every request."""

    def __init__(self, app: ASGIApp, *, gw: Gateway) -> None:
        self.app = app
        self.gw = gw
        self.route: BaseRoute = next(r for r in router.routes if getattr(r, "path", None) == _SEARCH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts: list[str] = scope["path"].split("/") if scope["type"] == "http" and scope["method"] == "POST" else []
        if len(parts) != 5 or parts[1] != "tables" or parts[3] != "search" or not parts[2] or not parts[4]:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            refuse_keys_in_url(request.query_params.keys())
            who = caller(self.gw, request.headers)
        except SuperfileError:
            await self.app(scope, receive, send)  # the app's 400 or 401 (the body is still unread)
            return
        scope["route"] = self.route  # as the router sets it on a match: Guard counts the request by its path
        body = await request.body()
        response: Response
        try:
            response = await run_in_threadpool(self.gw.forward, request, body, who, parts[2], parts[4])
        except Exception as exc:
            response = error_of(exc, self.gw.errors, f"POST {scope['path']}")
        await response(scope, receive, send)
