"""Searches: ``POST /tables/{name}/search/{kind}``, each on the thread pool through ``Gateway.search``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from superfile_gateway.deps import GW, Auth, ReadAt, WaitFor
from superfile_gateway.gateway import LATEST
from superfile_gateway.models import (
    Bm25Request,
    ExactMatchRequest,
    HybridRequest,
    PrefixRequest,
    TokenMatchRequest,
    VectorRequest,
)

__all__ = ["router"]

router = APIRouter(tags=["search"])


@router.post("/tables/{name}/search/bm25")
async def bm25(
    gw: GW, name: str, req: Bm25Request, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return await gw.search(
        request,
        p,
        name,
        "bm25",
        at,
        wait_for,
        lambda t: t.bm25_search(req.column, req.query, req.k, mode=req.mode, projection=req.projection),
    )


@router.post("/tables/{name}/search/prefix")
async def prefix(
    gw: GW, name: str, req: PrefixRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return await gw.search(
        request,
        p,
        name,
        "prefix",
        at,
        wait_for,
        lambda t: t.bm25_search_prefix(req.column, req.prefix, req.k, projection=req.projection),
    )


@router.post("/tables/{name}/search/token_match")
async def token_match(
    gw: GW, name: str, req: TokenMatchRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return await gw.search(
        request,
        p,
        name,
        "token_match",
        at,
        wait_for,
        lambda t: t.token_match(
            req.column, req.tokens, req.mode, projection=req.projection, max_rows=gw.result_cap(req.max_rows)
        ),
    )


@router.post("/tables/{name}/search/exact_match")
async def exact_match(
    gw: GW, name: str, req: ExactMatchRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return await gw.search(
        request,
        p,
        name,
        "exact_match",
        at,
        wait_for,
        lambda t: t.exact_match(req.column, req.value, projection=req.projection, max_rows=gw.result_cap(req.max_rows)),
    )


@router.post("/tables/{name}/search/vector")
async def vector(
    gw: GW, name: str, req: VectorRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
) -> Response:
    return await gw.search(
        request,
        p,
        name,
        "vector",
        at,
        wait_for,
        lambda t: t.vector_search(
            req.column,
            req.vector,
            req.k,
            nprobe=req.nprobe,
            rerank=req.rerank,
            filter=req.filter,
            where=req.where,
            projection=req.projection,
        ),
    )


@router.post("/tables/{name}/search/hybrid")
def hybrid(gw: GW, name: str, req: HybridRequest, request: Request, p: Auth, wait_for: WaitFor = None) -> Response:
    return gw.query(request, p, name, "hybrid", LATEST, wait_for, lambda t: gw.hybrid(p, t, req))
