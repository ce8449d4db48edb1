"""The cache node's HTTP API: leaf requests, warming, its own statistics, health and metrics.

A query root sends ``POST /v1/leaf`` with a :class:`superfile.search.leaf.LeafRequest`
(a table, the manifest it pinned, this node's share of the superfiles and the
work); the node runs it on its embedded connection, whose disk cache holds the
superfiles it owns, and answers Arrow IPC (tables) or JSON (statistics).
``POST /v1/prefetch`` names superfiles to copy into the cache in the background
(warm on commit). Every ``/v1`` route needs ``Authorization: Bearer <internal token>``.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send
from superfile import Connection
from superfile.errors import InvalidInputError, SuperfileError
from superfile.remote.wire import ARROW_STREAM, to_ipc
from superfile.search.leaf import OPS, LeafRequest, run
from superfile.telemetry import CONTENT_TYPE, Observed, preset, render, seconds_histogram

__all__ = ["CacheNode", "NodeSettings", "create_app"]

log = logging.getLogger(__name__)

_MAX_BODY = 16 << 20  # a leaf request names superfiles and a query vector: far below this

# The node's metrics (docs/query.md), listed from the start: the leaf latency of every op at zero, the rest
# read from the live nodes of the process (one, but for tests) when scraped.
LEAF_SECONDS = seconds_histogram("superfile_cache_leaf_duration_seconds", "Leaf request latency by op", ["op"])
ERRORS = Counter("superfile_cache_errors", "Leaf errors by type", ["type"])
preset(LEAF_SECONDS, op=sorted(OPS))
_NODES: weakref.WeakSet[CacheNode] = weakref.WeakSet()


def _total(stat: str) -> Callable[[], dict[tuple[str, ...], float]]:
    """The sum of one of the live nodes' statistics (``CacheNode.stats``)."""
    return lambda: {(): sum(node.stats()[stat] for node in list(_NODES))}


Observed("superfile_cache_bytes", "bytes of the copies on disk", _total("cache_bytes"))
Observed("superfile_cache_superfiles", "copies on disk", _total("superfiles"))
Observed(
    "superfile_cache_downloads",
    "superfiles downloaded, on demand and ahead of use",
    _total("downloads"),
    kind="counter",
)
Observed("superfile_cache_hits", "uses answered from a copy on disk", _total("hits"), kind="counter")
Observed("superfile_cache_downloaded_bytes", "bytes fetched from storage", _total("downloaded_bytes"), kind="counter")


@dataclass(frozen=True)
class NodeSettings:
    """What one cache node is configured with (``superfile-cache serve``'s flags)."""

    uri: str
    cache_dir: str
    token: str
    disk_budget_bytes: int = 64 << 30
    memory_budget_bytes: int | None = None
    host: str = "127.0.0.1"
    port: int = 8100


class CacheNode:
    """The state behind the routes: the embedded connection (its disk cache) and the warming queue."""

    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.db = Connection(
            settings.uri,
            cache_dir=settings.cache_dir,
            cache_budget_bytes=settings.disk_budget_bytes,
            cache_memory_bytes=settings.memory_budget_bytes,
        )
        # hedged requests for superfiles this node does not own: ranged reads of what the work needs, no copies
        # kept (the cache directory is shared, so a copy already here is still used)
        self.passing = Connection(
            settings.uri,
            cache_dir=settings.cache_dir,
            cache_budget_bytes=settings.disk_budget_bytes,
            cache_memory_bytes=settings.memory_budget_bytes,
            verify_checksums=False,
        )
        if self.passing.disk_cache is not None:
            self.passing.disk_cache.prefetch = False
        self._token = settings.token.encode()
        self._warming = ThreadPoolExecutor(2, thread_name_prefix="superfile-warm")
        self._queued: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.served = 0
        self.started = time.time()
        self.leaf_seconds, self.errors = LEAF_SECONDS, ERRORS
        _NODES.add(self)  # its statistics in the gauges and counters read when scraped

    def authorize(self, request: Request) -> None:
        self.authorize_header(request.headers.get("authorization"))

    def authorize_header(self, value: str | None) -> None:
        scheme, _, token = (value or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._token):
            raise _Unauthorized()

    def leaf(self, body: bytes) -> pa.Table | dict[str, Any]:
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            raise InvalidInputError("a leaf request is a JSON object") from None
        request = LeafRequest.from_json(parsed)
        start = time.perf_counter()
        try:
            db = self.passing if request.transient else self.db
            return run(db.snapshot(request.table, request.manifest), request)
        finally:
            self.leaf_seconds.labels(op=request.op).observe(time.perf_counter() - start)
            self.served += 1

    def prefetch(self, body: bytes) -> int:
        """Queue the superfiles not already queued; they download in the background, two at a time."""
        try:
            parsed = json.loads(body)
            table = parsed["table"]
            wanted = [(str(p), int(n)) for p, n in parsed["superfiles"]]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise InvalidInputError('prefetch takes {"table": name, "superfiles": [[path, size], ...]}') from None
        if not isinstance(table, str):
            raise InvalidInputError("prefetch: table must be a name")
        with self._lock:
            fresh = [(p, n) for p, n in wanted if (table, p) not in self._queued]
            self._queued.update((table, p) for p, _ in fresh)
        if fresh:
            self._warming.submit(self._warm, table, fresh)
        return len(fresh)

    def _warm(self, table: str, superfiles: list[tuple[str, int]]) -> None:
        for path, size in superfiles:  # one at a time: a superfile that fails does not hold up the others
            try:
                self.db.warm(table, [(path, size)])
            except (SuperfileError, OSError) as e:
                log.warning("warming %s of %s failed: %s", path, table, e)
            finally:
                with self._lock:
                    self._queued.discard((table, path))

    def stats(self) -> dict[str, Any]:
        cache = self.db.disk_cache
        copies, used = cache.usage() if cache is not None else (0, 0)
        hits, downloads = (cache.hits, cache.fetches) if cache is not None else (0, 0)
        return {
            "superfiles": copies,
            "cache_bytes": used,
            "cache_budget_bytes": cache.budget_bytes if cache is not None else 0,
            "downloads": downloads,
            "downloaded_bytes": (cache.fetched_bytes + cache.ranged_bytes if cache is not None else 0)
            + (self.passing.disk_cache.ranged_bytes if self.passing.disk_cache is not None else 0),
            "hits": hits,
            "hit_ratio": hits / (hits + downloads) if hits + downloads else 1.0,
            "leaf_requests": self.served,
        }

    def ready(self) -> tuple[bool, str]:
        try:
            self.db.table_names()
        except SuperfileError as e:
            return False, f"storage: {e}"
        return True, "ready"

    def close(self) -> None:
        self._warming.shutdown(wait=False, cancel_futures=True)
        self.db.close()
        self.passing.close()


