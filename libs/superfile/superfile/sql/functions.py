"""The search table functions: each runs the engine's per-superfile search fan-out on the query's pinned snapshot
and hands the hits back to DataFusion as a relation of ``_id``, the projected scalar columns and ``score``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
from datafusion import Table

from superfile.errors import InvalidInputError
from superfile.schema import ID, SCORE
from superfile.search.request import (
    Bm25Search,
    ExactMatch,
    HybridSearch,
    PrefixSearch,
    SearchRequest,
    TokenMatch,
    VectorSearch,
)
from superfile.table.search import RRF_K, Searcher, rrf_fuse
from superfile.table.snapshot import Snapshot

__all__ = ["FUNCTIONS", "RRF_K", "Session", "TableFunctionError", "rrf_fuse"]


class Session(Protocol):
    """What a table function needs of its query's session (``sql/context.SqlSession``)."""

    def resolve(self, name: str) -> str: ...

    def snapshot(self, name: str) -> Snapshot: ...

    def needed_columns(self, snap: Snapshot) -> list[str]: ...


class TableFunctionError(InvalidInputError):
    """A table function's arguments or run failed (re-raised as SqlError by the session)."""


def _value(arg: Any, fn: str, pos: int) -> Any:
    try:
        value = arg.python_value()
    except Exception:
        raise TableFunctionError(f"{fn}: argument {pos} must be a literal, got {arg}") from None
    if hasattr(value, "as_py"):
        value = value.as_py()
    return value


def _str(args: tuple[Any, ...], i: int, fn: str, what: str) -> str:
    v = _value(args[i], fn, i + 1)
    if not isinstance(v, str):
        raise TableFunctionError(f"{fn}: {what} (argument {i + 1}) must be a string, got {v!r}")
    return v


def _int(args: tuple[Any, ...], i: int, fn: str, what: str) -> int:
    v = _value(args[i], fn, i + 1)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TableFunctionError(f"{fn}: {what} (argument {i + 1}) must be an integer, got {v!r}")
    return v


def _vector(args: tuple[Any, ...], i: int, fn: str) -> list[float]:
    v = _value(args[i], fn, i + 1)
    if not isinstance(v, list | tuple) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise TableFunctionError(
            f"{fn}: the query vector (argument {i + 1}) must be an array literal of numbers, e.g. [0.1, 0.2]"
        )
    return [float(x) for x in v]


def _arity(args: tuple[Any, ...], fn: str, low: int, high: int, usage: str) -> None:
    if not low <= len(args) <= high:
        raise TableFunctionError(f"{fn} takes {usage}; got {len(args)} arguments")


def _relation(result: pa.Table, cols: list[str]) -> Table:
    """``_id``, the projected columns, ``score`` (in that order) as a DataFusion table."""
    out = pa.table(
        [result.column(ID), *(result.column(c) for c in cols), result.column(SCORE)],
        schema=pa.schema(
            [result.schema.field(ID), *(result.schema.field(c) for c in cols), result.schema.field(SCORE)]
        ),
    )
    return Table(ds.dataset(out))


def _run(session: Session, args: tuple[Any, ...], fn: str, request: Callable[[list[str]], SearchRequest]) -> Table:
    """Run the search ``request`` builds (given the columns the query needs) on the query's pinned snapshot."""
    name = session.resolve(_str(args, 0, fn, "the table name"))
    snap = session.snapshot(name)
    cols = [c for c in session.needed_columns(snap) if c not in (ID, SCORE)]
    return _relation(Searcher.of(snap).search(request(cols)), cols)


def vector_search(session: Session, *args: Any) -> Table:
    fn = "vector_search"
    _arity(args, fn, 4, 4, "(table, column, query_vector, k)")
    column, q, k = _str(args, 1, fn, "the column"), _vector(args, 2, fn), _int(args, 3, fn, "k")
    return _run(session, args, fn, lambda cols: VectorSearch(column=column, vector=q, k=k, projection=cols))


def bm25_search(session: Session, *args: Any) -> Table:
    fn = "bm25_search"
    _arity(args, fn, 4, 5, "(table, column, query, k [, mode 'any'|'all'])")
    mode = _str(args, 4, fn, "the mode") if len(args) > 4 else "any"
    column, query, k = _str(args, 1, fn, "the column"), _str(args, 2, fn, "the query"), _int(args, 3, fn, "k")
    return _run(session, args, fn, lambda cols: Bm25Search(column=column, query=query, k=k, mode=mode, projection=cols))


def bm25_search_prefix(session: Session, *args: Any) -> Table:
    fn = "bm25_search_prefix"
    _arity(args, fn, 4, 4, "(table, column, prefix, k)")
    column, prefix, k = _str(args, 1, fn, "the column"), _str(args, 2, fn, "the prefix"), _int(args, 3, fn, "k")
    return _run(session, args, fn, lambda cols: PrefixSearch(column=column, prefix=prefix, k=k, projection=cols))


def token_match(session: Session, *args: Any) -> Table:
    fn = "token_match"
    _arity(args, fn, 3, 4, "(table, column, query [, mode 'and'|'or'])")
    mode = _str(args, 3, fn, "the mode") if len(args) > 3 else "and"
    column, tokens = _str(args, 1, fn, "the column"), _str(args, 2, fn, "the query")
    return _run(session, args, fn, lambda cols: TokenMatch(column=column, tokens=tokens, mode=mode, projection=cols))


def exact_match(session: Session, *args: Any) -> Table:
    fn = "exact_match"
    _arity(args, fn, 3, 3, "(table, column, value)")
    column, value = _str(args, 1, fn, "the column"), _str(args, 2, fn, "the value")
    return _run(session, args, fn, lambda cols: ExactMatch(column=column, value=value, projection=cols))


def hybrid_search(session: Session, *args: Any) -> Table:
    fn = "hybrid_search"
    _arity(args, fn, 6, 6, "(table, text_column, query_text, vector_column, query_vector, k)")
    text_col, q_text = _str(args, 1, fn, "the text column"), _str(args, 2, fn, "the text query")
    vec_col, q_vec, k = _str(args, 3, fn, "the vector column"), _vector(args, 4, fn), _int(args, 5, fn, "k")
    return _run(
        session,
        args,
        fn,
        lambda cols: HybridSearch(
            text_column=text_col, query=q_text, vector_column=vec_col, vector=q_vec, k=k, projection=cols
        ),
    )


FUNCTIONS: dict[str, Callable[..., Table]] = {
    "vector_search": vector_search,
    "bm25_search": bm25_search,
    "bm25_search_prefix": bm25_search_prefix,
    "token_match": token_match,
    "exact_match": exact_match,
    "hybrid_search": hybrid_search,
}
