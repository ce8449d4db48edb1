"""``superfile serve``: the gateway's subcommand of the library's command line.

The ``superfile`` command (``superfile.cli``) finds it through the ``superfile.commands`` entry point this
package declares (``services/gateway/pyproject.toml``): the library never imports the gateway, and without this
package ``superfile serve`` says how to install it. Registering costs no FastAPI or uvicorn import (every
``superfile`` command registers it); they are imported when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from superfile.io.cache import DEFAULT_BUDGET_BYTES

from superfile_gateway.settings import ConfigError, Settings, parse_api_keys

__all__ = ["register", "serve_command"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``superfile`` command's subparsers (the ``superfile.commands`` entry point)."""
    sv: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the tables over HTTP (REST gateway, embedded mode)",
        description="Serve the tables below URI over HTTP: the REST gateway in embedded mode (docs/gateway.md).",
    )
    sv.set_defaults(fn=serve_command, api_keys=None)
    sv.add_argument("uri", help="storage URI, e.g. file://./data or s3://bucket/prefix")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    sv.add_argument("--max-body-bytes", type=int, default=64 << 20, help="larger request bodies get 413")
    sv.add_argument("--cache-dir", help="disk cache of superfiles read from s3:// (default: under TMPDIR)")
    sv.add_argument("--cache-budget-bytes", type=int, default=DEFAULT_BUDGET_BYTES, help="its size on disk (0: none)")
    sv.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without API keys (otherwise SUPERFILE_API_KEYS=key:table-glob:scopes,... is required)",
    )
    return sv


def serve_command(args: argparse.Namespace) -> None:
    """Run the REST gateway in embedded mode over ``args.uri`` until interrupted. The keys are
    ``args.api_keys`` when a caller set it (``superfile demo --serve`` makes one for its run), else
    ``SUPERFILE_API_KEYS``; both as ``key:table-glob:scopes,...``."""
    keys = args.api_keys if args.api_keys is not None else os.environ.get("SUPERFILE_API_KEYS", "")
    try:
        settings = Settings(
            storage=args.uri,
            api_keys=parse_api_keys(keys),
            auth=not args.no_auth,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            cache_dir=args.cache_dir,
            cache_budget_bytes=args.cache_budget_bytes,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if not settings.auth:
        print("warning: authentication is off (--no-auth): any caller may read and write any table", file=sys.stderr)
    from superfile_gateway.__main__ import serve  # uvicorn and the app: only when serving

    serve(settings)
