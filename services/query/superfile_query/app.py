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
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from superfile.errors import SuperfileError
from superfile.remote.errors import AuthenticationError
from superfile.search.fleet import Fleet
from superfile.search.root import RootSearcher
from superfile.table.snapshot import Snapshot
from superfile_gateway.app import Gateway
from superfile_gateway.app import create_app as create_gateway_app
from superfile_gateway.settings import Settings, parse_api_keys
from superfile_gateway.warm import FollowCommits

__all__ = ["Warmer", "create_app", "query_settings"]

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
    """Each table whose manifest or whose fleet changed is warmed on its owners: its new superfiles are copied
    to them, and the BM25 statistics of the terms searched lately are gathered for the new version
    (``RootSearcher.warm_term_stats``), so a search right after a commit skips that round. The gateway's
    commit follower runs it (``superfile_gateway.warm.FollowCommits``), every ``interval_s``."""

    def __init__(self, gateway: Gateway, fleet: Fleet, interval_s: float = 1.0) -> None:
        self._fleet = fleet
        self.paths: dict[str, list[str]] = {}  # each table's live superfiles as last seen (for /v1/cluster)
        self._follow = FollowCommits(
            lambda: [gateway.table(name) for name in gateway.db.table_names()],
            self._warm,
            interval_s,
            key=lambda snapshot: (snapshot.path, fleet.generation),
            forget=self._forget,
        )

    def _warm(self, name: str, snapshot: Snapshot) -> None:
        self.paths[name] = self._fleet.warm(snapshot)
        try:  # a cache of statistics: a search asks for what this could not gather
            RootSearcher(snapshot, self._fleet).warm_term_stats()
        except SuperfileError as e:
            log.warning("gathering the BM25 statistics of %s on commit: %s", name, e)

    def _forget(self, name: str) -> None:
        self.paths.pop(name, None)

    def close(self) -> None:
        self._follow.close()


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


def create_app(settings: Settings) -> FastAPI:
    """The query service's ASGI app: the gateway's app (searches answered ahead of its routing by
    ``SearchFirst``, as an embedded gateway answers them) with ``/v1/cluster``."""
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

    return app
