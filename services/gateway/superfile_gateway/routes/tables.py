"""The catalog and a table's metadata: list, create, describe, drop, version, stats, properties, idempotency,
versions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from superfile_gateway.deps import GW, Auth, ReadAt, WaitFor
from superfile_gateway.models import CreateTableRequest

__all__ = ["router"]

router = APIRouter(tags=["tables"])


@router.get("/tables")
def list_tables(gw: GW, p: Auth, namespace: str | None = None) -> dict[str, list[str]]:
    """Every table the key can see, or those directly in ``namespace``."""
    return {"tables": [n for n in gw.db.table_names(namespace) if p.visible(n)]}


@router.post("/tables", status_code=201)
def create_table(gw: GW, req: CreateTableRequest, p: Auth, response: Response) -> dict[str, Any]:
    """201 with the new table's description, or 200 with the existing one's (``exist_ok``)."""
    table, created = gw.create(p, req)
    if not created:
        response.status_code = 200
    return {**gw.describe(table), "created": created}  # serialized as every answer is: NaN and infinities as null


@router.get("/tables/{name}")
def describe_table(gw: GW, name: str, p: Auth, at: ReadAt) -> dict[str, Any]:
    if not p.visible(name):
        p.require(name, "r")
    with gw.using(name):
        return gw.describe(gw.table(name, at))


@router.delete("/tables/{name}")
def drop_table(gw: GW, name: str, p: Auth) -> dict[str, str]:
    gw.drop(p, name)
    return {"dropped": name}


@router.get("/tables/{name}/version")
def table_version(gw: GW, name: str, p: Auth, wait_for: WaitFor = None) -> dict[str, int]:
    if not p.visible(name):
        p.require(name, "r")
    with gw.using(name):
        table = gw.table(name)
        if wait_for is not None:
            gw.wait_for(table, wait_for)
        return {"version": table.version}


@router.get("/tables/{name}/stats")
def stats(gw: GW, name: str, p: Auth, at: ReadAt) -> dict[str, Any]:
    p.require(name, "r")
    with gw.using(name):
        return gw.table(name, at).stats()


@router.get("/tables/{name}/properties")
def properties(gw: GW, name: str, p: Auth, at: ReadAt) -> dict[str, dict[str, Any]]:
    """What commits recorded (e.g. the log offsets the builder applied)."""
    p.require(name, "r")
    with gw.using(name):
        return {"properties": gw.table(name, at).properties}


@router.get("/tables/{name}/idempotency")
def idempotency_version(gw: GW, name: str, key: str, p: Auth, at: ReadAt) -> dict[str, int | None]:
    """The version that committed this idempotency key (null: none retained did)."""
    p.require(name, "r")
    with gw.using(name):
        return {"version": gw.table(name, at).idempotency_version(key)}


@router.get("/tables/{name}/versions")
def versions(gw: GW, name: str, p: Auth, at: ReadAt) -> dict[str, list[dict[str, Any]]]:
    """Retained versions (of a past version: those up to it)."""
    p.require(name, "r")
    with gw.using(name):
        return {"versions": gw.table(name, at).versions()}
