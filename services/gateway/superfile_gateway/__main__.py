"""``python -m superfile_gateway``: serve the gateway with uvicorn, configured from ``SUPERFILE_*`` variables."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace

import uvicorn
from superfile.allocator import tune_for_serving

from superfile_gateway.app import create_app
from superfile_gateway.settings import ConfigError, Settings

__all__ = ["main", "serve"]


def serve(settings: Settings) -> None:
    """Run uvicorn on ``settings.host:settings.port`` until interrupted. On SIGTERM it stops accepting,
    lets requests in flight finish for ``settings.drain_s``, then cancels what still runs (SQL workers are
    killed) and exits. Both ways to start a gateway (``python -m superfile_gateway``, ``superfile serve``)
    come here, so both get its memory settings: reads free what they decode at any time, so glibc's arenas
    hand back their tops, and every 30 s what the allocators keep free goes back (docs/gateway.md, "Memory")."""
    tune_for_serving()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=math.ceil(settings.drain_s),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m superfile_gateway", description="the Supertable REST gateway")
    p.add_argument("--host", help="listen address (default: SUPERFILE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: SUPERFILE_PORT or 8000)")
    args = p.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = replace(settings, host=args.host or settings.host, port=args.port or settings.port)
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
