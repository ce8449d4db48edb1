"""The query service: the gateway's own read routes, run over a connection with a fleet of cache nodes.

Reads answer exactly as the gateway's embedded ones (same routes, models,
errors and limits: SQL in worker processes, admission caps), because they are
those routes; only the connection differs: its searches, scans and counts
plan here and run on the cache nodes (``superfile.search``). The service
accepts only the internal token (a gateway forwards its callers' grants
beside it), writes nothing, and adds what a root has: ``GET /v1/cluster`` and a
watcher that has each cache node fetch the superfiles it owns as soon as a
commit publishes them (warm on commit, and again when membership changes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send
from superfile.errors import SuperfileError
from superfile.remote.errors import AuthenticationError
from superfile.search.fleet import Fleet
from superfile.search.request import KINDS, SearchRequest
from superfile_gateway.app import Gateway
from superfile_gateway.app import create_app as create_gateway_app
from superfile_gateway.auth import Principal
from superfile_gateway.deps import caller
from superfile_gateway.errors import error_of
from superfile_gateway.gateway import LATEST
from superfile_gateway.guard import replay
from superfile_gateway.models import SEARCH_BODIES
from superfile_gateway.settings import Settings, parse_api_keys
from superfile_gateway.strict_json import is_json, loads

__all__ = ["SearchFirst", "Warmer", "create_app", "query_settings"]

log = logging.getLogger(__name__)


def query_settings(
    uri: str,
    token: str,
    *,
    cache_nodes: Sequence[str] = (),
    cache_dns: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8200,
    **options: Any,
) -> Settings:
    """A gateway configuration for the query role: the internal token is the one (read-only) key, no
    maintenance (writers maintain), reads on the cache nodes."""
    return Settings(
        storage=uri,
        api_keys=parse_api_keys(f"{token}:*:r"),
        internal_token=token,
        cache_nodes=tuple(cache_nodes),
        cache_dns=cache_dns,
        maintenance=False,
        host=host,
        port=port,
        **options,
    )


class Warmer:
    """Every ``interval_s``, each table whose manifest or whose fleet changed is warmed on its owners."""

    def __init__(self, gateway: Gateway, fleet: Fleet, interval_s: float = 1.0) -> None:
        self._gateway = gateway
        self._fleet = fleet
        self._interval_s = interval_s
        self._warmed: dict[str, tuple[str, int]] = {}
        self.paths: dict[str, list[str]] = {}  # each table's live superfiles as last seen (for /v1/cluster)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="superfile-warm-on-commit", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.once()
            except SuperfileError as e:
                log.warning("warm on commit: %s", e)
            except Exception:
                log.exception("warm on commit failed")

    def once(self) -> None:
        names = self._gateway.db.table_names()
        for name in names:
            snap = self._gateway.table(name).snapshot()
            seen = (snap.path, self._fleet.generation)
            if self._warmed.get(name) != seen:
                self.paths[name] = self._fleet.warm(snap)
                self._warmed[name] = seen
        for gone in set(self.paths) - set(names):
            self.paths.pop(gone, None)
            self._warmed.pop(gone, None)

    def close(self) -> None:
        self._stop.set()


def cluster(fleet: Fleet, warmer: Warmer) -> dict[str, Any]:
    """Each cache node: health, superfiles it owns now, and its cache's own figures."""
    owned = fleet.placement([p for paths in warmer.paths.values() for p in paths])
    stats = fleet.node_stats()
    return {
        "members": [
            {
                "url": m.url,
                "healthy": m.healthy,
                "superfiles": len(owned.get(m.url, ())),
                "cache_bytes": stats.get(m.url, {}).get("cache_bytes"),
                "downloads": stats.get(m.url, {}).get("downloads"),
                "hit_ratio": stats.get(m.url, {}).get("hit_ratio"),
            }
            for m in sorted(fleet.members(), key=lambda m: m.url)
        ]
    }


class SearchFirst:
    """The root's ASGI app: a search forwarded by a gateway (``POST /tables/{name}/search/{kind}``, a JSON body,
    no query string) goes from the server straight to ``Gateway.search``; everything else, and any search this
    path does not accept as it stands, goes to the gateway's FastAPI app (``app``).

    Every read a gateway forwards is one of these, so this is the root's hot path: it skips the framework's
    routing, middleware and dependency machinery (about 1 ms of CPU of the ~7 a root spent per search). It runs
    the same steps with the same functions (the caller's key and forwarded grants, the strict JSON parse, the
    kind's body model, then the read with its scope check, admission and limits) and counts the request as the
    app's ``Guard`` does. A request that fails any step before the read (no token, a body that is too large,
    malformed or invalid) is handed to the app with its body, which answers it as it answers every request;
    an error of the read is answered as the app's error handlers answer it."""

    def __init__(self, app: FastAPI, gw: Gateway) -> None:
        self.app = app
        self.gw = gw
        self.max_body_bytes = gw.settings.max_body_bytes
        self._routes = {kind: f"/tables/{{name}}/search/{kind}" for kind in KINDS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts: list[str] = scope["path"].split("/") if scope["type"] == "http" and scope["method"] == "POST" else []
        if (
            len(parts) != 5
            or parts[1] != "tables"
            or parts[3] != "search"
            or parts[4] not in SEARCH_BODIES
            or not parts[2]
            or scope["query_string"]
        ):
            await self.app(scope, receive, send)
            return
        body = await self._body(scope, receive)
        if body is None:  # too large, or the client went away: the app answers it (413, or nothing)
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        kind = parts[4]
        try:
            who = caller(self.gw, request.headers)
            if not is_json(request.headers.get("content-type")) or not body:
                raise ValueError("not a JSON body")
            search = KINDS[kind](**SEARCH_BODIES[kind].model_validate(loads(body), from_attributes=True).model_dump())
        except Exception:
            await self.app(scope, replay(body, receive), send)  # its answer to what this path does not accept
            return
        self.gw.inflight.count += 1
        status = 500
        try:
            response = await self._search(request, who, parts[2], search)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            self.gw.inflight.count -= 1
            self.gw.requests.labels(method="POST", route=self._routes[kind], status=str(status)).inc()

    async def _search(self, request: Request, who: Principal, name: str, search: SearchRequest) -> Response:
        """``Gateway.search``'s answer, or its error as the app's handlers answer it (errors.py)."""
        try:
            return await self.gw.search(request, who, name, LATEST, None, search)
        except Exception as exc:
            return error_of(exc, self.gw.errors, f"POST {request.url.path}")

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None past the body limit (declared or streamed) or when the client went away."""
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def create_app(settings: Settings) -> SearchFirst:
    """The query service's ASGI app: :class:`SearchFirst` over the gateway's app with ``/v1/cluster``."""
    app = create_gateway_app(settings)
    gw: Gateway = app.state.gateway
    fleet = gw.db.fleet
    if fleet is None:
        raise ValueError("a query service needs cache nodes (cache_nodes or cache_dns)")
    warmer = Warmer(gw, fleet)
    app.state.warmer = warmer
    app.router.on_shutdown.append(warmer.close)

    @app.get("/v1/cluster", tags=["service"])
    def get_cluster(request: Request) -> dict[str, Any]:
        """The cache nodes as this root sees them (internal token only)."""
        principal = gw.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if not gw.trusted(principal):
            raise AuthenticationError("GET /v1/cluster needs the internal token")
        return cluster(fleet, warmer)

    return SearchFirst(app, gw)
