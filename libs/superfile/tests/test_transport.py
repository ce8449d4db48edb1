"""The leaf calls' HTTP (``superfile.search.transport``) against a real HTTP/1.1 server on 127.0.0.1: calls
written together and awaited together, kept connections used again, a connection the server closed never
used, and the failures that are no answer."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from superfile.search.transport import Connections, NoAnswer

pytestmark = pytest.mark.timeout(60)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    close_after = False  # close each connection after its answer, without saying so (as a server timing out)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/missing":
            self.send_response(404)
            self.send_header("content-length", "7")
            self.end_headers()
            self.wfile.write(b"missing")
            return
        if self.path == "/chunked":  # an answer in chunks, as a streamed one comes
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for chunk in (b"first,", body, b""):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        delay = float(self.path.rpartition("/")[2] or 0)
        time.sleep(delay)
        answer = b"%s|%s|%s" % (self.path.encode(), self.headers.get("authorization", "").encode(), body)
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        if self.server.close_after:  # type: ignore[attr-defined]
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_calls_written_together_are_answered_as_they_come_and_their_connections_kept(server: _Server) -> None:
    pool = Connections({"authorization": "Bearer t"})
    url = _url(server)
    for _ in range(2):  # the second round uses the first's connections
        deadline = time.monotonic() + 10
        calls = {pool.send("POST", url, f"/leaf/{d}", f"body{d}".encode(), deadline): d for d in (0.3, 0.0, 0.15)}
        order = []
        with selectors.DefaultSelector() as selector:
            for call in calls:
                selector.register(call, selectors.EVENT_READ)
            while len(order) < len(calls):
                for key, _ in selector.select(5):
                    selector.unregister(key.fileobj)
                    answer = key.fileobj.answer(deadline)  # type: ignore[union-attr]
                    d = calls[key.fileobj]  # type: ignore[index]
                    assert answer.status == 200
                    assert answer.data == f"/leaf/{d}|Bearer t|body{d}".encode()
                    order.append(d)
        assert order == [0.0, 0.15, 0.3], "answers read in the order they came"
    assert server.connections == 3, "the second round wrote on the first round's connections"


def test_a_connection_the_server_closed_is_not_used_again(server: _Server) -> None:
    server.close_after = True
    pool = Connections({})
    url = _url(server)
    for i in range(3):
        answer = pool.request("POST", url, "/x/0", b"%d" % i, 5)
        assert answer.data.endswith(b"|%d" % i)
        time.sleep(0.05)  # the close reaches this side
    assert server.connections == 3


def test_a_node_that_refuses_or_stays_silent_gives_no_answer(server: _Server) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    pool = Connections({})
    with pytest.raises(NoAnswer, match="ConnectionRefused"):
        pool.send("POST", f"http://127.0.0.1:{port}", "/x", b"", time.monotonic() + 5)
    start = time.monotonic()
    call = pool.send("POST", _url(server), "/slow/2", b"", time.monotonic() + 0.3)
    with pytest.raises(NoAnswer, match="timed out"):
        call.answer(time.monotonic() + 0.3)
    assert time.monotonic() - start < 1.5, "the deadline bounds the wait"
    with pytest.raises(NoAnswer, match="deadline"):
        pool.send("POST", _url(server), "/x/0", b"", time.monotonic() - 1)


def test_a_header_cannot_add_lines_to_the_request(server: _Server) -> None:
    pool = Connections({})
    with pytest.raises(ValueError, match="line break"):
        pool.send("POST", _url(server), "/x/0", b"", time.monotonic() + 5, {"x-key": "a\r\nx-admin: 1"})
    assert server.connections == 0


def test_statuses_and_chunked_answers_are_read_whole(server: _Server) -> None:
    pool = Connections({})
    url = _url(server)
    missing = pool.request("POST", url, "/missing", b"", 5)
    assert (missing.status, missing.data) == (404, b"missing")
    chunked = pool.request("POST", url, "/chunked", b"second", 5)
    assert (chunked.status, chunked.data) == (200, b"first,second")
    assert chunked.headers["transfer-encoding"] == "chunked"
    assert pool.request("POST", url, "/x/0", b"after", 5).data.endswith(b"|after")
    assert server.connections == 1, "every answer was read to its end, so its connection was kept"
