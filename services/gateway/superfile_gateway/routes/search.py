"""Searches: one ``POST /tables/{name}/search/{kind}`` per kind of ``superfile.search.request``, generated.

Each route validates its body with the kind's generated model (``models.SEARCH_BODIES``), turns it into the
kind's request dataclass and runs it through ``Gateway.search`` (admission, the snapshot, limits, result caps).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from superfile.search.request import KINDS, SearchRequest

from superfile_gateway.deps import GW, Auth, ReadAt, WaitFor
from superfile_gateway.models import SEARCH_BODIES

__all__ = ["router"]

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
