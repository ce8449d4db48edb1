"""SQL ``where`` predicates over a table's scalar columns.

``parse_predicate`` turns text such as ``"label = 'cat' AND year >= 2000"``
into a :class:`Predicate` that is type-checked against the table schema,
evaluates with SQL three-valued logic through Arrow compute only (nothing in
a predicate can reach files or the network), and answers whether a file can
be skipped given its column statistics. See ``docs/predicates.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from ..errors import InvalidPredicateError
from .evaluate import ExpressionBackend, compile_node, evaluate_mask
from .nodes import Node, iter_columns, to_sql
from .parser import parse, parse_conjuncts
from .prune import ColumnStats, might_match, stats_from_table

__all__ = ["ColumnStats", "Predicate", "parse_predicate", "predicate_of_conjuncts", "stats_from_table"]


class Predicate:
    """A parsed, type-checked predicate; immutable and safe to share between threads."""

    __slots__ = ("_root", "_text", "columns")

    def __init__(self, root: Node) -> None:
        self._root = root
        self._text = to_sql(root)
        self.columns: frozenset[str] = frozenset(c.name for c in iter_columns(root))

    @property
    def root(self) -> Node:
        """The typed tree, for planners that map parts of it to indexes."""
        return self._root

    def to_arrow(self) -> pc.Expression:
        """Lazy Arrow expression (for ``pyarrow.dataset`` / ``Table.filter``); NULL rows are not selected."""
        expression: pc.Expression = compile_node(self._root, ExpressionBackend())
        return expression

    def evaluate(self, table: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
        """Selection mask over ``table``: TRUE where the predicate holds, FALSE otherwise (NULL included).

        Raises InvalidPredicateError when the data makes the predicate fail,
        e.g. integer arithmetic overflow.
        """
        try:
            return evaluate_mask(self._root, table)
        except pa.ArrowInvalid as e:
            raise InvalidPredicateError(f"predicate {self._text} cannot be evaluated on this data: {e}") from None

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        """False only if no row of a file with these statistics can match; missing columns are unknown."""
        return might_match(self._root, stats)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Predicate({self._text!r})"


def parse_predicate(where: str, schema: pa.Schema) -> Predicate:
    """Parse and type-check ``where`` against ``schema``.

    Raises UnknownColumnError for a column the schema lacks and
    InvalidPredicateError for anything else that is wrong or unsupported.
    """
    return Predicate(parse(where, schema))


def predicate_of_conjuncts(conjuncts: list[exp.Expression], schema: pa.Schema) -> Predicate:
    """The AND of ``WHERE`` conjuncts a SQL query's parse already holds, type-checked like
    :func:`parse_predicate` (same errors), without printing and parsing them again."""
    return Predicate(parse_conjuncts(conjuncts, schema))
