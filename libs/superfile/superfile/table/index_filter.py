"""Row-level index use for WHERE: bound a predicate to candidate rows through a superfile's indexes.

Comparisons, IN, IS [NOT] NULL and BETWEEN on a column with a scalar index,
and equality / IN on a full-text column (through its exact-value hash), map to
Roaring bitmaps; AND and OR combine them. Anything the indexes cannot bound
(negation, LIKE, arithmetic, functions, unindexed columns) returns None and
the caller scans. The bitmaps are a superset of the matches: the caller
re-checks the exact predicate on the candidate rows only.
"""

from __future__ import annotations

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
from superfile.format import SuperfileReader
from superfile.format.layout import idx_section

__all__ = ["candidate_rows"]

_OPS = {"=", "!=", "<", "<=", ">", ">="}


def candidate_rows(
    predicate: Predicate, reader: SuperfileReader, fts_columns: set[str]
) -> tuple[pyroaring.BitMap, bool] | None:
    """Rows of ``reader`` that may satisfy ``predicate`` and whether they are exactly its matches
    (every leaf answered by a scalar index), or None when the indexes cannot bound it."""
    return _bound(predicate.root, reader, fts_columns)


def _all(reader: SuperfileReader) -> pyroaring.BitMap:
    rows = pyroaring.BitMap()
    rows.add_range(0, reader.num_rows)
    return rows


def _column(node: Node) -> str | None:
    return node.name if isinstance(node, Column) else None


Bound = tuple[pyroaring.BitMap, bool] | None


def _bound(node: Node, reader: SuperfileReader, fts: set[str]) -> Bound:
    if isinstance(node, And):
        left, right = _bound(node.left, reader, fts), _bound(node.right, reader, fts)
        if left is None or right is None:
            one = left if right is None else right
            return None if one is None else (one[0], False)  # the unbounded side still has to be checked
        return left[0] & right[0], left[1] and right[1]
    if isinstance(node, Or):
        left, right = _bound(node.left, reader, fts), _bound(node.right, reader, fts)
        return None if left is None or right is None else (left[0] | right[0], left[1] and right[1])
    if isinstance(node, Between):
        return _bound(And(node.lower, node.upper), reader, fts)
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


def _lookup(reader: SuperfileReader, fts: set[str], column: str | None, op: str, value: object) -> Bound:
    if column is None:
        return None
    if idx_section(column) in reader.sections:
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
