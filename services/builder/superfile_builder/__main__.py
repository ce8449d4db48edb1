"""``superfile-builder``: runs one pipeline per table, serves ``/metrics``.

Tables are the ``--tables`` given, or every table found in storage,
rescanned every ``--rescan-ms``; a table only gets a pipeline once it exists
in storage (the gateway creates tables directly there). Events on topics of
tables that do not exist are left in the log, unapplied. SIGTERM/SIGINT stop
every pipeline (each commits what it staged while it still holds its lease)
and release the leases; a SIGKILLed builder's leases expire after
``--lease-ms``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

import redis
import superfile
from superfile.allocator import bound_arenas
from superfile.connection import Connection
from superfile.io.cache import DEFAULT_BUDGET_BYTES
from superfile.maintenance import CompactionPolicy, Compactor
from superfile.telemetry import serve

from superfile_builder.lease import LeaseKeeper
from superfile_builder.metrics import BuilderMetrics
from superfile_builder.pipeline import PipelineConfig, TablePipeline

__all__ = ["Builder", "main", "parse_args"]

log = logging.getLogger("superfile_builder")


class Builder:
    """The supervisor: keeps a running pipeline for every table it should build."""

    def __init__(
        self,
        storage: str,
        config: PipelineConfig,
        redis_url: str,
        *,
        tables: Sequence[str] | None = None,
        lease_ms: int = 5000,
        rescan_ms: int = 5000,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``connect_options``: ``superfile.connect``'s options (the disk cache's) for this process and the
        compaction process."""
        options = dict(connect_options or {})
        conn = superfile.connect(storage, **options)
        if not isinstance(conn, Connection):  # a gateway's URL: the builder writes the table's storage itself
            raise ValueError(f"the builder needs a storage URI (file://, s3://, memory://), got {storage!r}")
        self.conn = conn
        self.config = config
        self.tables = list(tables) if tables else None
        self.rescan_s = rescan_ms / 1000
        self.metrics = BuilderMetrics()
        self.leases = LeaseKeeper(redis.Redis.from_url(redis_url), lease_ms)
        self.pipelines: dict[str, TablePipeline] = {}
        self.compactor = Compactor(storage, config.compaction, options) if config.compaction.enabled else None
        self._stop = threading.Event()

    def scan(self) -> None:
        """Start pipelines for tables that need one; stop those whose table is no longer wanted."""
        existing = set(self.conn.table_names())
        wanted = existing if self.tables is None else existing & set(self.tables)
        for name, pipeline in list(self.pipelines.items()):
            if not pipeline.is_alive() or name not in wanted:
                pipeline.stop()
                pipeline.join(timeout=30)
                del self.pipelines[name]
                self.metrics.forget(name)
                if name not in wanted:
                    self.leases.forget(name)
        for name in sorted(wanted - set(self.pipelines)):
            lease = self.leases.lease(name)
            pipeline = TablePipeline(self.conn, name, self.config, lease, self.metrics, self.compactor)
            self.pipelines[name] = pipeline
            pipeline.start()
            log.info("table %s: pipeline started", name)

    def run(self) -> None:
        self.leases.start()
        try:
            while not self._stop.is_set():
                try:
                    self.scan()
                except Exception:
                    log.exception("table scan failed")
                    self.metrics.errors.labels(table="", kind="scan").inc()
                self._stop.wait(self.rescan_s)
        finally:
            for pipeline in self.pipelines.values():
                pipeline.stop()
            for pipeline in self.pipelines.values():
                pipeline.join(timeout=30)
            if self.compactor is not None:
                self.compactor.close()
            self.leases.close()

    def stop(self) -> None:
        self._stop.set()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="superfile-builder", description=__doc__.split("\n")[0])
    p.add_argument("--storage", required=True, help="table root URI (s3://bucket/prefix?endpoint_url=..., file://...)")
    p.add_argument("--kafka", required=True, help="bootstrap HOST:PORT")
    p.add_argument("--redis", required=True, help="redis://HOST:PORT/DB for the leases")
    p.add_argument("--tables", type=lambda s: [t for t in s.split(",") if t], help="a,b (default: every table)")
    p.add_argument("--commit-rows", type=int, default=100_000, help="commit once this many rows are staged")
    p.add_argument("--commit-bytes", type=int, default=256 << 20, help="commit once this many record bytes are staged")
    p.add_argument("--freshness-ms", type=int, default=1000, help="commit a batch at most this long after its start")
    p.add_argument(
        "--compact-small-files",
        type=int,
        default=16,
        help="compact a table once a partition holds more superfiles below half the target size (0: never)",
    )
    p.add_argument(
        "--compact-target-rows", type=int, help="rows per compacted superfile (default: the table's maximum)"
    )
    p.add_argument(
        "--cleanup-interval-s",
        type=float,
        default=3600.0,
        help="clean up each table at most this often, by --retention-s (0: never)",
    )
    p.add_argument(
        "--retention-s",
        type=float,
        default=7 * 86400.0,
        help="cleanup keeps versions and unreferenced files younger than this (at least --cleanup-min-age-s)",
    )
    p.add_argument(
        "--cleanup-min-age-s",
        type=float,
        default=3600.0,
        help="the least --retention-s accepted: it also protects the files of commits in flight, so it must exceed "
        "the longest commit or compaction (lower it only for short-lived tables, e.g. a soak test)",
    )
    p.add_argument("--lease-ms", type=int, default=5000, help="lease ttl: a dead builder's tables wait this long")
    p.add_argument("--rescan-ms", type=int, default=5000, help="how often storage is listed for new tables")
    p.add_argument("--topic-prefix", default="superfile")
    p.add_argument("--metrics-port", type=int, default=9101, help="0 disables /metrics")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--cache-dir", help="disk cache of superfiles read back from s3:// (default: under TMPDIR)")
    p.add_argument("--cache-budget-bytes", type=int, default=DEFAULT_BUDGET_BYTES, help="its size on disk (0: none)")
    p.add_argument("--cache-memory-bytes", type=int, help="bound on its resident mappings (default: none)")
    args = p.parse_args(argv)
    for name in ("commit_rows", "commit_bytes", "freshness_ms", "rescan_ms"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.lease_ms < 100:
        p.error("--lease-ms must be at least 100")
    if args.cleanup_interval_s < 0 or args.cleanup_min_age_s <= 0:
        p.error("--cleanup-interval-s must be >= 0 and --cleanup-min-age-s positive")
    if args.retention_s < args.cleanup_min_age_s:
        p.error(
            f"--retention-s ({args.retention_s:g}) is below --cleanup-min-age-s ({args.cleanup_min_age_s:g}): "
            "cleanup could delete the files of commits in flight"
        )
    if args.compact_small_files < 0:
        p.error("--compact-small-files must be 0 (off) or positive")
    if args.compact_target_rows is not None and args.compact_target_rows < 1:
        p.error("--compact-target-rows must be positive")
    if args.cache_budget_bytes < 0 or (args.cache_memory_bytes is not None and args.cache_memory_bytes < 1):
        p.error("--cache-budget-bytes must be >= 0 and --cache-memory-bytes positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    bound_arenas()  # before the pipelines' threads: what their commits free goes back (docs/builder.md, "Memory")
    config = PipelineConfig(
        kafka=args.kafka,
        commit_rows=args.commit_rows,
        commit_bytes=args.commit_bytes,
        freshness_ms=args.freshness_ms,
        topic_prefix=args.topic_prefix,
        compaction=CompactionPolicy(args.compact_small_files, args.compact_target_rows),
        cleanup_interval_s=args.cleanup_interval_s,
        retention_s=args.retention_s,
    )
    cache = {name: getattr(args, name) for name in ("cache_dir", "cache_budget_bytes", "cache_memory_bytes")}
    builder = Builder(
        args.storage,
        config,
        args.redis,
        tables=args.tables,
        lease_ms=args.lease_ms,
        rescan_ms=args.rescan_ms,
        connect_options=cache,
    )
    server = serve(args.metrics_port) if args.metrics_port else None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        builder.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("builder %s started (storage %s, kafka %s)", builder.leases.owner, args.storage, args.kafka)
    try:
        builder.run()
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    main()
