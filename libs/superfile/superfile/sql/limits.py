"""Limits on one SQL query: its text (checked before anything is planned), its memory and its result.

DataFusion plans recursively: a query of 10,000 ``OR``s crashed the process inside its planner, and 7,000
took 10 s to plan. So the text is bounded first (length, expression depth and node count), after long
``OR`` chains of equalities on one column have become ``IN`` lists (the same rows; one node per value
instead of three). Memory is DataFusion's fair spill pool: operators that can spill to disk do, the others
fail with a :class:`QueryLimitError` naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from superfile.errors import QueryLimitError

__all__ = ["SqlLimits", "check_text"]

_IN_FROM = 16  # OR chains of at least this many equalities on one column become IN lists
_DIALECT = "postgres"


@dataclass(frozen=True)
class SqlLimits:
    """What one query may use; ``None`` leaves that dimension unbounded."""

    memory_bytes: int | None = None  # DataFusion's memory pool (spills where an operator can)
    max_rows: int | None = None  # rows in the result
    max_length: int = 1_000_000  # characters of query text
    max_nodes: int = 20_000  # expression nodes after OR chains became IN lists
    max_depth: int = 200  # nesting of expressions


def check_text(query: str, limits: SqlLimits) -> str:
    """The query to plan: ``query`` itself, or with long OR-of-equality chains as IN lists. Raises
    :class:`QueryLimitError` when the text is longer, deeper or larger than the limits allow."""
    if len(query) > limits.max_length:
        raise QueryLimitError(f"the query has {len(query)} characters; the limit is {limits.max_length}")
    try:
        tree = sqlglot.parse_one(query, read=_DIALECT)
    except RecursionError:
        raise QueryLimitError(f"the query nests deeper than the limit of {limits.max_depth} levels") from None
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError, TypeError):
        # DataFusion reports what it cannot parse, with its own message (sqlglot raises TypeError on a few
        # inputs it cannot build a tree for, found by tests/hostile/test_entry_point_fuzz.py)
        return query
    rewritten = _or_chains_to_in(tree)
    nodes = depth = 0
    stack: list[tuple[exp.Expr, int]] = [(tree, 1)]
    while stack:  # iterative: the tree may be deeper than Python's recursion limit
        node, d = stack.pop()
        nodes += 1
        depth = max(depth, d)
        stack.extend((child, d + 1) for child in node.iter_expressions())
    if nodes > limits.max_nodes:
        raise QueryLimitError(f"the query has {nodes} expression nodes; the limit is {limits.max_nodes}")
    if depth > limits.max_depth:
        raise QueryLimitError(f"the query nests {depth} levels deep; the limit is {limits.max_depth}")
    return tree.sql(dialect=_DIALECT) if rewritten else query


def _or_chains_to_in(tree: exp.Expr) -> bool:
    """Replace each chain ``c = v1 OR c = v2 OR ...`` (one column, literals) by ``c IN (v1, v2, ...)``."""
    chains = [node for node in tree.find_all(exp.Or) if not isinstance(node.parent, exp.Or)]
    changed = False
    for chain in chains:
        column, values = None, []
        for leaf in chain.flatten():
            if not isinstance(leaf, exp.EQ):
                break
            left, right = leaf.this, leaf.expression
            if isinstance(right, exp.Column) and isinstance(left, exp.Literal):
                left, right = right, left
            if not (isinstance(left, exp.Column) and isinstance(right, exp.Literal)):
                break
            if column is not None and left != column:
                break
            column = left
            values.append(right)
        else:
            if column is not None and len(values) >= _IN_FROM:
                chain.replace(exp.In(this=column.copy(), expressions=[v.copy() for v in values]))
                changed = True
    return changed
