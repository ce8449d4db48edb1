"""The gateway application: the Connection API over HTTP (JSON, or Arrow IPC streams), with API keys.

``create_app(settings)`` builds it; ``python -m superfile_gateway`` serves it
with uvicorn. Table handles stay open across requests: the engine refreshes a
handle from the table's pointer on each read (its consistency policy), so a
request costs one small pointer read, not a re-open.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import logging
import math
import re
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import pyarrow as pa
from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from superfile.connection import Connection
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidVectorError,
    QueryLimitError,
    SuperfileError,
    TableExistsError,
    TableNotFoundError,
)
from superfile.events import EventLog, Position, topic_for
from superfile.io.cache import DiskCache
from superfile.maintenance import AutoMaintenance, CompactionPolicy, MaintenancePolicy
from superfile.remote.wire import (
    ARROW_STREAM,
    from_ipc,
    schema_from_b64,
    schema_from_json,
    schema_to_b64,
    schema_to_json,
    table_to_json,
    to_ipc,
)
from superfile.schema import ID, SCORE
from superfile.sql import SqlLimits
from superfile.table import Supertable
from superfile.table.cleanup import DEFAULT_RETENTION
from superfile.telemetry import CONTENT_TYPE, meter, render, seconds_histogram

from superfile_gateway.admission import Admission
from superfile_gateway.auth import KeyRing, Principal, RedactKeysInUrls, principal_of_grants, refuse_keys_in_url
from superfile_gateway.forward import GRANTS_HEADER, QueryService
from superfile_gateway.guard import Guard, InFlight
from superfile_gateway.models import (
    Bm25Request,
    CleanupRequest,
    CountRequest,
    CreateTableRequest,
    DeleteRequest,
    ExactMatchRequest,
    HybridRequest,
    OptimizeRequest,
    PrefixRequest,
    RestoreRequest,
    ScanRequest,
    SqlRequest,
    TokenMatchRequest,
    VectorRequest,
)
from superfile_gateway.settings import Settings
from superfile_gateway.sql_workers import SqlWorkers, run_visible
from superfile_gateway.writes import EmbeddedWrites, LogWrites, WritePath, WriteResult, wait_visible

__all__ = ["At", "Gateway", "create_app", "parse_as_of"]

log = logging.getLogger("superfile.gateway")
_PINNED_HANDLES = 64  # read-only handles on past versions kept open
_READY_TIMEOUT_S = 5.0  # readiness answers 503 when storage takes longer than this to list tables
_EPOCH_MS = re.compile(r"-?\d+")


def parse_as_of(text: str) -> datetime.datetime | int:
    """A point in time from a query string: epoch milliseconds, or an ISO 8601 datetime (naive meaning UTC)."""
    t = text.strip()
    if _EPOCH_MS.fullmatch(t):
        return int(t)
    try:
        return datetime.datetime.fromisoformat(t)
    except ValueError:
        raise InvalidInputError(f"as_of must be epoch milliseconds or an ISO 8601 datetime, got {text!r}") from None


@dataclass(frozen=True)
class At:
    """The snapshot a read names: the latest (neither field), a past ``version``, or the one current at ``as_of``."""

    version: int | None = None
    as_of: datetime.datetime | int | None = None

    @property
    def pinned(self) -> bool:
        return self.version is not None or self.as_of is not None


LATEST = At()


_CACHES: weakref.WeakSet[DiskCache] = weakref.WeakSet()  # every live gateway's disk cache in this process
_CACHES_OBSERVED: list[bool] = []  # [True] once the instruments exist
_CACHES_LOCK = threading.Lock()


def _observe_caches(m: Meter, cache: DiskCache | None) -> None:
    """The disk caches' size, budget, resident mappings and activity (zeros when there is none), through one
    set of instruments per process: OpenTelemetry keeps the first callbacks of an instrument name."""
    with _CACHES_LOCK:
        if cache is not None:
            _CACHES.add(cache)
        if _CACHES_OBSERVED:
            return
        _CACHES_OBSERVED.append(True)

    def per_directory(read: Callable[[DiskCache], int]) -> int:  # caches sharing a directory share its files
        return sum(read(c) for c in {c.directory: c for c in list(_CACHES)}.values())

    def observed(total: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _options: [Observation(total())]

    for name, total, description in (
        ("superfile.gateway.cache.bytes", lambda: per_directory(lambda c: c.usage()[1]), "bytes of copies on disk"),
        ("superfile.gateway.cache.superfiles", lambda: per_directory(lambda c: c.usage()[0]), "copies on disk"),
        ("superfile.gateway.cache.budget.bytes", lambda: per_directory(lambda c: c.budget_bytes), "on-disk budget"),
        (
            "superfile.gateway.cache.mapped.bytes",
            lambda: sum(c.mapped_bytes() for c in list(_CACHES)),
            "mappings in the memory budget",
        ),
    ):
        m.create_observable_gauge(name, callbacks=[observed(total)], description=description)
    for name, total, description in (
        ("superfile.gateway.cache.fetches", lambda: sum(c.fetches for c in list(_CACHES)), "superfiles downloaded"),
        ("superfile.gateway.cache.advised", lambda: sum(c.advised for c in list(_CACHES)), "mappings advised out"),
    ):
        m.create_observable_counter(name, callbacks=[observed(total)], description=description)


_MAINTENANCE: weakref.WeakSet[AutoMaintenance] = weakref.WeakSet()  # every live gateway's, in this process
_MAINTENANCE_OBSERVED: list[bool] = []


def _observe_maintenance(m: Meter, maintenance: AutoMaintenance | None) -> None:
    """Background maintenance by what was done, summed over the gateways of this process (one instrument:
    OpenTelemetry keeps the first callbacks of a name)."""
    with _CACHES_LOCK:
        if maintenance is not None:
            _MAINTENANCE.add(maintenance)
        if _MAINTENANCE_OBSERVED:
            return
        _MAINTENANCE_OBSERVED.append(True)

    def observe(_options: CallbackOptions) -> list[Observation]:
        totals: Counter[str] = Counter()
        for each in list(_MAINTENANCE):
            totals.update(each.counts)
        return [Observation(n, {"what": what}) for what, n in sorted(totals.items())]

    m.create_observable_counter(
        "superfile.gateway.maintenance",
        callbacks=[observe],
        description="Background maintenance done: compactions, superfiles_compacted, cleanups, files_removed, errors",
    )


class Gateway:
    """The state behind the routes: the catalog, open table handles, the write path, keys and metrics."""

    def __init__(self, settings: Settings, writes: WritePath | None = None) -> None:
        self.settings = settings
        connect_options: dict[str, Any] = {
            "cache_dir": settings.cache_dir,
            "cache_budget_bytes": settings.cache_budget_bytes,
            "cache_memory_bytes": settings.cache_memory_bytes,
        }
        if settings.cache_nodes or settings.cache_dns:  # a query service: reads fan out to the cache nodes
            connect_options.update(
                cache_nodes=list(settings.cache_nodes),
                cache_dns=settings.cache_dns,
                internal_token=settings.internal_token,
            )
        maintenance = (
            MaintenancePolicy(
                CompactionPolicy(settings.compact_small_files), settings.cleanup_interval_s, settings.retention_s
            )
            if settings.maintenance and not settings.kafka  # in suite mode the builder maintains the tables
            else False
        )
        self.db = Connection(settings.storage, maintenance=maintenance, **connect_options)
        self.keys = KeyRing(settings.api_keys, enabled=settings.auth)
        if writes is None:
            writes = (
                LogWrites(
                    EventLog(settings.kafka, topic_prefix=settings.topic_prefix), wait_timeout_s=settings.wait_timeout_s
                )
                if settings.kafka
                else EmbeddedWrites()
            )
        self.writes = writes
        self._tables: dict[str, Supertable] = {}
        self._pinned: OrderedDict[tuple[str, int], Supertable] = OrderedDict()
        self._lock = threading.Lock()
        self.inflight = InFlight()
        m = meter("superfile.gateway")
        self.query_seconds = seconds_histogram(m, "superfile.gateway.query.duration", "Query latency by kind")
        self.write_seconds = seconds_histogram(
            m, "superfile.gateway.write.duration", "Write latency by operation (suite mode: until acknowledged)"
        )
        self.requests = m.create_counter("superfile.gateway.requests", description="HTTP requests by status")
        self.errors = m.create_counter("superfile.gateway.errors", description="Error responses by error type")
        _observe_caches(m, self.db.disk_cache)
        _observe_maintenance(m, self.db.maintenance)
        self.admission = Admission(
            totals={"sql": settings.sql_max_concurrent, "search": settings.search_max_concurrent},
            per_key=settings.max_concurrent_per_key,
            meter=m,
        )
        self.sql = SqlWorkers(
            settings.storage,
            connect_options,
            workers=settings.sql_workers,
            timeout_s=settings.sql_timeout_s,
            memory_bytes=settings.sql_memory_bytes,
            max_rows=settings.max_result_rows,
            admission=self.admission,
            meter=m,
        )
        self.query_service = (
            QueryService(settings.query_url, settings.internal_token or "", settings.sql_timeout_s + 30.0)
            if settings.query_url
            else None
        )
        self._internal = hashlib.sha256((settings.internal_token or "").encode()).digest()
        self._readiness = ThreadPoolExecutor(1, thread_name_prefix="superfile-readyz")  # never behind queries
        self._ready_check: asyncio.Future[tuple[bool, str]] | None = None

    # -- tables -------------------------------------------------------------------------
    def table(self, name: str, at: At = LATEST) -> Supertable:
        """The open handle on ``name`` (opened once), or a read-only handle on one of its past versions
        (``as_of`` is resolved to the version current then; handles are cached by version)."""
        table = self._tables.get(name)
        if table is None:
            opened = self.db.open_table(name)
            with self._lock:
                table = self._tables.setdefault(name, opened)
        if not at.pinned:
            return table
        if at.version is not None:
            key = (name, at.version)
            with self._lock:
                pinned = self._pinned.get(key)
                if pinned is not None:
                    self._pinned.move_to_end(key)
            # a cleanup elsewhere (another replica, the builder, the gateway in front of this query service) may
            # have expired the version since it was cached: checked on every use, one small read of storage
            if pinned is not None and pinned.is_retained():
                return pinned
            if pinned is not None:
                self.forget(name, pinned_only=True)
            pinned = table.checkout(at.version)
        else:
            pinned = table.checkout(as_of=at.as_of)
            key = (name, pinned.version)
        with self._lock:
            pinned = self._pinned.setdefault(key, pinned)
            self._pinned.move_to_end(key)
            while len(self._pinned) > _PINNED_HANDLES:
                self._pinned.popitem(last=False)
        return pinned

    def forget(self, name: str, *, pinned_only: bool = False) -> None:
        """Drop cached handles of ``name`` (only those on past versions with ``pinned_only``: after a cleanup
        some of them may name versions whose files are gone)."""
        with self._lock:
            if not pinned_only:
                self._tables.pop(name, None)
            for key in [k for k in self._pinned if k[0] == name]:
                del self._pinned[key]

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        """Drop a cached handle whose table disappeared (dropped elsewhere) and say so in the table's words."""
        try:
            yield
        except TableNotFoundError:
            self.forget(name)
            raise TableNotFoundError(f"table {name!r} does not exist") from None

    def wait_for(self, table: Supertable, token: str) -> None:
        """Block until the write at ``token`` is visible in ``table`` (504 after the configured bound)."""
        position = Position.parse(token)
        expected = topic_for(table.name, self.settings.topic_prefix)
        if position.topic != expected:
            raise InvalidInputError(f"position {token!r} is not in table {table.name!r}'s log ({expected})")
        if not position.visible_in(table.properties) and not self.writes.reachable(position):
            raise InvalidInputError(f"position {token!r} was never written to table {table.name!r}'s log")
        wait_visible(table, position, self.settings.wait_timeout_s)

    # -- request bodies -----------------------------------------------------------------
    def describe(self, table: Supertable) -> dict[str, Any]:
        return {
            "name": table.name,
            "version": table.version,
            "schema": schema_to_json(table.schema),
            "schema_ipc": schema_to_b64(table.schema),
            "options": table.options.to_dict(),
        }

    # -- operations ---------------------------------------------------------------------
    async def search(
        self,
        request: Request,
        principal: Principal,
        name: str,
        kind: str,
        at: At,
        wait_for: str | None,
        run: Callable[[Supertable], pa.Table],
    ) -> Response:
        """A search, on the thread pool: the event loop only routes (health and metrics never wait behind one)."""
        return await run_in_threadpool(self.query, request, principal, name, kind, at, wait_for, run)

    def query(
        self,
        request: Request,
        principal: Principal,
        name: str,
        kind: str,
        at: At,
        wait_for: str | None,
        run: Callable[[Supertable], pa.Table],
    ) -> Response:
        """A read returning rows: ``read``, then the encoding the client accepts. The engine's time (from the
        handle's lookup to the rows, waiting for ``wait_for`` included) is in the ``Server-Timing`` header, as
        Elasticsearch's ``took``: end-to-end latency minus it is what HTTP and the gateway add."""
        start = time.perf_counter()
        rows = self.read(principal, name, kind, at, wait_for, run)
        took_ms = (time.perf_counter() - start) * 1000
        response = encode(request, rows)
        response.headers["server-timing"] = f"engine;dur={took_ms:.3f}"
        return response

    def read(
        self,
        principal: Principal,
        name: str,
        kind: str,
        at: At,
        wait_for: str | None,
        run: Callable[[Supertable], Any],
    ) -> Any:
        """A read: scope check, admission (429 past the caps), then the handle (past, or waiting for
        ``wait_for``) and the engine call, timed."""
        principal.require(name, "r")
        if at.pinned and wait_for is not None:
            raise InvalidInputError(
                "give either version/as_of (a past snapshot) or wait_for (a recent write), not both"
            )
        start = time.perf_counter()
        try:
            with self.admission.enter("search", principal), self.using(name):
                table = self.table(name, at)
                if wait_for is not None:
                    self.wait_for(table, wait_for)
                return run(table)
        finally:
            self.query_seconds.record(time.perf_counter() - start, {"kind": kind})

    def write(self, principal: Principal, name: str, op: str, run: Callable[[Supertable], WriteResult]) -> Response:
        principal.require(name, "w")
        start = time.perf_counter()
        try:
            with self.using(name):
                result = run(self.table(name))
        finally:
            self.write_seconds.record(time.perf_counter() - start, {"op": op, "mode": self.writes.mode})
        body = {"version": result.version, "position": result.position.token if result.position else None}
        return Response(json.dumps(body).encode(), media_type="application/json")

    def maintain(
        self, principal: Principal, name: str, op: str, run: Callable[[Supertable], dict[str, Any]]
    ) -> dict[str, Any]:
        """A maintenance operation (optimize, cleanup), run here against storage in both modes (write scope)."""
        principal.require(name, "w")
        start = time.perf_counter()
        try:
            with self.using(name):
                return run(self.table(name))
        finally:
            self.write_seconds.record(time.perf_counter() - start, {"op": op, "mode": self.writes.mode})

    def cleanup(self, table: Supertable, req: CleanupRequest) -> dict[str, Any]:
        """``Supertable.cleanup`` with this gateway's floor on the safety margin (``Settings.cleanup_min_age_s``):
        the files of commits in flight (a builder's, an optimize's) are protected by their age alone."""
        older_than = DEFAULT_RETENTION.total_seconds() if req.older_than is None else req.older_than
        margin = older_than if req.safety_margin is None else req.safety_margin
        floor = self.settings.cleanup_min_age_s
        if margin < floor:
            name = "older_than" if req.safety_margin is None else "safety_margin"
            raise InvalidOptionError(
                f"{name} {margin:g} s is below this gateway's minimum safety margin of {floor:g} s "
                "(SUPERFILE_CLEANUP_MIN_AGE_S): files of commits still in flight could be deleted; "
                "give a safety_margin of at least that to expire versions sooner"
            )
        result = table.cleanup(older_than, dry_run=req.dry_run, safety_margin=req.safety_margin)
        if not req.dry_run:
            self.forget(table.name, pinned_only=True)
        return result

    def create(self, principal: Principal, req: CreateTableRequest) -> tuple[Supertable, bool]:
        """The new table (or with ``exist_ok`` the existing one) and whether this request created it."""
        principal.require(req.name, "w")
        if req.schema_ipc is not None and req.schema_ is not None:
            raise InvalidInputError("give schema or schema_ipc, not both")
        if req.schema_ipc is not None:
            schema = schema_from_b64(req.schema_ipc)
        elif req.schema_ is not None:
            schema = schema_from_json(req.schema_)
        else:
            raise InvalidInputError("a table needs a schema (JSON fields) or schema_ipc (base64 Arrow IPC schema)")
        vectors = {
            k: v if isinstance(v, int) else v.model_dump() for k, v in req.vector_columns.items()
        }  # the engine validates dims and metrics
        partition = req.partition if isinstance(req.partition, str | None) else req.partition.model_dump()
        try:
            table = self.db.create_table(
                req.name,
                schema,
                fts_columns=req.fts_columns,
                vector_columns=vectors,
                tokenizer=req.tokenizer,
                partition=partition,
                consistency=req.consistency,
                **req.options,
            )
        except TableExistsError:
            if not req.exist_ok:
                raise
            return self.db.open_table(req.name), False
        except TypeError as e:  # an option of the wrong type that TableOptions' checks compare against numbers
            raise InvalidOptionError(f"invalid table option: {e}") from None
        self.writes.created(req.name)
        with self._lock:
            self._tables[req.name] = table  # a handle left from a table of the same name dropped elsewhere goes
        return table, True

    def drop(self, principal: Principal, name: str) -> None:
        principal.require(name, "w")
        self.forget(name)
        self.db.drop_table(name)

    def hybrid(self, principal: Principal, table: Supertable, req: HybridRequest) -> pa.Table:
        """Runs the ``hybrid_search`` SQL table function on one pinned snapshot; columns as the other searches."""
        if not all(math.isfinite(x) for x in req.vector):
            raise InvalidVectorError(f"query vector for {req.vector_column!r} has NaN or infinite values")
        cols = None if req.projection is None else [c for c in req.projection if c not in (ID, SCORE)]
        select = "*" if cols is None else ", ".join([ID, SCORE, *(_ident(c) for c in cols)])
        vector = "[" + ", ".join(repr(float(x)) for x in req.vector) + "]"
        query = (
            f"SELECT {select} FROM hybrid_search({_literal(table.name)}, {_literal(req.text_column)}, "
            f"{_literal(req.query)}, {_literal(req.vector_column)}, {vector}, {int(req.k)}) "
            f"ORDER BY {SCORE} DESC, {ID}"
        )
        out = run_visible(self.db, principal, query, SqlLimits())
        rest = [c for c in out.column_names if c not in (ID, SCORE)]
        return out.select([ID, SCORE, *rest])

    def scan(self, table: Supertable, req: ScanRequest) -> pa.Table:
        """``to_arrow``, refused before reading when more rows match than ``max_result_rows``."""
        cap = self.settings.max_result_rows
        found = table.count_rows(req.where)
        if found > cap:
            raise QueryLimitError(
                f"{found} rows match, more than the limit of {cap} (SUPERFILE_MAX_RESULT_ROWS): narrow the scan "
                "with where, or aggregate with SQL"
            )
        return table.to_arrow(columns=req.columns, where=req.where)

    def result_cap(self, asked: int | None) -> int:
        return min(asked or self.settings.max_result_rows, self.settings.max_result_rows)

    async def ready(self) -> tuple[bool, str]:
        """Storage lists tables within 5 s and the broker answers; checked on a thread of its own, one check
        at a time (a hung storage does not pile threads up)."""
        if self._ready_check is None or self._ready_check.done():
            loop = asyncio.get_running_loop()
            self._ready_check = asyncio.wrap_future(self._readiness.submit(self._check_ready), loop=loop)
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready_check), _READY_TIMEOUT_S)
        except TimeoutError:
            return False, f"storage did not answer within {_READY_TIMEOUT_S:g} s"

    def _check_ready(self) -> tuple[bool, str]:
        try:
            self.db.table_names()
        except SuperfileError as e:
            return False, f"storage: {e}"
        if not self.writes.ready():
            return False, "the event log broker is not reachable"
        return True, "ready"

    def trusted(self, principal: Principal) -> bool:
        """Whether the caller presented the internal token (a gateway forwarding a read to this query service)."""
        return bool(self.settings.internal_token) and hmac.compare_digest(principal.identity, self._internal)

    def forward(self, request: Request, body: bytes, principal: Principal, name: str | None, kind: str) -> Response:
        """A read for the query service: scope, admission and ``wait_for`` here, the read there."""
        assert self.query_service is not None
        if name is not None and not (kind == "describe" and principal.visible(name)):
            principal.require(name, "r")
        wait_for = request.query_params.get("wait_for")
        start = time.perf_counter()
        try:
            with self.admission.enter("sql" if kind == "sql" else "search", principal):
                if wait_for is not None and name is not None:
                    with self.using(name):
                        self.wait_for(self.table(name), wait_for)
                return self.query_service.forward(request, body, principal, drop=("wait_for",))
        finally:
            self.query_seconds.record(time.perf_counter() - start, {"kind": kind})

    def close(self) -> None:
        if self.query_service is not None:
            self.query_service.close()
        self.db.close()
        self.sql.close()
        self.writes.close()
        self._readiness.shutdown(wait=False, cancel_futures=True)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def encode(request: Request, table: pa.Table) -> Response:
    """Arrow IPC stream when the client accepts it, JSON rows otherwise."""
    if ARROW_STREAM in request.headers.get("accept", ""):
        return Response(to_ipc(table), media_type=ARROW_STREAM)
    return Response(table_to_json(table), media_type="application/json")


