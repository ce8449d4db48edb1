"""A fault-injecting HTTP/1.1 proxy to put in front of a real server (the S3 server, a gateway).

It knows where each request and answer ends, so it can let the server act on
a request and then lose, replace, cut or delay the answer: the faults that
make a client unsure whether its write took effect. Nothing here mocks a
client library; clients talk HTTP to real processes through it
(``tests/faults``, ``libs/superfile/tests/test_io.py``, docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Faults", "FaultyHttpProxy", "Request", "conditional_put", "first_try_of_each_write", "writes"]


@dataclass(frozen=True)
class Request:
    """What a fault rule sees of a request."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case


def conditional_put(request: Request) -> bool:
    """An S3 create-only or compare-and-swap PUT (``If-None-Match`` / ``If-Match``)."""
    return request.method == "PUT" and ("if-none-match" in request.headers or "if-match" in request.headers)


def writes(request: Request) -> bool:
    """Any request that may change something (every method but GET and HEAD)."""
    return request.method not in ("GET", "HEAD")


def first_try_of_each_write() -> Callable[[Request], bool]:
    """A rule matching each write the first time its ``Idempotency-Key`` passes, and never its repeats: losing
    those answers makes a client retry every write once, with the same key."""
    seen: set[str] = set()

    def first(request: Request) -> bool:
        key = request.headers.get("idempotency-key")
        if not writes(request) or key is None or key in seen:
            return False
        seen.add(key)
        return True

    return first


_KINDS = ("lose", "error", "truncate", "refuse", "reset", "cut_upload", "delay")


@dataclass
class Faults:
    """Shares (0..1) of the requests ``match`` selects that get each fault; they are drawn in this order.

    - ``lose``: the server acts on the request, then the connection is closed without an answer.
    - ``error``: the server acts on the request, then the answer is replaced by a 503.
    - ``truncate``: the server acts; its answer's head and ``cut`` bytes of its body arrive, then the close.
    - ``refuse``: the request never reaches the server; the answer is a 503.
    - ``reset``: the request never reaches the server; the connection is closed without an answer.
    - ``cut_upload``: half the request's bytes reach the server, then both connections are closed.
    - ``delay``: the request is held ``delay_s`` before it is forwarded.

    ``limit`` bounds how many faults are injected in all (then every request passes).
    """

    lose: float = 0.0
    error: float = 0.0
    truncate: float = 0.0
    refuse: float = 0.0
    reset: float = 0.0
    cut_upload: float = 0.0
    delay: float = 0.0
    delay_s: float = 0.2
    cut: int = 10
    limit: int | None = None
    match: Callable[[Request], bool] = writes
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("requests", *_KINDS), 0))

    @property
    def injected(self) -> int:
        return sum(self.counts[k] for k in _KINDS)


_HEADERS_END = b"\r\n\r\n"
_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 0\r\n\r\n"


class _Closed(Exception):
    """The peer closed its side."""


class _Reader:
    """Buffered reads of whole HTTP messages from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _Closed
        self.buf += chunk

    def until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(marker)
        return head + marker

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        with contextlib.suppress(_Closed):
            while True:
                self._more()
        out, self.buf = self.buf, b""
        return out

    def message(self, *, no_body: bool = False) -> tuple[bytes, str, dict[str, str]]:
        """One message: its raw bytes, its first line and its headers; the body per Content-Length or
        chunked encoding (or to the end of the connection for an answer that gives neither). A request
        that expects ``100 Continue`` gets it before its body is read."""
        head = self.until(_HEADERS_END)
        first, *lines = head[: -len(_HEADERS_END)].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        if headers.get("expect", "").lower() == "100-continue":
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if no_body:
            return head, first, headers
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line = self.until(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                body += size_line + self.exactly(size + 2)
                if size == 0:
                    break
            return head + body, first, headers
        if "content-length" in headers:
            return head + self.exactly(int(headers["content-length"])), first, headers
        if first.startswith("HTTP/"):
            return head + self.rest(), first, headers
        return head, first, headers


class FaultyHttpProxy:
    """An HTTP proxy on 127.0.0.1 (``endpoint``) that injects :class:`Faults` into a share of the requests.

    Each request is forwarded on a fresh connection to the upstream server,
    so a lost answer never leaves the server's side in doubt; the client
    side keeps its connection alive until a fault closes it. Faults are drawn
    from ``seed``: proxies in front of peers need seeds of their own, or their
    n-th requests all draw the same fault.
    """

    def __init__(self, upstream: str, faults: Faults | None = None, *, seed: int = 0) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self._upstream = (host, int(port))
        self.faults = faults or Faults()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closing = threading.Event()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def __enter__(self) -> FaultyHttpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._open.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _draw(self, request: Request) -> str | None:
        faults = self.faults
        if not faults.match(request):
            return None
        with self._lock:
            faults.counts["requests"] += 1
            if faults.limit is not None and faults.injected >= faults.limit:
                return None
            roll = self._random.random()
            for name in _KINDS:
                share = getattr(faults, name)
                if roll < share:
                    faults.counts[name] += 1
                    return name
                roll -= share
        return None

    def _serve(self, client: socket.socket) -> None:
        reader = _Reader(client)
        try:
            with client:
                client.settimeout(60)
                while not self._closing.is_set():
                    raw, first, headers = reader.message()
                    method, _, rest = first.partition(" ")
                    fault = self._draw(Request(method, rest.rpartition(" ")[0], headers))
                    if fault == "refuse":
                        client.sendall(_UNAVAILABLE)
                        continue
                    if fault == "reset":
                        return
                    if fault == "cut_upload":
                        with socket.create_connection(self._upstream, timeout=60) as upstream:
                            upstream.sendall(raw[: len(raw) // 2])
                        return
                    if fault == "delay":
                        time.sleep(self.faults.delay_s)
                    answer = self._forward(raw, method)
                    if fault == "lose":
                        return  # the server acted; the client never hears
                    if fault == "truncate":
                        head, _, body = answer.partition(_HEADERS_END)
                        client.sendall(head + _HEADERS_END + body[: self.faults.cut])
                        return
                    client.sendall(_UNAVAILABLE if fault == "error" else answer)
        except (_Closed, OSError):
            return
        finally:
            with self._lock:
                self._open.discard(client)

    def _forward(self, raw: bytes, method: str) -> bytes:
        with socket.create_connection(self._upstream, timeout=60) as upstream:
            upstream.sendall(raw)
            reader = _Reader(upstream)
            while True:
                head, first, _ = reader.message(no_body=True)
                status = int(first.split(" ")[1])
                if status != 100:  # skip interim answers (Expect: 100-continue)
                    break
            reader.buf = head + reader.buf
            answer, _, _ = reader.message(no_body=method == "HEAD" or status in (204, 304))
            return answer
