"""The SDK's HTTP transport to one gateway: a keep-alive pool, the API key, and the retry rule (a request that
is safe to repeat is sent again after no answer, a 429, 502 or 503). ``RemoteConnection`` and ``RemoteTable``
share one client.

The rules live in :class:`Transport`, which sends nothing: the URL, headers and body of a request, whether and
when to send it again, and what an answer means (rows, JSON, or a typed error). :class:`GatewayClient` sends
with urllib3, ``AsyncGatewayClient`` (``remote/async_client.py``) with httpx; each is only its send loop. The
table and connection build each request once, as a :class:`Call`, for both.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, TimeoutError

from superfile.errors import InvalidOptionError, SuperfileError
from superfile.remote.errors import (
    AuthenticationError,
    GatewayError,
    GatewayUnavailableError,
    error_from_response,
    error_of,
)
from superfile.remote.wire import ARROW_STREAM, from_ipc

__all__ = ["API_KEY_ENV", "Call", "GatewayClient", "Prepared", "Transport", "backoff"]

API_KEY_ENV = "SUPERFILE_API_KEY"  # the API key when connect() is given none

T = TypeVar("T")

_RETRY_STATUSES = frozenset({429, 502, 503})


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to the gateway and what its answer becomes (``then`` of the decoded JSON, or of the rows
    when ``arrow``): what a table or connection method sends, built once for the sync and the async client.
    ``idempotent`` (default: GET) requests are repeated on no answer, 429, 502, 503."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    payload: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    idempotent: bool | None = None
    arrow: bool = False
    then: Callable[[Any], T] = _same


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: the URL below the gateway's origin, the body and headers, and how many
    times it may be sent."""

    method: str
    url: str
    body: bytes | None
    headers: dict[str, str]
    tries: int


def backoff(attempt: int, retry_after: str | None) -> float:
    """Seconds of full-jitter backoff before try ``attempt + 2``; a gateway's ``Retry-After`` (seconds) sets
    the floor (at most 10 s)."""
    wait = random.uniform(0, min(2.0, 0.1 * 2**attempt))
    with contextlib.suppress(ValueError):
        wait = max(wait, min(float(retry_after or 0), 10.0))
    return wait


