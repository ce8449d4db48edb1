"""Namespaces: list, create, drop. A key manages namespace ``team`` when it may write the name ``team``
(its grants' table globs, e.g. ``team*`` or ``*``), and sees it when it may see ``team`` or names inside
it (``team.*``): the grants that scope tables scope their namespaces."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from superfile.errors import NamespaceExistsError
from superfile.validate import check_name

from superfile_gateway.deps import GW, Auth

__all__ = ["router"]

router = APIRouter(tags=["namespaces"])


class CreateNamespaceRequest(BaseModel):
    """A namespace (``team``, or ``team.search`` inside an existing ``team``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    exist_ok: bool = False


@router.get("/namespaces")
def list_namespaces(gw: GW, p: Auth, parent: str | None = None) -> dict[str, list[str]]:
    """Every namespace the key can see, or those directly inside ``parent``."""
    names = gw.db.list_namespaces(parent)
    return {"namespaces": [n for n in names if p.visible(n) or p.visible(f"{n}.")]}


@router.post("/namespaces", status_code=201)
def create_namespace(gw: GW, req: CreateNamespaceRequest, p: Auth) -> JSONResponse:
    p.require(check_name(req.name, "namespace"), "w")
    try:
        gw.db.create_namespace(req.name)
    except NamespaceExistsError:
        if not req.exist_ok:
            raise
        return JSONResponse({"name": req.name, "created": False}, status_code=200)
    return JSONResponse({"name": req.name, "created": True}, status_code=201)


@router.delete("/namespaces/{name}")
def drop_namespace(gw: GW, name: str, p: Auth) -> dict[str, str]:
    p.require(check_name(name, "namespace"), "w")
    gw.db.drop_namespace(name)
    return {"dropped": name}
