"""The gateway application: the Connection API over HTTP (JSON, or Arrow IPC streams), with API keys.

``create_app(settings)`` builds it; ``python -m superfile_gateway`` (or ``superfile serve``) serves it with
uvicorn. The state behind the routes is one ``Gateway`` (``gateway.py``); the routes are routers by resource
(``routes/``), the errors' answers in ``errors.py``, the pages (docs, playground) in ``pages.py``. The process's
own endpoints (health, readiness, metrics) are here, beside the app they report on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from superfile.remote.wire import ARROW_STREAM
from superfile.telemetry import CONTENT_TYPE, render

from superfile_gateway.auth import RedactKeysInUrls
from superfile_gateway.errors import install_error_handlers
from superfile_gateway.gateway import At, Gateway, parse_as_of
from superfile_gateway.guard import Guard
from superfile_gateway.pages import install_pages
from superfile_gateway.routes import RESOURCES, forward, search
from superfile_gateway.settings import Settings
from superfile_gateway.strict_json import strict_body
from superfile_gateway.writes import WritePath

__all__ = ["At", "Gateway", "create_app", "parse_as_of"]


def create_app(settings: Settings, *, writes: WritePath | None = None) -> FastAPI:
    """The ASGI application for ``settings`` (``writes`` replaces the write path the settings choose)."""
    gw = Gateway(settings, writes)
    access_log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactKeysInUrls) for f in access_log.filters):
        access_log.addFilter(RedactKeysInUrls())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        gw.close()

    app = FastAPI(
        title="Supertable gateway",
        version="0.1.0",
        description="The superfile Connection API over HTTP: tables, writes, BM25/prefix/token/exact/vector/hybrid "
        f"search and SQL. Results are JSON, or Arrow IPC streams with `Accept: {ARROW_STREAM}`.",
        lifespan=lifespan,
        # The gateway's own instruments cover requests; FastAPI's per-request telemetry would double the cost.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        docs_url=None,  # /docs and /redoc come from pages.py, with packaged assets instead of a CDN's
        redoc_url=None,
        dependencies=[Depends(strict_body)],  # JSON bodies with NaN or infinities are a 400 on every route
    )
    app.state.gateway = gw

    def openapi() -> dict[str, Any]:
        """The generated schema plus the two ways to present an API key (checked in ``deps.principal``)."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            }
            schema["security"] = [{"bearer": []}, {"apiKey": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    install_error_handlers(app, gw.errors)

    # -- service: async, answered on the event loop, never queued behind queries on the thread pool --------------
    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"])
    async def readyz() -> JSONResponse:
        ok, detail = await gw.ready()
        return JSONResponse({"status": detail, "mode": gw.writes.mode}, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["service"])
    async def metrics() -> Response:
        return Response(render(), media_type=CONTENT_TYPE)

    if gw.query_service is not None:
        app.include_router(forward.router)  # first: in place of the embedded reads below
    for router in RESOURCES:
        app.include_router(router)
    install_pages(app)  # /docs, /redoc and the playground at /

    # searches ahead of the routing, inside Guard: forwarded to the query service, or answered here
    app.add_middleware(forward.ForwardFirst if gw.query_service is not None else search.SearchFirst, gw=gw)
    app.add_middleware(
        Guard,
        max_body_bytes=settings.max_body_bytes,
        requests=gw.requests,
        errors=gw.errors,
        inflight=gw.inflight,
    )
    return app
