"""Maintenance run by the gateway in both modes (write scope): optimize, cleanup."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from superfile_gateway.deps import GW, Auth
from superfile_gateway.models import CleanupRequest, OptimizeRequest

__all__ = ["router"]

router = APIRouter(tags=["maintenance"])


@router.post("/tables/{name}/optimize")
def optimize(gw: GW, name: str, p: Auth, req: Annotated[OptimizeRequest | None, Body()] = None) -> dict[str, Any]:
    """Compaction (``Supertable.optimize``), run by the gateway in both modes: it is safe against
    concurrent writers (a builder included) and leaves the table's contents and log offsets as they are."""
    body = req or OptimizeRequest()
    return gw.maintain(p, name, "optimize", lambda t: t.optimize(body.target_rows, target_bytes=body.target_bytes))


@router.post("/tables/{name}/cleanup")
def cleanup(gw: GW, name: str, p: Auth, req: Annotated[CleanupRequest | None, Body()] = None) -> dict[str, Any]:
    """Garbage collection (``Supertable.cleanup``), run by the gateway in both modes; a safety margin (by
    default the window) below ``SUPERFILE_CLEANUP_MIN_AGE_S`` is refused."""
    return gw.maintain(p, name, "cleanup", lambda t: gw.cleanup(t, req or CleanupRequest()))
