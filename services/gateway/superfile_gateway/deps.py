"""What routes take besides their bodies: the Gateway, the caller, the snapshot a read names, and the
query parameters and headers several routes share (FastAPI dependencies and annotated types).

The dependencies are async: a sync one would cost each request a trip through the thread pool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Query, Request
from starlette.datastructures import Headers
from superfile.errors import InvalidOptionError

from superfile_gateway.auth import Principal, principal_of_grants, refuse_keys_in_url
from superfile_gateway.forward import GRANTS_HEADER
from superfile_gateway.gateway import At, Gateway, parse_as_of

__all__ = ["GW", "Auth", "ReadAt", "RequestKey", "Wait", "WaitFor", "caller", "gateway", "principal", "read_at"]


async def gateway(request: Request) -> Gateway:
    """The application's Gateway (``create_app`` puts it on ``app.state``)."""
    gw: Gateway = request.app.state.gateway
    return gw


async def principal(request: Request) -> Principal:
    """The caller's key; with the internal token, the grants of the caller a gateway forwarded."""
    refuse_keys_in_url(request.query_params.keys())
    return caller(request.app.state.gateway, request.headers)


def caller(gw: Gateway, headers: Headers) -> Principal:
    """:func:`principal` after its URL check (a query root's search path, which takes no query string, calls it)."""
    found = gw.keys.authenticate(headers.get("authorization"), headers.get("x-api-key"))
    forwarded = headers.get(GRANTS_HEADER)
    if forwarded is not None and gw.trusted(found):
        return principal_of_grants(forwarded)
    return found


async def read_at(
    version: Annotated[int | None, Query(description="read this past version (read-only)")] = None,
    as_of: Annotated[
        str | None,
        Query(description="read the version current at this time: epoch ms or ISO 8601 (naive means UTC)"),
    ] = None,
) -> At:
    """Which snapshot a read names."""
    if version is not None and as_of is not None:
        raise InvalidOptionError("give exactly one of version and as_of")
    return At(version, None if as_of is None else parse_as_of(as_of))


GW = Annotated[Gateway, Depends(gateway)]
Auth = Annotated[Principal, Depends(principal)]
ReadAt = Annotated[At, Depends(read_at)]
WaitFor = Annotated[str | None, Query(description="a write's position token: answer once it is visible")]
Wait = Annotated[bool, Query(description="suite mode: answer once the write is visible (with its version)")]
RequestKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="the write's request key: a retried request with the same key commits at most once",
    ),
]
