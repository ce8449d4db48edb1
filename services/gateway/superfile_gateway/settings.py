"""Gateway configuration: one frozen dataclass, built in code or from ``SUPERFILE_*`` environment variables."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from superfile.io.cache import DEFAULT_BUDGET_BYTES

__all__ = ["ApiKey", "ConfigError", "Settings", "parse_api_keys"]

_SCOPES = frozenset("rw")


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

    def __post_init__(self) -> None:
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

    @property
    def mode(self) -> str:
        return "suite" if self.kafka else "embedded"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """``SUPERFILE_STORAGE`` (required), ``SUPERFILE_API_KEYS``, ``SUPERFILE_NO_AUTH``, ``SUPERFILE_KAFKA``,
        ``SUPERFILE_TOPIC_PREFIX``, ``SUPERFILE_MAX_BODY_BYTES``, ``SUPERFILE_WAIT_TIMEOUT_S``,
        ``SUPERFILE_CLEANUP_MIN_AGE_S``, ``SUPERFILE_HOST``, ``SUPERFILE_PORT``, ``SUPERFILE_CACHE_DIR``,
        ``SUPERFILE_CACHE_BUDGET_BYTES``, ``SUPERFILE_CACHE_MEMORY_BYTES``."""
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
            )
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"invalid gateway setting: {exc}") from None
