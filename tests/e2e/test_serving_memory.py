"""Every serving process (gateway, query root, cache node) starts with the memory settings of a process that
runs for months (``superfile.allocator.tune_for_serving``; docs/gateway.md, "Memory"): each entry point is run
for real in a fresh process, on a port already taken so that uvicorn gives up at once, and by then the thread
that hands memory back must be running and Arrow must allocate from the decode pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_RUN = """
import socket, sys, threading
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
port = str(taken.getsockname()[1])
module = __import__(sys.argv[1], fromlist=["main"])
try:
    module.main([port if a == "PORT" else a for a in sys.argv[2:]])
except SystemExit:
    pass  # uvicorn could not bind: what ran before it is what is checked
import pyarrow as pa
from superfile.format.reader import decode_pool
print(pa.default_memory_pool().backend_name, decode_pool().backend_name)
print(",".join(t.name for t in threading.enumerate()))
"""


@pytest.mark.parametrize("service", ["gateway", "query", "cache"])
def test_a_serving_process_starts_its_memory_release(service: str, tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    argv = {
        "gateway": ["superfile_gateway.__main__", "--port", "PORT"],
        "query": [
            "superfile_query.__main__",
            "serve",
            "--uri",
            uri,
            "--port",
            "PORT",
            "--cache-nodes",
            "http://127.0.0.1:9",
        ],
        "cache": [
            "superfile_cache.__main__",
            "serve",
            "--uri",
            uri,
            "--port",
            "PORT",
            "--cache-dir",
            str(tmp_path / "c"),
        ],
    }[service]
    env = {**os.environ, "SUPERFILE_STORAGE": uri, "SUPERFILE_NO_AUTH": "1", "SUPERFILE_INTERNAL_TOKEN": "t"}
    done = subprocess.run([sys.executable, "-c", _RUN, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "address already in use" in done.stderr.lower(), done.stderr[-2000:]  # it got as far as uvicorn
    *_, pools, threads = done.stdout.strip().splitlines()
    assert "superfile-release" in threads.split(","), done.stdout
    default, decode = pools.split()
    assert default == decode == "jemalloc", pools  # what pool threads free goes back (test_allocator.py)
