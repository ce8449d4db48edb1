"""``RemoteConnection``: the Connection API against a gateway, for ``superfile.connect("http://...")``."""

from __future__ import annotations

import contextlib
import datetime
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode, urlsplit

import pyarrow as pa
import urllib3
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, TimeoutError

from superfile.errors import InvalidOptionError, SuperfileError
from superfile.options import PartitionSpec, TableOptions
from superfile.remote.errors import GatewayError, GatewayUnavailableError, error_from_response
from superfile.remote.table import RemoteTable
from superfile.remote.wire import ARROW_STREAM, from_ipc, schema_from_b64, schema_to_b64
from superfile.validate import (  # the engine's own rules, before any request
    check_name,
    check_version,
    create_schema,
    table_options,
    to_ms,
)

__all__ = ["RemoteConnection"]


def _error(response: urllib3.BaseHTTPResponse) -> SuperfileError:
    """The typed error a gateway's error response describes."""
    return error_from_response(response.status, response.data)


_RETRY_STATUSES = frozenset({429, 502, 503})


def _pause(attempt: int, retry_after: str | None) -> None:
    """Full-jitter backoff before try ``attempt + 2``; a gateway's ``Retry-After`` (seconds) sets the floor."""
    wait = random.uniform(0, min(2.0, 0.1 * 2**attempt))
    with contextlib.suppress(ValueError):
        wait = max(wait, min(float(retry_after or 0), 10.0))
    time.sleep(wait)


