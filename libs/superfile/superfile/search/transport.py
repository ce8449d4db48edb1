"""HTTP/1.1 keep-alive connections to the cache nodes, and calls that one thread sends together and awaits.

A read calls every node that owns one of its superfiles. With a thread per call each costs ~0.3 ms of CPU in
the HTTP client and the hand-offs, and the answers arrive while those threads contend for the GIL: three
empty leaf calls took 2.7 ms with a pool of threads and 1.3 ms (a third of the CPU) written one after the
other and awaited together on one selector. So a call here is written on a kept connection
(:meth:`Connections.send`), the read's thread waits on every call it has in flight at once (a
:class:`Call` is selectable), and each answer is read whole once it starts to arrive (:meth:`Call.answer`),
after which its connection is kept again. A request is written in one piece (one packet: ``http.client``
writes its head and body apart). Answers are parsed by httptools (uvicorn's C parser): ``http.client``'s
header parsing was ~10% of a gateway's interpreter time in forwarding alone. An answer must carry its length
(``Content-Length`` or chunks, as uvicorn's always do); one that ends with the connection is no answer.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

__all__ = ["Answer", "Call", "Connections", "NoAnswer"]

# how long a node may take to accept a connection: as long as the health check waits for it. A connection is
# opened while the read's thread waits (kept connections make that rare), so a node that never accepts holds
# the read this long before its share goes to the next node.
CONNECT_S = 1.0
# a connection idle this long is closed rather than used: uvicorn closes its side after 5 s, and a request
# written as it does so would be lost
_IDLE_S = 4.0
_KEPT = 16  # idle connections kept per node
_RECV = 1 << 16  # bytes read at a time


class NoAnswer(Exception):
    """The node gave no answer: it refused or dropped the connection, or the deadline passed."""


@dataclass(frozen=True)
class Answer:
    """A whole answer: its status, headers (names in lower case) and body."""

    status: int
    headers: dict[str, str]
    data: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


class _Message:
    """One answer, as httptools' parser calls back with it."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.status = 0
        self.complete = False
        self.keep_alive = False

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # known only until the parser resets for the next


class Call:
    """A request written to a node, whose answer has not been read yet. Selectable (``fileno``): its socket
    turns readable when the answer starts to arrive (or the node closes the connection)."""

    def __init__(self, pool: Connections, url: str, sock: socket.socket) -> None:
        self.url = url
        self._pool = pool
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def answer(self, deadline: float) -> Answer:
        """The answer, read whole (waiting for it until ``deadline``, monotonic); the connection is kept for
        the next call unless the node closes it. Raises :class:`NoAnswer`."""
        message = _Message()
        try:
            while not message.complete:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the deadline passed")
                self._sock.settimeout(left)
                data = self._sock.recv(_RECV)
                if not data:
                    raise ConnectionResetError("the connection closed before the whole answer")
                message.parser.feed_data(data)
        except (OSError, httptools.HttpParserError) as e:
            self._sock.close()
            raise NoAnswer(f"{self.url}: {type(e).__name__}: {e}") from None
        if message.keep_alive:
            self._pool.keep(self.url, self._sock)
        else:
            self._sock.close()
        return Answer(message.status, message.headers, b"".join(message.body))

    def abandon(self) -> None:
        """Give up on the answer (another node's came first): the connection is closed, not kept."""
        self._sock.close()


class Connections:
    """Idle keep-alive connections per URL (``http://host:port``), and requests written on them with the
    same ``headers`` (an ``Authorization`` among them)."""

    def __init__(self, headers: dict[str, str], connect_s: float = CONNECT_S) -> None:
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._connect_s = connect_s
        self._idle: dict[str, deque[tuple[float, socket.socket]]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def send(
        self,
        method: str,
        url: str,
        path: str,
        body: bytes | None,
        deadline: float,
        headers: dict[str, str] | None = None,
    ) -> Call:
        """``method path`` (with ``headers`` besides the pool's) written to ``url`` on a kept connection, else
        a new one. Raises :class:`NoAnswer` when it cannot be written: refused, reset, or not accepted within
        the connect timeout (the request then never reached the server)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoAnswer(f"{url}: the deadline passed")
        parts = urlsplit(url)
        head = f"{method} {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n{self._headers}"
        if headers:
            if any(c in text for item in headers.items() for text in item for c in "\r\n"):
                raise ValueError("a header name or value with a line break")
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if body is not None:
            head += f"content-length: {len(body)}\r\n"
        message = f"{head}\r\n".encode("latin-1") + (body or b"")
        sock = self._take(url)
        try:
            if sock is None:
                sock = self._connect(parts.scheme, parts.hostname or "", parts.port, min(left, self._connect_s))
            sock.settimeout(left)
            sock.sendall(message)
        except OSError as e:
            if sock is not None:
                sock.close()
            raise NoAnswer(f"{url}: {type(e).__name__}: {e}") from None
        return Call(self, url, sock)

    def request(
        self,
        method: str,
        url: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """One call, waited for."""
        deadline = time.monotonic() + timeout_s
        return self.send(method, url, path, body, deadline, headers).answer(deadline)

    def keep(self, url: str, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(url, deque())
            if len(idle) < _KEPT:
                idle.append((time.monotonic(), sock))
                return
        sock.close()

    def _take(self, url: str) -> socket.socket | None:
        """The most recently used idle connection to ``url`` that is still open; None if there is none."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(url)
                if not idle:
                    return None
                since, sock = idle.pop()
            if now - since < _IDLE_S and not _readable(sock):
                return sock
            sock.close()  # the server closed it (a readable idle socket is at its end), or it idled too long

    def _connect(self, scheme: str, host: str, port: int | None, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((host, port or (443 if scheme == "https" else 80)), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme != "https":
            return sock
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls.wrap_socket(sock, server_hostname=host)

    def clear(self) -> None:
        with self._lock:
            idle = [sock for socks in self._idle.values() for _, sock in socks]
            self._idle.clear()
        for sock in idle:
            sock.close()


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()  # not select(): a busy process's descriptors pass 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