def _not_json(constant: str) -> Any:
    """Python's parser takes NaN and Infinity, which JSON does not have: a strict client never sends them."""
    raise InvalidInputError(f"{constant} is not JSON: send null for a missing number")


def _rows(request: Request, body: bytes) -> tuple[Any, dict[str, Any]]:
    """The rows of a write body (Arrow IPC stream, or JSON: a list of objects or ``{"rows": [...], ...}``)
    and the other JSON fields."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == ARROW_STREAM:
        return from_ipc(body), {}
    if ctype not in ("", "application/json"):
        raise InvalidInputError(f"unsupported content type {ctype!r}: send application/json or {ARROW_STREAM}")
    try:
        doc = json.loads(body, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"malformed JSON body: {e}") from None
    if isinstance(doc, list):
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        rest = {k: v for k, v in doc.items() if k != "rows"}
        return doc["rows"], rest
    raise InvalidInputError('the body must be a JSON list of row objects or {"rows": [...]}')


_WRITE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"type": "array", "items": {"type": "object"}},
                        {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object"}}}},
                    ]
                }
            },
            ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


def _error(status: int, type_name: str, message: str) -> JSONResponse:
    # 429 and 503 are worth retrying (a write with its Idempotency-Key): say when
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"error": {"type": type_name, "message": message}}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


async def _principal(request: Request) -> Principal:
    """The caller's key (async: a sync dependency would cost each request a trip through the thread pool)."""
    gateway: Gateway = request.app.state.gateway
    headers = request.headers
    refuse_keys_in_url(request.query_params.keys())
    principal = gateway.keys.authenticate(headers.get("authorization"), headers.get("x-api-key"))
    forwarded = headers.get(GRANTS_HEADER)
    if forwarded is not None and gateway.trusted(principal):
        return principal_of_grants(forwarded)
    return principal