class _Unauthorized(Exception):
    pass


def _error(status: int, type_name: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": type_name, "message": message}}, status_code=status)


class LeafFirst:
    """The node's ASGI app: ``POST /v1/leaf`` straight from the server to a worker thread, everything else to
    the FastAPI app (``app``). Every read calls every node that owns a superfile it needs, so this route is
    the node's hot path; it skips the framework's routing, middleware and dependency machinery (most of the
    ~1 ms of CPU a request cost beside the work) and answers errors exactly as the app's handlers do."""

    def __init__(self, app: FastAPI, node: CacheNode) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/leaf" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            self.node.authorize_header(Headers(scope=scope).get("authorization"))
            body = await _body(receive)
            response = await run_in_threadpool(self.answer, body)
        except _Unauthorized:
            response = _error(
                401, "AuthenticationError", "this cache node needs Authorization: Bearer <internal token>"
            )
        except SuperfileError as exc:
            self.node.errors.labels(type=type(exc).__name__).inc()
            response = _error(exc.http_status, type(exc).__name__, str(exc))
        except Exception:
            self.node.errors.labels(type="InternalError").inc()
            log.exception("unhandled error on POST /v1/leaf")
            response = _error(500, "InternalError", "internal error; see the cache node's log")
        await response(scope, receive, send)

    def answer(self, body: bytes) -> Response:
        """The leaf's answer, encoded in the same worker thread (one hand-off per request)."""
        found = self.node.leaf(body)
        if isinstance(found, pa.Table):
            return Response(to_ipc(found), media_type=ARROW_STREAM)
        return JSONResponse(found)


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidInputError("the client went away before sending the whole leaf request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise InvalidInputError(f"a leaf request body is at most {_MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def create_app(settings: NodeSettings) -> LeafFirst:
    """The node's ASGI app (:class:`LeafFirst` over the FastAPI app of the other routes)."""
    node = CacheNode(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        node.close()

    app = FastAPI(
        title="Supertable cache node",
        version="0.1.0",
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.node = node

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: _Unauthorized) -> JSONResponse:
        return _error(401, "AuthenticationError", "this cache node needs Authorization: Bearer <internal token>")

    @app.exception_handler(SuperfileError)
    async def superfile_error(request: Request, exc: SuperfileError) -> JSONResponse:
        node.errors.labels(type=type(exc).__name__).inc()
        return _error(exc.http_status, type(exc).__name__, str(exc))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        node.errors.labels(type="InternalError").inc()
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "InternalError", "internal error; see the cache node's log")

    async def body_of(request: Request) -> bytes:
        node.authorize(request)
        body = await request.body()
        if len(body) > _MAX_BODY:
            raise InvalidInputError(f"a leaf request body is at most {_MAX_BODY} bytes")
        return body

    @app.post("/v1/prefetch")
    async def prefetch(request: Request) -> dict[str, int]:
        return {"queued": node.prefetch(await body_of(request))}

    @app.get("/v1/stats")
    async def stats(request: Request) -> dict[str, Any]:
        node.authorize(request)
        return await run_in_threadpool(node.stats)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ok, detail = await run_in_threadpool(node.ready)
        return JSONResponse({"status": detail}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(), media_type=CONTENT_TYPE)

    return LeafFirst(app, node)
