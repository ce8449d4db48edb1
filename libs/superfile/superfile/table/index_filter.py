"""Row-level index use for WHERE: bound a predicate to candidate rows through a superfile's indexes.

Comparisons, IN, IS [NOT] NULL and BETWEEN on a column with a scalar index,
and equality / IN on a full-text column (through its exact-value hash), map to
Roaring bitmaps; AND and OR combine them. Anything the indexes cannot bound
(negation, LIKE, arithmetic, functions, unindexed columns) returns None and
the caller scans. The bitmaps are a superset of the matches: the caller
re-checks the exact predicate on the candidate rows only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyroaring

from superfile.expressions import Predicate
from superfile.expressions.nodes import (
    And,
    Between,
    Column,
    Compare,
    ConstPlan,
    InList,
    InPlan,
    IsNull,
    Node,
    Or,
    ScalarPlan,
)
from superfile.format.fulltext import thread_analyzer
from superfile.manifest.model import SuperfileEntry
from superfile.table.columns import FileColumns

__all__ = ["candidate_rows", "text_pruner"]

EntryCheck = Callable[[SuperfileEntry], bool]

_OPS = {"=", "!=", "<", "<=", ">", ">="}
_RANGE_OPS = {"<", "<=", ">", ">="}


def candidate_rows(
    predicate: Predicate, reader: FileColumns, fts_columns: set[str]
) -> tuple[pyroaring.BitMap, bool] | None:
    """Rows of ``reader`` that may satisfy ``predicate`` and whether they are exactly its matches
    (every leaf answered by a scalar index), or None when the indexes cannot bound it. ``fts_columns``: the
    full-text columns whose index this superfile holds."""
    return _bound(predicate.root, reader, fts_columns)


def _all(reader: FileColumns) -> pyroaring.BitMap:
    rows = pyroaring.BitMap()
    rows.add_range(0, reader.num_rows)
    return rows


def _column(node: Node) -> str | None:
    return node.name if isinstance(node, Column) else None


Bound = tuple[pyroaring.BitMap, bool] | None


def _range_leaf(node: Node) -> tuple[str, str, object] | None:
    """``(column, op, value)`` of a ``column < / <= / > / >= literal`` comparison."""
    if isinstance(node, Compare) and isinstance(node.plan, ScalarPlan) and node.plan.op in _RANGE_OPS:
        column = _column(node.plan.subject)
        if column is not None:
            return column, node.plan.op, node.plan.scalar.as_py()
    return None


def _one_range(left: Node, right: Node, reader: FileColumns) -> Bound:
    """A lower and an upper bound on one scalar-indexed column (``BETWEEN``, ``x >= a AND x < b``) as one
    key range: a non-selective side alone would materialise most of the file's rows."""
    a, b = _range_leaf(left), _range_leaf(right)
    if a is None or b is None or a[0] != b[0] or not reader.has_scalar_index(a[0]):
        return None
    if a[1] in ("<", "<="):
        a, b = b, a
    if a[1] not in (">", ">=") or b[1] not in ("<", "<="):
        return None
    return reader.scalar_index(a[0]).lookup_range((a[1], a[2]), (b[1], b[2])), True


def _bound(node: Node, reader: FileColumns, fts: set[str]) -> Bound:
    if isinstance(node, Between):
        node = And(node.lower, node.upper)
    if isinstance(node, And):
        merged = _one_range(node.left, node.right, reader)
        if merged is not None:
            return merged
        left, right = _bound(node.left, reader, fts), _bound(node.right, reader, fts)
        if left is None or right is None:
            one = left if right is None else right
            return None if one is None else (one[0], False)  # the unbounded side still has to be checked
        return left[0] & right[0], left[1] and right[1]
    if isinstance(node, Or):
        left, right = _bound(node.left, reader, fts), _bound(node.right, reader, fts)
        return None if left is None or right is None else (left[0] | right[0], left[1] and right[1])
    if isinstance(node, Compare):
        plan = node.plan
        if isinstance(plan, ConstPlan) and plan.outcome is not None:
            return (_all(reader) if plan.outcome else pyroaring.BitMap()), True
        if isinstance(plan, ScalarPlan) and plan.op in _OPS:
            return _lookup(reader, fts, _column(plan.subject), plan.op, plan.scalar.as_py())
        return None
    if isinstance(node, InList):
        in_plan = node.plan
        if isinstance(in_plan, ConstPlan) and in_plan.outcome is not None:
            return (_all(reader) if in_plan.outcome else pyroaring.BitMap()), True
        if isinstance(in_plan, InPlan):
            return _lookup(reader, fts, _column(in_plan.subject), "in", in_plan.value_set.to_pylist())
        return None
    if isinstance(node, IsNull):
        return _lookup(reader, fts, _column(node.operand), "is_null", None)
    return None


def _lookup(reader: FileColumns, fts: set[str], column: str | None, op: str, value: object) -> Bound:
    if column is None:
        return None
    if reader.has_scalar_index(column):
        return reader.scalar_index(column).lookup(op, value), True
    if column in fts and op in ("=", "in"):
        index = reader.fulltext(column)
        values = value if isinstance(value, list) else [value]
        rows = pyroaring.BitMap()
        for v in values:
            if isinstance(v, str):
                rows |= index.match_exact(v)
        return rows, False  # a hash match: the raw text still decides
    return None


def text_pruner(predicate: Predicate, fts_columns: Mapping[str, str]) -> EntryCheck | None:
    """Whether a superfile may hold a row matching ``predicate``, from its full-text columns' term bloom filters
    (manifest only, conservative): ``column = 'text'`` needs every term of the text in the superfile, ``IN``
    every term of one of its values; AND and OR combine, anything else may match. None when nothing prunes."""
    return _text_check(predicate.root, fts_columns)


def _text_check(node: Node, fts: Mapping[str, str]) -> EntryCheck | None:
    if isinstance(node, And | Or):
        left, right = _text_check(node.left, fts), _text_check(node.right, fts)
        if isinstance(node, Or):
            return None if left is None or right is None else (lambda e: left(e) or right(e))
        if left is None or right is None:
            return left or right
        return lambda e: left(e) and right(e)
    column, values = None, []
    if isinstance(node, Compare) and isinstance(node.plan, ScalarPlan) and node.plan.op == "=":
        column, values = _column(node.plan.subject), [node.plan.scalar.as_py()]
    elif isinstance(node, InList) and isinstance(node.plan, InPlan):
        column, values = _column(node.plan.subject), node.plan.value_set.to_pylist()
    if column is None or column not in fts or not values or not all(isinstance(v, str) for v in values):
        return None
    name: str = column
    analyzer = thread_analyzer(fts[name])
    terms = [list(dict.fromkeys(analyzer.analyze(v))) for v in values]
    if not all(terms):  # a value without terms (empty, punctuation) says nothing about a superfile's terms
        return None

    def check(entry: SuperfileEntry) -> bool:
        summary = entry.text.get(name)
        return summary is None or any(summary.may_hold(t, every=True) for t in terms)

    return check
