"""``superfile serve`` and ``python -m superfile_gateway`` as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import superfile
from superfile_suite import free_port

SUPERFILE = str(Path(sys.executable).with_name("superfile"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERFILE_")}
    return {**env, **extra}


@contextmanager
def _running(cmd: list[str], env: dict[str, str], url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not become ready in 30 s"
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_serve_refuses_without_keys(tmp_path: Path) -> None:
    done = subprocess.run(
        [SUPERFILE, "serve", f"file://{tmp_path}", "--port", str(free_port())],
        env=_env(),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"no API keys configured" in done.stderr and b"--no-auth" in done.stderr


def test_serve_with_keys_and_sdk(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [SUPERFILE, "serve", f"file://{tmp_path}", "--port", str(port)]
    with _running(cmd, _env(SUPERFILE_API_KEYS="cli-key:*:rw"), url):
        assert httpx.get(f"{url}/tables").status_code == 401
        with superfile.connect(url, api_key="cli-key") as db:
            table = db.create_table(
                "notes", data=[{"n": 1, "text": "served from the command line"}], fts_columns=["text"]
            )
            assert table.bm25_search("text", "command", projection=["n"]).column("n").to_pylist() == [1]
    # What the served process wrote is in storage.
    assert superfile.connect(f"file://{tmp_path}").open_table("notes").count_rows() == 1


def test_module_entry_point_no_auth(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(SUPERFILE_STORAGE=f"file://{tmp_path}", SUPERFILE_NO_AUTH="1", SUPERFILE_PORT=str(port))
    with _running([sys.executable, "-m", "superfile_gateway"], env, url):
        assert httpx.get(f"{url}/tables").json() == {"tables": []}
    missing = subprocess.run([sys.executable, "-m", "superfile_gateway"], env=_env(), capture_output=True, timeout=60)
    assert missing.returncode == 2 and b"SUPERFILE_STORAGE" in missing.stderr


def test_serve_over_s3_reads_through_its_cache_dir(s3_uri: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cache = tmp_path / "cache"
    cmd = [SUPERFILE, "serve", s3_uri, "--port", str(port), "--no-auth", "--cache-dir", str(cache)]
    with _running(cmd, _env(), url), superfile.connect(url) as db:
        table = db.create_table("notes", data=[{"n": 1, "text": "cached by the gateway"}], fts_columns=["text"])
        assert table.bm25_search("text", "cached", projection=["n"]).column("n").to_pylist() == [1]
        assert table.stats()["cache_resident_superfiles"] == 1
    assert len(list((cache / "superfiles").iterdir())) == 1
