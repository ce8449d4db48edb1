"""Reads sent on to the query service (``SUPERFILE_QUERY_URL``): the distributed read path, docs/query.md.

The gateway keeps what is the gateway's: it authenticates the caller, checks
the table's read scope, admits the request under its caps and waits for a
``wait_for`` position (the write path is its own). It then passes the request
as it came (method, path, query, body, ``Accept``) to a query service with the
internal token and the caller's grants, and returns that service's answer
unchanged: the same JSON or Arrow, the same typed errors. The query service
runs the same routes over a connection whose reads fan out to cache nodes.
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import Response
from superfile.remote.errors import GatewayUnavailableError
from superfile.search.transport import Connections, NoAnswer

from superfile_gateway.auth import Principal

__all__ = ["GRANTS_HEADER", "QueryService"]

GRANTS_HEADER = "x-superfile-grants"  # the caller's grants, trusted only beside the internal token
_PASSED = ("accept", "content-type", "idempotency-key")  # request headers the query service needs
_RETURNED = ("content-type", "server-timing", "retry-after")  # answer headers the client needs
_CONNECT_S = 5.0
_SENDS = 3  # a request that could not be written (the service restarting, a kept connection it closed) is
# written again on a new connection, at most this often in all: it never reached the service


class QueryService:
    """Keep-alive connections to the query service (its Service address in Kubernetes)."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._connections = Connections({"authorization": f"Bearer {token}"}, connect_s=_CONNECT_S)

    def forward(self, request: Request, body: bytes, principal: Principal, *, drop: tuple[str, ...] = ()) -> Response:
        """The query service's answer to ``request`` (query parameters in ``drop`` left out)."""
        headers = {h: v for h in _PASSED if (v := request.headers.get(h)) is not None}
        headers[GRANTS_HEADER] = grants_header(principal)
        query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k not in drop])
        target = request.url.path + (f"?{query}" if query else "")
        deadline = time.monotonic() + self._timeout_s
        for attempt in range(_SENDS):
            try:
                call = self._connections.send(request.method, self.url, target, body or None, deadline, headers)
                break
            except NoAnswer as e:
                if attempt + 1 == _SENDS:
                    raise GatewayUnavailableError(f"the query service at {self.url} did not answer: {e}") from None
        try:
            answer = call.answer(deadline)
        except NoAnswer as e:  # written, so perhaps run: not sent again (the client decides, as for any answer lost)
            raise GatewayUnavailableError(f"the query service at {self.url} did not answer: {e}") from None
        out = {h: v for h in _RETURNED if (v := answer.headers.get(h)) is not None}
        return Response(answer.data, status_code=answer.status, headers=out)

    def close(self) -> None:
        self._connections.clear()


def grants_header(principal: Principal) -> str:
    return json.dumps(
        {
            "key": principal.identity.hex(),
            "unrestricted": principal.unrestricted,
            "grants": [[g.table_glob, "".join(sorted(g.scopes))] for g in principal.grants],
        },
        separators=(",", ":"),
    )
