"""Gateway configuration: one frozen dataclass, built in code or from ``SUPERFILE_*`` environment variables."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from superfile.io.cache import DEFAULT_BUDGET_BYTES

__all__ = ["ApiKey", "ConfigError", "Settings", "parse_api_keys"]

_SCOPES = frozenset("rw")
_MIN_WORKER_BYTES = 384 << 20


class ConfigError(ValueError):
    """The gateway's configuration is unusable; it refuses to start."""


@dataclass(frozen=True)
class ApiKey:
    """One grant: a key (kept only as its SHA-256), the table names it covers (a glob) and its scopes.

    ``r`` allows reads (searches, scans, SQL, describe), ``w`` writes (append, update, delete, create,
    drop). A key may appear in several entries, e.g. ``k:*:r,k:docs:rw``.
    """

    digest: bytes = field(repr=False)
    table_glob: str
    scopes: frozenset[str]

    @classmethod
    def parse(cls, entry: str) -> ApiKey:
        """``key:table-glob:scopes``; the key itself may contain ':' (the last two fields are split off)."""
        parts = entry.strip().rsplit(":", 2)
        if len(parts) != 3 or not all(parts):
            raise ConfigError("an API key entry must look like key:table-glob:scopes (e.g. k1:*:rw)")
        key, glob, scopes = parts
        if not set(scopes) <= _SCOPES:
            raise ConfigError(f"API key scopes must be r, w or rw, got {scopes!r} for table glob {glob!r}")
        return cls(hashlib.sha256(key.encode()).digest(), glob, frozenset(scopes))


def parse_api_keys(text: str) -> tuple[ApiKey, ...]:
    """Comma-separated ``key:table-glob:scopes`` entries (blank entries ignored)."""
    return tuple(ApiKey.parse(e) for e in text.split(",") if e.strip())


