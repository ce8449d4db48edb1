"""Reads of rows: scan, count, changes (searches are in ``search.py``, SQL in ``sql.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from superfile_gateway.deps import GW, Auth, ReadAt, WaitFor
from superfile_gateway.gateway import LATEST
from superfile_gateway.models import CountRequest, ScanRequest

__all__ = ["router"]

router = APIRouter(tags=["reads"])


@router.post("/tables/{name}/scan")
def scan(
    gw: GW, name: str, req: ScanRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return gw.query(request, p, name, "scan", at, wait_for, lambda t: gw.scan(t, req))


@router.post("/tables/{name}/count")
def count(gw: GW, name: str, req: CountRequest, p: Auth, at: ReadAt, wait_for: WaitFor = None) -> dict[str, int]:
    return {"count": gw.read(p, name, "count", at, wait_for, lambda t: t.count_rows(req.where))}


@router.get("/tables/{name}/changes")
def changes(
    gw: GW,
    name: str,
    request: Request,
    p: Auth,
    from_version: Annotated[int, Query(alias="from", description="the version the changes start after")],
    to_version: Annotated[
        int | None, Query(alias="to", description="the version they end at (default: latest)")
    ] = None,
    columns: Annotated[
        str | None,
        Query(description="comma-separated columns besides _change and _id (default: all; empty: none)"),
    ] = None,
    wait_for: WaitFor = None,
) -> Response:
    """Rows inserted and deleted between two retained versions: ``_change`` ("insert"/"delete"), ``_id``,
    then the columns; an update shows as a delete and an insert of the same ``_id``."""
    wanted = None if columns is None else [c for c in columns.split(",") if c]
    return gw.query(
        request, p, name, "changes", LATEST, wait_for, lambda t: t.changes(from_version, to_version, columns=wanted)
    )