async def _at(
    version: Annotated[int | None, Query(description="read this past version (read-only)")] = None,
    as_of: Annotated[
        str | None,
        Query(description="read the version current at this time: epoch ms or ISO 8601 (naive means UTC)"),
    ] = None,
) -> At:
    """Which snapshot a read names (async, as ``_principal``: no thread-pool trip)."""
    if version is not None and as_of is not None:
        raise InvalidOptionError("give exactly one of version and as_of")
    return At(version, None if as_of is None else parse_as_of(as_of))


Auth = Annotated[Principal, Depends(_principal)]
ReadAt = Annotated[At, Depends(_at)]
WaitFor = Annotated[str | None, Query(description="a write's position token: answer once it is visible")]
Wait = Annotated[bool, Query(description="suite mode: answer once the write is visible (with its version)")]
RequestKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="the write's request key: a retried request with the same key commits at most once",
    ),
]


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
    )
    app.state.gateway = gw

    def openapi() -> dict[str, Any]:
        """The generated schema plus the two ways to present an API key (checked in ``_principal``)."""
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

    # -- errors ------------------------------------------------------------------------
    @app.exception_handler(SuperfileError)
    async def superfile_error(request: Request, exc: SuperfileError) -> JSONResponse:
        name = type(exc).__name__
        gw.errors.add(1, {"type": name})
        return _error(exc.http_status, name, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        gw.errors.add(1, {"type": "InvalidInputError"})
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            return _error(400, "InvalidInputError", "malformed JSON body")
        return _error(422, "InvalidInputError", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        gw.errors.add(1, {"type": "HTTPException"})
        return _error(exc.status_code, "HTTPException", str(exc.detail))

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        gw.errors.add(1, {"type": "InvalidInputError"})
        return _error(400, "InvalidInputError", "the request is nested too deeply to process")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        gw.errors.add(1, {"type": "InternalError"})
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "InternalError", "internal error; see the gateway's log")

    # -- service ----------------------------------------------------------------------
    # async: answered on the event loop, never queued behind queries on the thread pool
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
        _forward_reads(app, gw)

    # -- catalog ----------------------------------------------------------------------
    @app.get("/tables", tags=["tables"])
    def list_tables(p: Auth) -> dict[str, list[str]]:
        return {"tables": [n for n in gw.db.table_names() if p.visible(n)]}

    @app.post("/tables", tags=["tables"], status_code=201)
    def create_table(req: CreateTableRequest, p: Auth) -> JSONResponse:
        table, created = gw.create(p, req)
        return JSONResponse({**gw.describe(table), "created": created}, status_code=201 if created else 200)

    @app.get("/tables/{name}", tags=["tables"])
    def describe_table(name: str, p: Auth, at: ReadAt) -> dict[str, Any]:
        if not p.visible(name):
            p.require(name, "r")
        with gw.using(name):
            return gw.describe(gw.table(name, at))

    @app.delete("/tables/{name}", tags=["tables"])
    def drop_table(name: str, p: Auth) -> dict[str, str]:
        gw.drop(p, name)
        return {"dropped": name}

    @app.get("/tables/{name}/version", tags=["tables"])
    def table_version(name: str, p: Auth, wait_for: WaitFor = None) -> dict[str, int]:
        if not p.visible(name):
            p.require(name, "r")
        with gw.using(name):
            table = gw.table(name)
            if wait_for is not None:
                gw.wait_for(table, wait_for)
            return {"version": table.version}

    @app.get("/tables/{name}/stats", tags=["tables"])
    def stats(name: str, p: Auth, at: ReadAt) -> dict[str, Any]:
        p.require(name, "r")
        with gw.using(name):
            return gw.table(name, at).stats()

    @app.get("/tables/{name}/properties", tags=["tables"])
    def properties(name: str, p: Auth, at: ReadAt) -> dict[str, dict[str, Any]]:
        """What commits recorded (e.g. the log offsets the builder applied)."""
        p.require(name, "r")
        with gw.using(name):
            return {"properties": gw.table(name, at).properties}

    @app.get("/tables/{name}/idempotency", tags=["tables"])
    def idempotency_version(name: str, key: str, p: Auth, at: ReadAt) -> dict[str, int | None]:
        """The version that committed this idempotency key (null: none retained did)."""
        p.require(name, "r")
        with gw.using(name):
            return {"version": gw.table(name, at).idempotency_version(key)}

    @app.get("/tables/{name}/versions", tags=["tables"])
    def versions(name: str, p: Auth, at: ReadAt) -> dict[str, list[dict[str, Any]]]:
        """Retained versions (of a past version: those up to it)."""
        p.require(name, "r")
        with gw.using(name):
            return {"versions": gw.table(name, at).versions()}

    # -- writes -----------------------------------------------------------------------
    @app.post("/tables/{name}/append", tags=["writes"], openapi_extra=_WRITE_BODY)
    async def append(
        name: str,
        request: Request,
        p: Auth,
        wait: Wait = True,
        idempotency_key: Annotated[
            str | None, Query(description="a repeated key adds nothing (the first append's rows stay)")
        ] = None,
        request_key: RequestKey = None,
    ) -> Response:
        body = await request.body()
        if idempotency_key is not None and request_key is not None and idempotency_key != request_key:
            raise InvalidInputError("the idempotency_key parameter and the Idempotency-Key header differ")
        key = idempotency_key if idempotency_key is not None else request_key

        def run(table: Supertable) -> WriteResult:
            rows, rest = _rows(request, body)
            if rest:
                raise InvalidInputError(f"unknown fields in an append body: {sorted(rest)}")
            return gw.writes.append(table, rows, wait=wait, idempotency_key=key)

        return await run_in_threadpool(gw.write, p, name, "append", run)

    @app.post("/tables/{name}/update", tags=["writes"], openapi_extra=_WRITE_BODY)
    async def update(
        name: str,
        request: Request,
        p: Auth,
        wait: Wait = True,
        where: Annotated[str | None, Query(description="the predicate (required with an Arrow body)")] = None,
        request_key: RequestKey = None,
    ) -> Response:
        body = await request.body()

        def run(table: Supertable) -> WriteResult:
            rows, rest = _rows(request, body)
            predicate = rest.pop("where", where)
            if rest:
                raise InvalidInputError(f"unknown fields in an update body: {sorted(rest)}")
            if not isinstance(predicate, str):
                raise InvalidInputError('an update needs "where" (in the JSON body or as a query parameter)')
            return gw.writes.update(table, predicate, rows, wait=wait, idempotency_key=request_key)

        return await run_in_threadpool(gw.write, p, name, "update", run)

    @app.post("/tables/{name}/delete", tags=["writes"])
    def delete(name: str, req: DeleteRequest, p: Auth, wait: Wait = True, request_key: RequestKey = None) -> Response:
        return gw.write(
            p, name, "delete", lambda t: gw.writes.delete(t, req.where, wait=wait, idempotency_key=request_key)
        )

    @app.post("/tables/{name}/restore", tags=["writes"])
    def restore(name: str, req: RestoreRequest, p: Auth, wait: Wait = True, request_key: RequestKey = None) -> Response:
        """Publish a retained version's contents as the newest version (suite mode: an event the builder
        applies in log order)."""
        return gw.write(
            p, name, "restore", lambda t: gw.writes.restore(t, req.version, wait=wait, idempotency_key=request_key)
        )

    # -- reads ------------------------------------------------------------------------
    @app.post("/tables/{name}/search/bm25", tags=["search"])
    async def bm25(
        name: str, req: Bm25Request, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
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

    @app.post("/tables/{name}/search/prefix", tags=["search"])
    async def prefix(
        name: str, req: PrefixRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
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

    @app.post("/tables/{name}/search/token_match", tags=["search"])
    async def token_match(
        name: str, req: TokenMatchRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
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

    @app.post("/tables/{name}/search/exact_match", tags=["search"])
    async def exact_match(
        name: str, req: ExactMatchRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
    ) -> Response:
        return await gw.search(
            request,
            p,
            name,
            "exact_match",
            at,
            wait_for,
            lambda t: t.exact_match(
                req.column, req.value, projection=req.projection, max_rows=gw.result_cap(req.max_rows)
            ),
        )

    @app.post("/tables/{name}/search/vector", tags=["search"])
    async def vector(
        name: str, req: VectorRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None
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

    @app.post("/tables/{name}/search/hybrid", tags=["search"])
    def hybrid(name: str, req: HybridRequest, request: Request, p: Auth, wait_for: WaitFor = None) -> Response:
        return gw.query(request, p, name, "hybrid", LATEST, wait_for, lambda t: gw.hybrid(p, t, req))

    @app.post("/tables/{name}/scan", tags=["reads"])
    def scan(name: str, req: ScanRequest, request: Request, p: Auth, at: ReadAt, wait_for: WaitFor = None) -> Response:
        return gw.query(request, p, name, "scan", at, wait_for, lambda t: gw.scan(t, req))

    @app.post("/tables/{name}/count", tags=["reads"])
    def count(name: str, req: CountRequest, p: Auth, at: ReadAt, wait_for: WaitFor = None) -> dict[str, int]:
        return {"count": gw.read(p, name, "count", at, wait_for, lambda t: t.count_rows(req.where))}

    @app.get("/tables/{name}/changes", tags=["reads"])
    def changes(
        name: str,
        request: Request,
        p: Auth,
        from_version: Annotated[int, Query(alias="from", description="the version the changes start after")],
        to_version: Annotated[
            int | None, Query(alias="to", description="the version they end at (default: latest)")
        ] = None,
        columns: Annotated[
            str | None,
            Query(description="comma-separated columns besides _change and _id (default: all; empty: none)"),
        ] = None,
        wait_for: WaitFor = None,
    ) -> Response:
        """Rows inserted and deleted between two retained versions: ``_change`` ("insert"/"delete"), ``_id``,
        then the columns; an update shows as a delete and an insert of the same ``_id``."""
        wanted = None if columns is None else [c for c in columns.split(",") if c]
        return gw.query(
            request, p, name, "changes", LATEST, wait_for, lambda t: t.changes(from_version, to_version, columns=wanted)
        )

    # -- maintenance ------------------------------------------------------------------
    @app.post("/tables/{name}/optimize", tags=["maintenance"])
    def optimize(name: str, p: Auth, req: Annotated[OptimizeRequest | None, Body()] = None) -> dict[str, Any]:
        """Compaction (``Supertable.optimize``), run by the gateway in both modes: it is safe against
        concurrent writers (a builder included) and leaves the table's contents and log offsets as they are."""
        body = req or OptimizeRequest()
        return gw.maintain(p, name, "optimize", lambda t: t.optimize(body.target_rows, target_bytes=body.target_bytes))

    @app.post("/tables/{name}/cleanup", tags=["maintenance"])
    def cleanup(name: str, p: Auth, req: Annotated[CleanupRequest | None, Body()] = None) -> dict[str, Any]:
        """Garbage collection (``Supertable.cleanup``), run by the gateway in both modes; a safety margin (by
        default the window) below ``SUPERFILE_CLEANUP_MIN_AGE_S`` is refused."""
        return gw.maintain(p, name, "cleanup", lambda t: gw.cleanup(t, req or CleanupRequest()))

    @app.post("/sql", tags=["reads"])
    async def sql(req: SqlRequest, request: Request, p: Auth) -> Response:
        """In a worker process, under the time, memory, row and concurrency limits (docs/gateway.md, "Limits");
        stopped when the client goes away."""
        start = time.perf_counter()
        try:
            limits = gw.sql.limits(req.memory_limit_bytes, req.max_rows)
            result = await gw.sql.run(req.query, p, limits, request.is_disconnected)
        finally:
            gw.query_seconds.record(time.perf_counter() - start, {"kind": "sql"})
        return await run_in_threadpool(encode, request, result)  # up to max_result_rows: not on the event loop

    app.add_middleware(
        Guard,
        max_body_bytes=settings.max_body_bytes,
        requests=gw.requests,
        errors=gw.errors,
        inflight=gw.inflight,
    )
    return app


def _forward_reads(app: FastAPI, gw: Gateway) -> None:
    """Routes that send reads to the query service, registered ahead of (so in place of) the embedded ones;
    the query service answers with those same routes, so the API and its documentation do not change."""

    async def send(request: Request, principal: Principal, name: str | None, kind: str) -> Response:
        body = await request.body()
        return await run_in_threadpool(gw.forward, request, body, principal, name, kind)

    @app.post("/tables/{name}/search/{kind}", include_in_schema=False)
    async def search(name: str, kind: str, request: Request, p: Auth) -> Response:
        return await send(request, p, name, kind)

    @app.post("/tables/{name}/scan", include_in_schema=False)
    async def scan(name: str, request: Request, p: Auth) -> Response:
        return await send(request, p, name, "scan")

    @app.post("/tables/{name}/count", include_in_schema=False)
    async def count(name: str, request: Request, p: Auth) -> Response:
        return await send(request, p, name, "count")

    @app.get("/tables/{name}", include_in_schema=False)
    async def describe(name: str, request: Request, p: Auth) -> Response:
        return await send(request, p, name, "describe")

    @app.get("/tables", include_in_schema=False)
    async def list_tables(request: Request, p: Auth) -> Response:
        return await send(request, p, None, "list")

    # /version stays here: the position a write's wait_for names belongs to this gateway's write path
    def table_read(what: str) -> Callable[..., Awaitable[Response]]:
        async def read(name: str, request: Request, p: Auth) -> Response:
            return await send(request, p, name, what)

        return read

    for what in ("stats", "properties", "idempotency", "versions", "changes"):
        app.add_api_route(f"/tables/{{name}}/{what}", table_read(what), methods=["GET"], include_in_schema=False)

    @app.post("/sql", include_in_schema=False)
    async def sql(request: Request, p: Auth) -> Response:
        return await send(request, p, None, "sql")
