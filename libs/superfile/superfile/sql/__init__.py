"""Read-only SQL over a connection's tables, with the search indexes as table functions (see docs/sql.md)."""

from __future__ import annotations

from superfile.sql.context import SqlSession, run_sql
from superfile.sql.functions import RRF_K, rrf_fuse
from superfile.sql.limits import SqlLimits

__all__ = ["RRF_K", "SqlLimits", "SqlSession", "rrf_fuse", "run_sql"]
