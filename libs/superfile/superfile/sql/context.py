"""One DataFusion session per query, over pinned snapshots of the tables the query names.

The session holds only in-memory tables built from ``Snapshot.scan`` (scalar
and full-text columns; vector columns are never registered) and the search
table functions. Nothing that reads files, object stores or URLs is
registered, and statements run with DDL, DML and ``SET``-style statements
disallowed, so a query can only read the rows handed to it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from datafusion import SessionConfig, SessionContext, SQLOptions, udtf

from superfile.errors import InvalidPredicateError, SqlError, SuperfileError, TableNotFoundError
from superfile.expressions import Predicate, parse_predicate
from superfile.sql.functions import FUNCTIONS, TableFunctionError
from superfile.sql.plan import QueryHints, analyze
from superfile.table.snapshot import Snapshot

if TYPE_CHECKING:
    from superfile.connection import Connection

__all__ = ["SqlSession", "run_sql"]

_PUSHABLE_TYPES = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_large_string)


def _options() -> SQLOptions:
    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    for prefix in ("DataFusion error: ", "Execution error: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


class SqlSession:
    """Pinned snapshots (one per table, taken on first use) and the DataFusion context of one query."""

    def __init__(self, conn: Connection, query: str) -> None:
        self.conn = conn
        self.query = query
        self.hints: QueryHints = analyze(query)
        self._snapshots: dict[str, Snapshot] = {}
        self._lock = threading.Lock()
        self.error: SuperfileError | None = None  # the first error a table function raised
        self.pushed: dict[str, str] = {}  # table -> predicate text pushed into its scan (for tests and docs)
        config = SessionConfig().with_information_schema(False).with_target_partitions(4)
        self.ctx = SessionContext(config)
        for name, fn in FUNCTIONS.items():
            self.ctx.register_udtf(udtf(self._bind(fn), name))

    # -- snapshots ------------------------------------------------------------------
    def _resolve(self, name: str) -> str:
        names = self.conn.table_names()
        if name in names:
            return name
        folded = [n for n in names if n.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        raise TableNotFoundError(f"table {name!r} does not exist")

    def snapshot(self, name: str) -> Snapshot:
        """The query's pinned snapshot of ``name`` (the same one for every use in this query)."""
        with self._lock:
            snap = self._snapshots.get(name)
            if snap is None:
                snap = self.conn.open_table(name)._current()
                self._snapshots[name] = snap
            return snap

    def scalar_columns(self, snap: Snapshot) -> list[str]:
        vectors = snap.manifest.options.vector_columns
        return [n for n in snap.schema.names if n not in vectors]

    def needed_columns(self, snap: Snapshot) -> list[str]:
        """Scalar columns the query may read (all of them for ``*``); vector columns never."""
        scalar = self.scalar_columns(snap)
        wanted = self.hints.columns(scalar)
        return scalar if wanted is None else wanted

    def _bind(self, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            try:
                return fn(self, *args)
            except SuperfileError as e:
                self.error = e  # re-raised by run() with its own message, not DataFusion's wrapping
                raise TableFunctionError(str(e)) from e

        return call

    # -- tables -----------------------------------------------------------------------
    def _pushdown(self, name: str, snap: Snapshot) -> Predicate | None:
        texts = self.hints.pushdown.get(name)
        if not texts:
            return None
        kept = []
        for text in texts:
            try:
                pred = parse_predicate(text, snap.schema)
            except (InvalidPredicateError, SuperfileError):
                continue
            fields = [snap.schema.field(c) for c in pred.columns]
            if all(any(ok(f.type) for ok in _PUSHABLE_TYPES) for f in fields):
                kept.append(f"({text})")
        if not kept:
            return None
        self.pushed[name] = " AND ".join(kept)
        return parse_predicate(self.pushed[name], snap.schema)

    def register_tables(self) -> None:
        for name in self.conn.table_names():
            if not self.hints.mentions_table(name):
                continue
            snap = self.snapshot(name)
            rows = snap.scan(self.needed_columns(snap), self._pushdown(name, snap))
            self._register(name, rows)

    def _register(self, name: str, rows: pa.Table) -> None:
        batches = rows.to_batches()
        if rows.num_rows > 65536:
            size = max(65536, -(-rows.num_rows // 4))
            batches = rows.combine_chunks().to_batches(max_chunksize=size)
        partitions = [[b] for b in batches] or [[pa.RecordBatch.from_pylist([], schema=rows.schema)]]
        self.ctx.register_record_batches(name, partitions)
        if name.lower() != name and self.hints.mentions_table(name.lower()):
            self.ctx.register_record_batches(name.lower(), partitions)

    # -- run --------------------------------------------------------------------------
    def run(self) -> pa.Table:
        try:
            self.register_tables()
            df = self.ctx.sql_with_options(self.query, _options())
            return df.to_arrow_table()
        except SqlError:
            raise
        except SuperfileError as e:
            raise SqlError(str(e)) from e
        except Exception as e:  # noqa: BLE001 - DataFusion raises plain Exceptions with the engine's message
            if self.error is not None:
                raise SqlError(str(self.error)) from self.error
            raise SqlError(_message(e)) from e


def run_sql(conn: Connection, query: str) -> pa.Table:
    """Run one read-only SQL query over the connection's tables (see docs/sql.md)."""
    if not isinstance(query, str) or not query.strip():
        raise SqlError("the query must be a non-empty SQL string")
    return SqlSession(conn, query).run()