class Transport:
    """The rules of talking to one gateway (``uri``, which may carry a path prefix), without the sending."""

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
    ) -> None:
        """``api_key``: sent as a bearer token; None reads ``SUPERFILE_API_KEY``. ``max_retries``: how often a
        request that is safe to repeat (a read, or a write with its request key) is sent again after no
        answer, a 429, 502 or 503, with jittered backoff (``Retry-After`` when the gateway gives it). Creating,
        dropping, optimizing and cleaning up are never repeated."""
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidOptionError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.uri = uri
        self.retries = max_retries
        given = {name.lower(): value for name, value in (headers or {}).items()}
        key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
        # where the key came from, for the hint of a 401: the caller, the environment, or nowhere
        if api_key or "authorization" in given or "x-api-key" in given:
            self._key_source = "caller"
        else:
            self._key_source = "environment" if key else "none"
        base = {"accept": f"{ARROW_STREAM}, application/json"}
        if key:
            base["authorization"] = f"Bearer {key}"
        self.headers = {**base, **given}
        parts = urlsplit(uri)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self._prefix = parts.path  # a gateway mounted below a path

    def prepare(self, call: Call[Any]) -> Prepared:
        """The bytes and headers of ``call``: JSON encoded here (NaN must reach the gateway, which rejects it,
        typed), ``None`` parameters left out."""
        sent = {**self.headers, **(call.headers or {})}
        content = call.content
        if call.payload is not None:
            content = json.dumps(call.payload, separators=(",", ":")).encode()
            sent["content-type"] = "application/json"
        url = self._prefix + call.path
        query = {k: v for k, v in (call.params or {}).items() if v is not None}
        if query:
            url += "?" + urlencode(query)
        repeatable = call.method == "GET" if call.idempotent is None else call.idempotent
        return Prepared(call.method, url, content, sent, 1 + (self.retries if repeatable else 0))

    def after_failure(self, sent: Prepared, attempt: int, cause: object, *, timed_out: bool) -> float:
        """Try ``attempt`` got no answer: the seconds to wait before sending again, or, when it may not be sent
        again, the typed error."""
        if attempt + 1 < sent.tries:
            return backoff(attempt, None)
        if timed_out:
            raise GatewayUnavailableError(f"gateway {self.uri} did not answer in time: {cause}") from None
        raise GatewayUnavailableError(f"gateway {self.uri} is unreachable: {cause}") from None

    def after_answer(self, sent: Prepared, attempt: int, status: int, retry_after: str | None, body: bytes) -> bool:
        """Whether the answer to try ``attempt`` stands (True), or the request goes again (False, after
        :func:`backoff`); an error answer that stands raises its typed error."""
        if status in _RETRY_STATUSES and attempt + 1 < sent.tries:
            return False
        if status >= 400:
            raise self.error(status, body)
        return True

    def error(self, status: int, body: bytes) -> SuperfileError:
        """The typed error an error answer describes; a 401 says how to give the key it lacked."""
        error = error_from_response(status, body)
        if isinstance(error, AuthenticationError) and self._key_source != "caller":
            hint = (
                f"the gateway needs an API key: pass api_key=... to connect() or set {API_KEY_ENV}"
                if self._key_source == "none"
                else f"the API key came from {API_KEY_ENV}"
            )
            return error_of(AuthenticationError, f"{error}; {hint}")
        return error

    def decode(self, call: Call[T], content_type: str, body: bytes) -> T:
        """What a successful answer to ``call`` means: rows from an Arrow stream, else JSON."""
        if not call.arrow:
            return call.then(json.loads(body))
        if not content_type.startswith(ARROW_STREAM):
            raise GatewayError(f"expected an Arrow stream from {call.path}, got {content_type}", 502)
        return call.then(from_ipc(body))


class GatewayClient(Transport):
    """Requests to one gateway from synchronous code."""

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
    ) -> None:
        """See :class:`Transport`; ``timeout``: seconds for each answer (at most 10 to connect)."""
        super().__init__(uri, api_key=api_key, headers=headers, max_retries=max_retries)
        # urllib3 rather than httpx: measured 0.3-0.5 ms less per request against the gateway (httpx parses
        # HTTP in pure Python); BENCHMARKS.md, gateway overhead. One keep-alive pool for the gateway's host,
        # TCP_NODELAY (urllib3's default socket options). urllib3 retries only connections that failed to
        # open; ``request`` repeats what is safe to repeat.
        self._pool = urllib3.connection_from_url(
            self.uri,
            maxsize=8,
            timeout=urllib3.Timeout(connect=min(timeout, 10.0), read=timeout),
            retries=urllib3.Retry(total=2, connect=2, read=0, status=0, other=0, redirect=0, raise_on_status=False),
        )

    def request(self, call: Call[Any]) -> urllib3.BaseHTTPResponse:
        """Send one request, again while the rules say so; its answer, or its typed error."""
        sent = self.prepare(call)
        for attempt in itertools.count():
            try:
                response = self._pool.urlopen(
                    sent.method, sent.url, body=sent.body, headers=sent.headers, preload_content=True
                )
            except HTTPError as e:
                cause = e.reason if isinstance(e, MaxRetryError) else e
                timed_out = isinstance(cause, TimeoutError) and not isinstance(cause, NewConnectionError)
                time.sleep(self.after_failure(sent, attempt, cause, timed_out=timed_out))
                continue
            retry_after = response.headers.get("retry-after")
            if self.after_answer(sent, attempt, response.status, retry_after, response.data):
                return response
            time.sleep(backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    def call(self, call: Call[T]) -> T:
        """Send ``call`` and decode its answer."""
        response = self.request(call)
        return self.decode(call, response.headers.get("content-type", ""), response.data)

    def close(self) -> None:
        """Close the pool's connections."""
        self._pool.close()
