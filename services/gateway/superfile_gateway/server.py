"""A gateway served by uvicorn on a background thread: for tests, notebooks and benchmarks in one process."""

from __future__ import annotations

import math
import socket
import threading
import time

import uvicorn

from superfile_gateway.app import create_app
from superfile_gateway.settings import Settings
from superfile_gateway.writes import WritePath

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """``with BackgroundServer(settings) as server: superfile.connect(server.url, api_key=...)``.

    The listening socket is bound to a free port on ``settings.host`` before
    the thread starts (``settings.port`` is not used), so there is no port
    race; entering returns once uvicorn accepts connections, within ``start_timeout``.
    """

    def __init__(self, settings: Settings, *, writes: WritePath | None = None, start_timeout: float = 20.0) -> None:
        self.settings = settings
        self.app = create_app(settings, writes=writes)
        self._start_timeout = start_timeout
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=math.ceil(settings.drain_s)
            )
        )
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> BackgroundServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.host, 0))
        port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="superfile-gateway", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise RuntimeError(f"the gateway did not start within {self._start_timeout} s")
            time.sleep(0.01)
        self.url = f"http://{self.settings.host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
