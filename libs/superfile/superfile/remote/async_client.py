"""The async SDK's HTTP transport to one gateway: :class:`GatewayClient`'s rules (:class:`Transport`: the same
URLs, headers, request keys, retry rule and typed errors) sent with ``httpx.AsyncClient``, so many requests
from one event loop are in flight at once over one keep-alive pool."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from superfile.remote.client import Call, Transport, backoff

if TYPE_CHECKING:
    import httpx

__all__ = ["AsyncGatewayClient"]

T = TypeVar("T")


class AsyncGatewayClient(Transport):
    """Requests to one gateway from coroutines. Its connections belong to the event loop that first used
    them: use a client (and the connection holding it) from one loop."""

    def __init__(
        self,
        uri: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 4,
        max_connections: int = 64,
    ) -> None:
        """See :class:`Transport`; ``timeout``: seconds for each answer (at most 10 to connect);
        ``max_connections``: requests in flight at once (more wait for a connection)."""
        super().__init__(uri, api_key=api_key, headers=headers, max_retries=max_retries)
        import httpx  # imported by the first async client, not by `import superfile` (~90 ms)

        # As the sync client: reconnect twice to open a connection (httpx retries nothing else), proxies from
        # the environment ignored (urllib3 ignores them too).
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=httpx.AsyncHTTPTransport(retries=2, limits=limits),  # the client's limits= skip a transport
            trust_env=False,
        )

    async def request(self, call: Call[Any]) -> httpx.Response:
        """Send one request, again while the rules say so; its answer, or its typed error."""
        import httpx

        sent = self.prepare(call)
        for attempt in itertools.count():
            try:
                response = await self._http.request(
                    sent.method, self.origin + sent.url, content=sent.body, headers=sent.headers
                )
            except httpx.TransportError as e:
                await asyncio.sleep(
                    self.after_failure(sent, attempt, e, timed_out=isinstance(e, httpx.TimeoutException))
                )
                continue
            retry_after = response.headers.get("retry-after")
            if self.after_answer(sent, attempt, response.status_code, retry_after, response.content):
                return response
            await asyncio.sleep(backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    async def call(self, call: Call[T]) -> T:
        """Send ``call`` and decode its answer."""
        response = await self.request(call)
        return self.decode(call, response.headers.get("content-type", ""), response.content)

    async def aclose(self) -> None:
        """Close the pool's connections."""
        await self._http.aclose()