def _flag(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected a boolean (1/0, true/false), got {value!r}")


@dataclass(frozen=True)
class Settings:
    """Everything a gateway process needs.

    ``kafka`` set means suite mode (writes become events on the table's
    topic; a builder commits them); None means embedded mode (writes commit
    through the engine in this process). With no ``api_keys`` the gateway
    refuses to start unless ``auth`` is False (every request then has every
    scope: for a laptop, never for a shared deployment).
    """

    storage: str
    api_keys: tuple[ApiKey, ...] = ()
    auth: bool = True
    kafka: str | None = None
    topic_prefix: str = "superfile"
    max_body_bytes: int = 64 << 20
    wait_timeout_s: float = 30.0
    # A cleanup whose safety margin (by default its window) is below this is refused: an in-flight commit's
    # files are unreferenced until it publishes and only their age protects them.
    cleanup_min_age_s: float = 3600.0
    host: str = "127.0.0.1"
    port: int = 8000
    # the disk cache for superfiles on remote storage (superfile.connect's options of the same names)
    cache_dir: str | None = None
    cache_budget_bytes: int = DEFAULT_BUDGET_BYTES
    cache_memory_bytes: int | None = None
    # limits (docs/gateway.md, "Limits")
    sql_workers: int = 2  # processes running SQL
    sql_timeout_s: float = 30.0  # a SQL query past this is stopped (its worker killed)
    sql_memory_bytes: int = 2 << 30  # resident memory of all SQL workers together (DataFusion's pools inside it)
    sql_max_concurrent: int = 4  # SQL queries admitted at once (running, or waiting for a worker)
    search_max_concurrent: int = 32  # searches, scans and counts at once
    max_concurrent_per_key: int = 8  # SQL queries and searches at once from one API key
    max_result_rows: int = 1_000_000  # rows one SQL query, scan, token_match or exact_match may return
    drain_s: float = 10.0  # on SIGTERM: finish requests in flight for this long, then stop what still runs
    # maintenance that runs itself (embedded mode; the builder maintains in suite mode): docs/maintenance.md
    maintenance: bool = True
    compact_small_files: int = 16  # compact a partition holding more small superfiles than this (0: never)
    cleanup_interval_s: float = 3600.0  # clean up each table that commits at most this often (0: never)
    retention_s: float = 7 * 86400.0  # versions (and unreferenced files) younger than this stay
    # warm on commit (docs/gateway.md): how often the tables this process uses are checked for a new version,
    # whose superfiles and indexes are then opened before a search needs them (0: never)
    warm_interval_s: float = 1.0
    # the distributed read path (docs/query.md): a gateway with ``query_url`` sends every read to the query
    # service; a query service (``superfile-query serve``) runs reads on ``cache_nodes`` or ``cache_dns``. All
    # three authenticate each other with ``internal_token``.
    query_url: str | None = None
    internal_token: str | None = field(default=None, repr=False)
    cache_nodes: tuple[str, ...] = ()
    cache_dns: str | None = None

    def __post_init__(self) -> None:
        if (self.query_url or self.cache_nodes or self.cache_dns) and not self.internal_token:
            raise ConfigError(
                "the distributed read path needs the shared secret of its services: set SUPERFILE_INTERNAL_TOKEN"
            )
        if self.query_url is not None and not self.query_url.startswith(("http://", "https://")):
            raise ConfigError(f"SUPERFILE_QUERY_URL must be an http(s) URL, got {self.query_url!r}")
        if not self.storage:
            raise ConfigError("the storage URI is required (SUPERFILE_STORAGE)")
        if self.auth and not self.api_keys:
            raise ConfigError(
                "no API keys configured: set SUPERFILE_API_KEYS (key:table-glob:scopes, comma-separated), "
                "or disable authentication explicitly (SUPERFILE_NO_AUTH=1 / superfile serve --no-auth)"
            )
        if self.max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if not self.wait_timeout_s > 0:
            raise ConfigError(f"wait_timeout_s must be positive, got {self.wait_timeout_s}")
        if not self.cleanup_min_age_s >= 0:
            raise ConfigError(f"cleanup_min_age_s must be non-negative, got {self.cleanup_min_age_s}")
        if self.cache_budget_bytes < 0 or (self.cache_memory_bytes is not None and self.cache_memory_bytes < 1):
            raise ConfigError(
                f"cache_budget_bytes must be >= 0 and cache_memory_bytes positive, got {self.cache_budget_bytes} "
                f"and {self.cache_memory_bytes}"
            )

        for name in (
            "sql_workers",
            "sql_memory_bytes",
            "sql_max_concurrent",
            "search_max_concurrent",
            "max_concurrent_per_key",
            "max_result_rows",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.sql_memory_bytes // self.sql_workers < _MIN_WORKER_BYTES:
            raise ConfigError(
                f"sql_memory_bytes ({self.sql_memory_bytes}) gives each of the {self.sql_workers} SQL workers less "
                f"than {_MIN_WORKER_BYTES >> 20} MiB (a worker's own code takes about 180 MB)"
            )
        if self.compact_small_files < 0 or self.cleanup_interval_s < 0:
            raise ConfigError("compact_small_files and cleanup_interval_s must be non-negative")
        if self.retention_s < self.cleanup_min_age_s:
            raise ConfigError(
                f"retention_s ({self.retention_s:g}) is below cleanup_min_age_s ({self.cleanup_min_age_s:g}): "
                "automatic cleanup could delete the files of commits in flight"
            )
        if not self.warm_interval_s >= 0:
            raise ConfigError(f"warm_interval_s must be non-negative, got {self.warm_interval_s}")
        if not self.sql_timeout_s > 0 or not self.drain_s >= 0:
            raise ConfigError(
                f"sql_timeout_s must be positive and drain_s non-negative, got {self.sql_timeout_s} and {self.drain_s}"
            )

    @property
    def mode(self) -> str:
        return "suite" if self.kafka else "embedded"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """``SUPERFILE_STORAGE`` (required), ``SUPERFILE_API_KEYS``, ``SUPERFILE_NO_AUTH``, ``SUPERFILE_KAFKA``,
        ``SUPERFILE_TOPIC_PREFIX``, ``SUPERFILE_MAX_BODY_BYTES``, ``SUPERFILE_WAIT_TIMEOUT_S``,
        ``SUPERFILE_CLEANUP_MIN_AGE_S``, ``SUPERFILE_HOST``, ``SUPERFILE_PORT``, ``SUPERFILE_CACHE_DIR``,
        ``SUPERFILE_CACHE_BUDGET_BYTES``, ``SUPERFILE_CACHE_MEMORY_BYTES``, and the limits:
        ``SUPERFILE_SQL_WORKERS``, ``SUPERFILE_SQL_TIMEOUT_S``, ``SUPERFILE_SQL_MEMORY_BYTES``,
        ``SUPERFILE_SQL_MAX_CONCURRENT``, ``SUPERFILE_SEARCH_MAX_CONCURRENT``, ``SUPERFILE_MAX_CONCURRENT_PER_KEY``,
        ``SUPERFILE_MAX_RESULT_ROWS``, ``SUPERFILE_DRAIN_S``; maintenance: ``SUPERFILE_MAINTENANCE``,
        ``SUPERFILE_COMPACT_SMALL_FILES``, ``SUPERFILE_CLEANUP_INTERVAL_S``, ``SUPERFILE_RETENTION_S``;
        ``SUPERFILE_WARM_INTERVAL_S``; the read path: ``SUPERFILE_QUERY_URL``, ``SUPERFILE_INTERNAL_TOKEN``."""
        e = os.environ if env is None else env
        try:
            return cls(
                storage=e.get("SUPERFILE_STORAGE", ""),
                api_keys=parse_api_keys(e.get("SUPERFILE_API_KEYS", "")),
                auth=not _flag(e.get("SUPERFILE_NO_AUTH", "")),
                kafka=e.get("SUPERFILE_KAFKA") or None,
                topic_prefix=e.get("SUPERFILE_TOPIC_PREFIX", "superfile"),
                max_body_bytes=int(e.get("SUPERFILE_MAX_BODY_BYTES", 64 << 20)),
                wait_timeout_s=float(e.get("SUPERFILE_WAIT_TIMEOUT_S", 30.0)),
                cleanup_min_age_s=float(e.get("SUPERFILE_CLEANUP_MIN_AGE_S", 3600.0)),
                host=e.get("SUPERFILE_HOST", "127.0.0.1"),
                port=int(e.get("SUPERFILE_PORT", 8000)),
                cache_dir=e.get("SUPERFILE_CACHE_DIR") or None,
                cache_budget_bytes=int(e.get("SUPERFILE_CACHE_BUDGET_BYTES", DEFAULT_BUDGET_BYTES)),
                cache_memory_bytes=int(memory) if (memory := e.get("SUPERFILE_CACHE_MEMORY_BYTES")) else None,
                sql_workers=int(e.get("SUPERFILE_SQL_WORKERS", 2)),
                sql_timeout_s=float(e.get("SUPERFILE_SQL_TIMEOUT_S", 30.0)),
                sql_memory_bytes=int(e.get("SUPERFILE_SQL_MEMORY_BYTES", 2 << 30)),
                sql_max_concurrent=int(e.get("SUPERFILE_SQL_MAX_CONCURRENT", 4)),
                search_max_concurrent=int(e.get("SUPERFILE_SEARCH_MAX_CONCURRENT", 32)),
                max_concurrent_per_key=int(e.get("SUPERFILE_MAX_CONCURRENT_PER_KEY", 8)),
                max_result_rows=int(e.get("SUPERFILE_MAX_RESULT_ROWS", 1_000_000)),
                drain_s=float(e.get("SUPERFILE_DRAIN_S", 10.0)),
                maintenance=_flag(e.get("SUPERFILE_MAINTENANCE", "1")),
                compact_small_files=int(e.get("SUPERFILE_COMPACT_SMALL_FILES", 16)),
                cleanup_interval_s=float(e.get("SUPERFILE_CLEANUP_INTERVAL_S", 3600.0)),
                retention_s=float(e.get("SUPERFILE_RETENTION_S", 7 * 86400.0)),
                warm_interval_s=float(e.get("SUPERFILE_WARM_INTERVAL_S", 1.0)),
                query_url=e.get("SUPERFILE_QUERY_URL") or None,
                internal_token=e.get("SUPERFILE_INTERNAL_TOKEN") or None,
            )
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"invalid gateway setting: {exc}") from None
