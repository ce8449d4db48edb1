"""Searches: one ``POST /tables/{name}/search/{kind}`` per kind of ``superfile.search.request``, generated.

Each route validates its body with the kind's generated model (``models.SEARCH_BODIES``), turns it into the
kind's request dataclass and runs it through ``Gateway.search`` (admission, the snapshot, limits, result caps).
:class:`SearchFirst` answers the common case of these routes ahead of FastAPI's routing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from superfile.search.request import KINDS, SearchRequest

from superfile_gateway.deps import GW, Auth, ReadAt, WaitFor, caller
from superfile_gateway.errors import error_of
from superfile_gateway.gateway import LATEST, Gateway
from superfile_gateway.guard import replay
from superfile_gateway.models import SEARCH_BODIES
from superfile_gateway.strict_json import is_json, loads

__all__ = ["SearchFirst", "router"]

router = APIRouter(tags=["search"])


def _route(cls: type[SearchRequest], body_model: type[BaseModel]) -> Callable[..., Awaitable[Response]]:
    async def search(
        gw: GW, name: str, body: BaseModel, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
    ) -> Response:
        return await gw.search(request, p, name, at, wait_for, cls(**body.model_dump()))

    search.__annotations__["body"] = body_model  # what FastAPI validates the body with, and documents
    return search


for _kind, _cls in KINDS.items():
    router.add_api_route(
        f"/tables/{{name}}/search/{_kind}", _route(_cls, SEARCH_BODIES[_kind]), methods=["POST"], name=_kind
    )


class SearchFirst:
    """The search routes' common case ahead of FastAPI's routing: a pure ASGI layer inside ``Guard`` (which still
    limits the body and counts the request under the route's path), in every process that answers searches itself
    (an embedded gateway, a query root). A search of the latest version (no query string) with a JSON body skips
    the router and the dependency machinery, about 1 ms of CPU a search: the same steps with the same functions
    (the caller's key and forwarded grants, the strict JSON parse, the kind's body model, then ``Gateway.search``
    with its scope check, admission and limits). A request that fails a step before the read (a refused key, a
    body that is malformed, invalid or of another content type) goes to the app with its body, which answers it
    as it answers every request; an error of the read is answered as the app's error handlers answer it."""

    def __init__(self, app: ASGIApp, *, gw: Gateway) -> None:
        self.app = app
        self.gw = gw
        self.routes: dict[str, BaseRoute] = {
            kind: next(r for r in router.routes if getattr(r, "path", None) == f"/tables/{{name}}/search/{kind}")
            for kind in KINDS
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts: list[str] = scope["path"].split("/") if scope["type"] == "http" and scope["method"] == "POST" else []
        if (
            len(parts) != 5
            or parts[1] != "tables"
            or parts[3] != "search"
            or parts[4] not in SEARCH_BODIES
            or not parts[2]
            or scope["query_string"]
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        body = await request.body()
        kind = parts[4]
        try:
            who = caller(self.gw, request.headers)
            if not is_json(request.headers.get("content-type")) or not body:
                raise ValueError("not a JSON body")
            search = KINDS[kind](**SEARCH_BODIES[kind].model_validate(loads(body), from_attributes=True).model_dump())
        except Exception:
            await self.app(scope, replay(body, receive), send)  # its answer to what this path does not accept
            return
        scope["route"] = self.routes[kind]  # as the router sets it on a match: Guard counts the request by its path
        response: Response
        try:
            response = await self.gw.search(request, who, parts[2], LATEST, None, search)
        except Exception as exc:
            response = error_of(exc, self.gw.errors, f"POST {scope['path']}")
        await response(scope, receive, send)