class RemoteConnection:
    """The catalog behind a gateway. Same methods and result types as :class:`superfile.Connection`.

    Results travel as Arrow IPC streams; errors come back as the same typed
    exceptions (``superfile.errors``), plus :mod:`superfile.remote.errors` for
    what only HTTP has (401, 403, 413, 504, unreachable gateway).
    """

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
    ) -> None:
        """``max_retries``: how often a request that is safe to repeat (a read, or a write with its request
        key) is sent again after no answer, a 429, 502 or 503, with jittered backoff (``Retry-After`` when
        the gateway gives it). Creating, dropping, optimizing and cleaning up are never repeated."""
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidOptionError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.uri = uri.rstrip("/")
        self._retries = max_retries
        base = {"accept": f"{ARROW_STREAM}, application/json"}
        if api_key:
            base["authorization"] = f"Bearer {api_key}"
        base.update(headers or {})
        self._headers = base
        self._prefix = urlsplit(self.uri).path  # a gateway mounted below a path
        # urllib3 rather than httpx: measured 0.3-0.5 ms less per request against the gateway (httpx parses
        # HTTP in pure Python); BENCHMARKS.md, gateway overhead. One keep-alive pool for the gateway's host,
        # TCP_NODELAY (urllib3's default socket options). urllib3 retries only connections that failed to
        # open; ``_request`` repeats what is safe to repeat.
        self._pool = urllib3.connection_from_url(
            self.uri,
            maxsize=8,
            timeout=urllib3.Timeout(connect=min(timeout, 10.0), read=timeout),
            retries=urllib3.Retry(total=2, connect=2, read=0, status=0, other=0, redirect=0, raise_on_status=False),
        )

    # -- transport ----------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        payload: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request; ``idempotent`` (default: GET) requests are repeated on no answer, 429, 502, 503.
        A write is idempotent when it carries its ``Idempotency-Key``: the gateway commits it at most once."""
        sent = {**self._headers, **(headers or {})}
        if payload is not None:  # JSON, encoded here: NaN must reach the gateway (which rejects it, typed)
            content = json.dumps(payload, separators=(",", ":")).encode()
            sent["content-type"] = "application/json"
        url = self._prefix + path
        query = {k: v for k, v in (params or {}).items() if v is not None}
        if query:
            url += "?" + urlencode(query)
        tries = 1 + (self._retries if (method == "GET" if idempotent is None else idempotent) else 0)
        for attempt in range(tries):
            try:
                response = self._pool.urlopen(method, url, body=content, headers=sent, preload_content=True)
            except HTTPError as e:
                if attempt + 1 < tries:
                    _pause(attempt, None)
                    continue
                cause = e.reason if isinstance(e, MaxRetryError) else e
                if isinstance(cause, TimeoutError) and not isinstance(cause, NewConnectionError):  # a subclass
                    raise GatewayUnavailableError(f"gateway {self.uri} did not answer in time: {cause}") from None
                raise GatewayUnavailableError(f"gateway {self.uri} is unreachable: {cause}") from None
            if response.status in _RETRY_STATUSES and attempt + 1 < tries:
                _pause(attempt, response.headers.get("retry-after"))
                continue
            if response.status >= 400:
                raise _error(response)
            return response
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return json.loads(self._request(method, path, **kwargs).data)

    def _arrow(self, path: str, body: Mapping[str, Any] | None, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Rows as an Arrow stream: POST ``body`` as JSON, or GET when there is no body."""
        if body is None:
            response = self._request("GET", path, params=params)
        else:
            response = self._request("POST", path, payload=body, params=params, idempotent=True)  # a read
        if not response.headers.get("content-type", "").startswith(ARROW_STREAM):
            raise GatewayError(f"expected an Arrow stream from {path}, got {response.headers.get('content-type')}", 502)
        return from_ipc(response.data)

    def _remote_table(self, info: Mapping[str, Any], version: int | None = None) -> RemoteTable:
        return RemoteTable(
            self,
            info["name"],
            schema_from_b64(info["schema_ipc"]),
            TableOptions.from_dict(info["options"]),
            pinned=version,
        )

    # -- catalog ------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        """Names of every table the API key can see, sorted."""
        return list(self._json("GET", "/tables")["tables"])

    def create_table(
        self,
        name: str,
        schema: pa.Schema | None = None,
        data: Any = None,
        *,
        fts_columns: Sequence[str] | Mapping[str, str] = (),
        vector_columns: Mapping[str, Any] | None = None,
        tokenizer: str | Mapping[str, str] = "english",
        partition: str | Mapping[str, str] | PartitionSpec | None = None,
        consistency: str = "strong",
        exist_ok: bool = False,
        **options: Any,
    ) -> RemoteTable:
        """Create a table from a schema (or from ``data``, whose schema it takes and which it appends)."""
        check_name(name)
        schema = create_schema(schema, data)
        opts = table_options(  # checked here as the engine checks them, then sent as the engine reads them
            fts_columns=fts_columns,
            vector_columns=vector_columns,
            tokenizer=tokenizer,
            partition=partition,
            consistency=consistency,
            options=options,
        )
        body = {
            "name": name,
            "schema_ipc": schema_to_b64(schema),
            "fts_columns": dict(opts.fts_columns),
            "vector_columns": {
                k: {"dim": v.dim, "metric": v.metric, "index": dict(v.index)} for k, v in opts.vector_columns.items()
            },
            "partition": asdict(opts.partition) if opts.partition is not None else None,
            "consistency": consistency,
            "exist_ok": exist_ok,
            "options": options,
        }
        info = self._json("POST", "/tables", payload=body)
        table = self._remote_table(info)
        if data is not None and info.get("created", True):
            table.append(data)
        return table

    def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> RemoteTable:
        """A handle on a table at its latest version, or read-only at an earlier ``version`` or at the version
        that was current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds; the gateway
        resolves it once, and the handle then stays on that version).

        ``consistency`` is not taken: the gateway reads with the table's own
        policy, and ``wait_for`` positions give read-your-writes.
        """
        if consistency is not None:
            raise InvalidOptionError("a remote table reads with the table's own consistency policy; omit consistency")
        if version is not None and as_of is not None:
            raise InvalidOptionError("give exactly one of version and as_of")
        params: dict[str, Any] = {}  # checked and converted as the engine does, so both name the same version
        if version is not None:
            params["version"] = check_version(version)
        if as_of is not None:
            params["as_of"] = to_ms(as_of)
        info = self._json("GET", f"/tables/{check_name(name)}", params=params)
        return self._remote_table(info, int(info["version"]) if params else None)

    def drop_table(self, name: str) -> None:
        self._request("DELETE", f"/tables/{check_name(name)}")

    def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """Run one read-only SQL query (tables the API key cannot read do not exist for it), within the
        gateway's limits, tightened by ``memory_limit_bytes`` and ``max_rows``."""
        body: dict[str, object] = {"query": query}
        if memory_limit_bytes is not None:
            body["memory_limit_bytes"] = memory_limit_bytes
        if max_rows is not None:
            body["max_rows"] = max_rows
        return self._arrow("/sql", body)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RemoteConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteConnection({self.uri!r})"
