"""``superfile-cache serve``: run a cache node (docs/query.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import uvicorn
from superfile.allocator import tune_for_serving

from superfile_cache.app import NodeSettings, create_app

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="superfile-cache", description="a Supertable cache node (leaf of the read path)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve leaf requests for the tables below --uri")
    s.add_argument("--uri", required=True, help="the storage root of the tables (s3://bucket/prefix, file:///dir)")
    s.add_argument("--port", type=int, required=True, help="listen port")
    s.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; 0.0.0.0 in a pod)")
    s.add_argument("--cache-dir", required=True, help="where the superfiles this node owns are kept")
    s.add_argument(
        "--disk-budget-bytes", type=int, default=64 << 30, help="bytes of superfile copies on disk (default 64 GiB)"
    )
    s.add_argument(
        "--memory-budget-bytes", type=int, default=None, help="bytes of mapped copies resident (default: unbounded)"
    )
    args = p.parse_args(argv)
    token = os.environ.get("SUPERFILE_INTERNAL_TOKEN", "")
    if not token:
        print("error: set SUPERFILE_INTERNAL_TOKEN, the secret query roots send to cache nodes", file=sys.stderr)
        return 2
    if args.disk_budget_bytes < 1 or (args.memory_budget_bytes is not None and args.memory_budget_bytes < 1):
        print("error: --disk-budget-bytes and --memory-budget-bytes must be positive", file=sys.stderr)
        return 2
    settings = NodeSettings(
        uri=args.uri,
        cache_dir=args.cache_dir,
        token=token,
        disk_budget_bytes=args.disk_budget_bytes,
        memory_budget_bytes=args.memory_budget_bytes,
        host=args.host,
        port=args.port,
    )
    tune_for_serving()  # as the gateway: a serving process's reads free what they decode at any time
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
