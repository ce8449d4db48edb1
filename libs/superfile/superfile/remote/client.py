"""The SDK's HTTP transport to one gateway: a keep-alive pool, the API key, and the retry rule (a request that
is safe to repeat is sent again after no answer, a 429, 502 or 503). ``RemoteConnection`` and ``RemoteTable``
share one client."""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import pyarrow as pa
import urllib3
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, TimeoutError

from superfile.errors import InvalidOptionError, SuperfileError
from superfile.remote.errors import GatewayError, GatewayUnavailableError, error_from_response
from superfile.remote.wire import ARROW_STREAM, from_ipc

__all__ = ["GatewayClient"]


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


class GatewayClient:
    """Requests to one gateway (``uri``, which may carry a path prefix)."""

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
        self.uri = uri
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

    def request(
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

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return json.loads(self.request(method, path, **kwargs).data)

    def arrow(self, path: str, body: Mapping[str, Any] | None, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Rows as an Arrow stream: POST ``body`` as JSON, or GET when there is no body."""
        if body is None:
            response = self.request("GET", path, params=params)
        else:
            response = self.request("POST", path, payload=body, params=params, idempotent=True)  # a read
        if not response.headers.get("content-type", "").startswith(ARROW_STREAM):
            raise GatewayError(f"expected an Arrow stream from {path}, got {response.headers.get('content-type')}", 502)
        return from_ipc(response.data)

    def close(self) -> None:
        self._pool.close()
