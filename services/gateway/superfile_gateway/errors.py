"""Every error answers ``{"error": {"type", "message"}}`` with its status, counted by type: the engine's typed
errors with their own status, validation 422 (malformed JSON 400), HTTP errors as raised, anything else 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.exceptions import HTTPException as StarletteHTTPException
from superfile.errors import SuperfileError

__all__ = ["error_of", "error_response", "install_error_handlers"]

log = logging.getLogger("superfile.gateway")


def error_response(status: int, type_name: str, message: str) -> JSONResponse:
    # 429 and 503 are worth retrying (a write with its Idempotency-Key): say when
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"error": {"type": type_name, "message": message}}, status_code=status, headers=headers)


def error_of(exc: Exception, errors: Counter, where: str) -> JSONResponse:
    """The answer the handlers below give to an error raised by a route's work (the routes answered ahead of the
    app, ``ForwardFirst`` and ``SearchFirst``, answer theirs with it too)."""
    if isinstance(exc, SuperfileError):
        name = type(exc).__name__
        errors.labels(type=name).inc()
        return error_response(exc.http_status, name, str(exc))
    if isinstance(exc, RecursionError):
        errors.labels(type="InvalidInputError").inc()
        return error_response(400, "InvalidInputError", "the request is nested too deeply to process")
    errors.labels(type="InternalError").inc()
    log.error("unhandled error on %s", where, exc_info=exc)
    return error_response(500, "InternalError", "internal error; see the gateway's log")


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, errors: Counter) -> None:
    """The handlers on ``app``, each response counted in ``errors`` by ``type``."""

    @app.exception_handler(SuperfileError)
    async def superfile_error(request: Request, exc: SuperfileError) -> JSONResponse:
        return error_of(exc, errors, f"{request.method} {request.url.path}")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors.labels(type="InvalidInputError").inc()
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            return error_response(400, "InvalidInputError", "malformed JSON body")
        return error_response(422, "InvalidInputError", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        errors.labels(type="HTTPException").inc()
        return error_response(exc.status_code, "HTTPException", str(exc.detail))

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return error_of(exc, errors, f"{request.method} {request.url.path}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_of(exc, errors, f"{request.method} {request.url.path}")
