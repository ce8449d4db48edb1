"""A fault-injecting TCP proxy in front of a real server (the servers themselves: ``superfile_suite``).

Nothing here mocks a client library; tests talk HTTP to real processes through it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence

__all__ = ["FaultyProxy"]


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 that misbehaves on chosen connections, then pipes faithfully.

    ``faults`` lists one action per accepted connection, in order; once it is
    used up every connection is a plain pipe. Actions:

    - ``"drop"``: close the client connection before reading anything.
    - ``"truncate"``: forward the first response's headers and ``cut`` body bytes, then close.
    - ``None``: behave.

    Independently, ``upload_cut`` cuts whichever connection carries request
    byte number ``upload_cut`` counted over all connections (once), e.g. to
    kill an upload halfway whatever the client's connection reuse.
    """

    def __init__(
        self,
        upstream: str,
        faults: Sequence[str | None],
        cut: int = 10,
        upload_cut: int | None = None,
    ) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self._upstream = (host, int(port))
        self._faults = list(faults)
        self._cut = cut
        self._upload_left = upload_cut
        self._lock = threading.Lock()
        self.connections = 0
        self.faults_done = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection so no thread outlives the proxy."""
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
                fault = self._faults[self.connections] if self.connections < len(self._faults) else None
                self.connections += 1
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    def _serve(self, client: socket.socket, fault: str | None) -> None:
        with client:
            if fault == "drop":
                self._count_fault()
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=30)
            except OSError:
                return
            with self._lock:
                self._open.update((client, upstream))
            with upstream:
                client.settimeout(30)
                upstream.settimeout(30)
                back = threading.Thread(target=self._pipe_upload, args=(client, upstream), daemon=True)
                back.start()
                if fault == "truncate":
                    self._truncate(upstream, client)
                else:
                    self._pipe(upstream, client)
                if fault is not None:  # close both ends so the other direction stops too
                    for sock in (client, upstream):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                back.join(timeout=30)

    def _count_fault(self) -> None:
        with self._lock:
            self.faults_done += 1

    def _truncate(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward response headers plus ``cut`` body bytes, then stop."""
        buffered = b""
        try:
            while b"\r\n\r\n" not in buffered:
                chunk = src.recv(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, body = buffered.partition(b"\r\n\r\n")
            while len(body) < self._cut:
                chunk = src.recv(65536)
                if not chunk:
                    break
                body += chunk
            dst.sendall(head + b"\r\n\r\n" + body[: self._cut])
            self._count_fault()
        except OSError:
            return

    def _pipe_upload(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy client to upstream, cutting both at the proxy-wide ``upload_cut`` byte."""
        try:
            while chunk := src.recv(65536):
                with self._lock:
                    left = self._upload_left
                    if left is not None:
                        self._upload_left = left - len(chunk) if left > len(chunk) else None
                if left is not None and left <= len(chunk):
                    dst.sendall(chunk[:left])
                    self._count_fault()
                    for sock in (src, dst):
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            return

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            return
