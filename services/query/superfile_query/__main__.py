"""``superfile-query serve``: run a query root over cache nodes (docs/query.md)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

import uvicorn
from superfile.allocator import tune_for_serving
from superfile_gateway.settings import ConfigError, Settings

from superfile_query.app import create_app, query_settings

__all__ = ["main"]

_FROM_ENV = (
    "sql_workers",
    "sql_timeout_s",
    "sql_memory_bytes",
    "sql_max_concurrent",
    "search_max_concurrent",
    "max_concurrent_per_key",
    "max_result_rows",
    "drain_s",
    "max_body_bytes",
)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="superfile-query", description="a Supertable query root over cache nodes")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the read API, fanning out to cache nodes")
    s.add_argument("--uri", required=True, help="the storage root of the tables (s3://bucket/prefix, file:///dir)")
    s.add_argument("--port", type=int, required=True, help="listen port")
    s.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; 0.0.0.0 in a pod)")
    nodes = s.add_mutually_exclusive_group(required=True)
    nodes.add_argument("--cache-nodes", help="cache node URLs, comma-separated (http://host:port,...)")
    nodes.add_argument("--cache-dns", help="host:port of the cache nodes' headless Service (each address a node)")
    args = p.parse_args(argv)
    token = os.environ.get("SUPERFILE_INTERNAL_TOKEN", "")
    if not token:
        print("error: set SUPERFILE_INTERNAL_TOKEN, the secret gateways and cache nodes share", file=sys.stderr)
        return 2
    urls = [u.strip() for u in (args.cache_nodes or "").split(",") if u.strip()]
    try:
        # the limits a gateway reads from SUPERFILE_* (SQL time, memory and workers, caps, rows, drain) bind here too
        env = Settings.from_env({**os.environ, "SUPERFILE_STORAGE": args.uri, "SUPERFILE_NO_AUTH": "1"})
        settings = query_settings(
            args.uri,
            token,
            cache_nodes=urls,
            cache_dns=args.cache_dns,
            host=args.host,
            port=args.port,
            **{name: getattr(env, name) for name in _FROM_ENV},
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tune_for_serving()  # as the gateway: a serving process's reads free what they decode at any time
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,  # the gateway in front logs the caller's request; this one is its copy
        timeout_graceful_shutdown=math.ceil(settings.drain_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
