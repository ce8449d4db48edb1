"""``POST /sql``: a query in a worker process, under the gateway's limits."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from superfile_gateway.deps import GW, Auth
from superfile_gateway.gateway import encode
from superfile_gateway.models import SqlRequest

__all__ = ["router"]

router = APIRouter(tags=["reads"])


@router.post("/sql")
async def sql(gw: GW, req: SqlRequest, request: Request, p: Auth) -> Response:
    """In a worker process, under the time, memory, row and concurrency limits (docs/gateway.md, "Limits");
    stopped when the client goes away."""
    start = time.perf_counter()
    try:
        limits = gw.sql.limits(req.memory_limit_bytes, req.max_rows)
        result = await gw.sql.run(req.query, p, limits, request.is_disconnected)
    finally:
        gw.query_seconds.labels(kind="sql").observe(time.perf_counter() - start)
    return await run_in_threadpool(encode, request, result)  # up to max_result_rows: not on the event loop
