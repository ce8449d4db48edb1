"""Real local servers for tests: moto's S3 server and a fault-injecting TCP proxy.

Nothing here mocks a client library; tests talk HTTP to real processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

__all__ = ["FaultyProxy", "free_port", "start_moto", "stop"]

_START_TIMEOUT = 20.0


def free_port() -> int:
    """A port the OS just reported free on 127.0.0.1 (callers retry if it gets taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto_binary() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "moto_server")
    found = beside if os.access(beside, os.X_OK) else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server not found; install moto[server]")
    return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status)
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def start_moto(attempts: int = 3) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``moto_server`` on a free port; return the process and its endpoint URL.

    Polls until the server answers (at most ~20 s per try) and retries on a
    fresh port if the process dies early, e.g. because the port was taken.
    """
    binary = _moto_binary()
    log_tail = ""
    for _ in range(attempts):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        # The server logs every request; the child keeps its own handle on this file.
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(
                [binary, "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + _START_TIMEOUT
            while time.monotonic() < deadline and proc.poll() is None:
                if _answers(endpoint):
                    return proc, endpoint
                time.sleep(0.05)
            stop(proc)
            log.seek(0)
            log_tail = log.read()[-2000:].decode(errors="replace")
    raise RuntimeError(f"moto_server did not start after {attempts} tries:\n{log_tail}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server process, killing it if it does not exit within 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


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
