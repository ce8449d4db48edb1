"""File pruning from per-column statistics.

For a boolean node the pruner answers two questions: *can it be TRUE* for
some row, and *can it be FALSE* for some row (NULL being the third value).
``NOT`` swaps the answers, ``AND``/``OR`` combine them, and leaves compare a
literal with the file's [min, max] interval and null counts. Every "don't
know" answers yes, so a file is only skipped when no row can match.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .nodes import (
    And,
    Between,
    Column,
    Compare,
    ConstPlan,
    InList,
    InPlan,
    IsNull,
    Kind,
    Like,
    LikePlan,
    Literal,
    Node,
    Not,
    Or,
    ScalarPlan,
    iter_columns,
)

__all__ = ["ColumnStats", "might_match", "stats_from_table"]


@dataclass(frozen=True)
class ColumnStats:
    """Summary of one column in one file.

    ``min``/``max`` are Python values comparable with the column's values
    (for floats they ignore NaN, like Parquet statistics); None = unknown.
    A column that is all NULL has ``min = max = None`` and
    ``null_count == row_count``.
    """

    min: object | None
    max: object | None
    null_count: int | None
    row_count: int


_NEGATED = {"=": "<>", "<>": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _has_values(st: ColumnStats) -> bool:
    """Some row is non-NULL (or we cannot tell)."""
    return st.null_count is None or st.null_count < st.row_count


def _interval_allows(op: str, lo: Any, hi: Any, c: Any) -> bool:
    """Could some value in [lo, hi] (None = unbounded) satisfy ``value op c``?"""
    if op == "=":
        return (lo is None or lo <= c) and (hi is None or c <= hi)
    if op == "<>":
        return lo is None or hi is None or not (lo == hi == c)
    if op == "<":
        return lo is None or lo < c
    if op == "<=":
        return lo is None or lo <= c
    if op == ">":
        return hi is None or hi > c
    return hi is None or hi >= c


class _Pruner:
    def __init__(self, stats: Mapping[str, ColumnStats]) -> None:
        self._stats = stats

    def _column_stats(self, node: Node) -> ColumnStats | None:
        return self._stats.get(node.name) if isinstance(node, Column) else None

    def _maybe_non_null(self, node: Node) -> bool:
        """False when ``node`` is NULL on every row: a literal NULL, or it reads an all-NULL column."""
        if isinstance(node, Literal):
            return node.value is not None
        for col in iter_columns(node):
            st = self._stats.get(col.name)
            if st is not None and not _has_values(st):
                return False
        return True

    def outcomes(self, node: Node) -> tuple[bool, bool]:
        """(can be TRUE for some row, can be FALSE for some row)."""
        if isinstance(node, Literal):
            return node.value is True, node.value is False
        if isinstance(node, Not):
            can_true, can_false = self.outcomes(node.operand)
            return can_false, can_true
        if isinstance(node, And):
            (lt, lf), (rt, rf) = self.outcomes(node.left), self.outcomes(node.right)
            return lt and rt, lf or rf
        if isinstance(node, Or):
            (lt, lf), (rt, rf) = self.outcomes(node.left), self.outcomes(node.right)
            return lt or rt, lf and rf
        if isinstance(node, Between):
            return self.outcomes(And(node.lower, node.upper))
        if isinstance(node, Column):
            return self._bool_column(node)
        if isinstance(node, IsNull):
            return self._is_null(node)
        plan = node.plan if isinstance(node, Compare | InList | Like) else None
        if isinstance(plan, ConstPlan):
            live = plan.subject is None or self._maybe_non_null(plan.subject)
            return live and plan.outcome is True, live and plan.outcome is False
        if isinstance(plan, ScalarPlan):
            return self._scalar(plan)
        if isinstance(plan, InPlan):
            return self._in(plan)
        if isinstance(node, Like) and isinstance(plan, LikePlan):
            return self._like(node, plan)
        live = self._maybe_non_null(node)  # column-vs-column and computed comparisons
        return live, live

    def _bool_column(self, node: Column) -> tuple[bool, bool]:
        st = self._stats.get(node.name)
        if st is None:
            return True, True
        if not _has_values(st):
            return False, False
        lo = st.min if isinstance(st.min, bool) else None
        hi = st.max if isinstance(st.max, bool) else None
        return hi is not False, lo is not True

    def _is_null(self, node: IsNull) -> tuple[bool, bool]:
        if isinstance(node.operand, Literal):
            return node.operand.value is None, node.operand.value is not None
        st = self._column_stats(node.operand)
        if st is None:
            return True, self._maybe_non_null(node.operand)
        return st.null_count is None or st.null_count > 0, _has_values(st)

    def _bounds(self, st: ColumnStats, plan: ScalarPlan | InPlan) -> tuple[Any, Any]:
        return plan.domain.key(st.min), plan.domain.key(st.max)

    def _scalar(self, plan: ScalarPlan) -> tuple[bool, bool]:
        st = self._column_stats(plan.subject)
        if st is None or plan.key is None:
            live = self._maybe_non_null(plan.subject)
            return live, live
        if not _has_values(st):
            return False, False
        lo, hi = self._bounds(st, plan)
        if plan.domain.kind is Kind.FLOAT:
            # Statistics ignore NaN, and NaN rows satisfy "<>" and every negated comparison.
            return plan.op == "<>" or _interval_allows(plan.op, lo, hi, plan.key), True
        return _interval_allows(plan.op, lo, hi, plan.key), _interval_allows(_NEGATED[plan.op], lo, hi, plan.key)

    def _in(self, plan: InPlan) -> tuple[bool, bool]:
        st = self._column_stats(plan.subject)
        if st is None:
            live = self._maybe_non_null(plan.subject)
            return live and bool(plan.keys), live and not plan.has_null
        if not _has_values(st):
            return False, False
        lo, hi = self._bounds(st, plan)
        keys: list[Any] = list(plan.keys)
        i = 0 if lo is None else bisect.bisect_left(keys, lo)
        can_true = i < len(keys) and (hi is None or keys[i] <= hi)
        if plan.has_null:
            return can_true, False  # never FALSE: a non-match is NULL
        single_member = plan.domain.kind is not Kind.FLOAT and lo is not None and lo == hi and lo in keys
        return can_true, not single_member

    def _like(self, node: Like, plan: LikePlan) -> tuple[bool, bool]:
        st = self._column_stats(node.operand)
        if st is None or node.case_insensitive or not plan.prefix:
            live = self._maybe_non_null(node.operand)
            return live, live
        if not _has_values(st):
            return False, False
        lo = st.min if isinstance(st.min, str) else None
        hi = st.max if isinstance(st.max, str) else None
        p = plan.prefix
        # Strings starting with p form one contiguous run in sort order, beginning at p itself.
        can_true = (hi is None or hi >= p) and (lo is None or lo <= p or lo.startswith(p))
        all_prefixed = lo is not None and hi is not None and lo.startswith(p) and hi.startswith(p)
        return can_true, not (plan.prefix_only and all_prefixed)


def might_match(root: Node, stats: Mapping[str, ColumnStats]) -> bool:
    """False only if no row of a file with these statistics can satisfy ``root``."""
    if any(st.row_count == 0 for st in stats.values()):
        return False
    try:
        return _Pruner(stats).outcomes(root)[0]
    except TypeError:  # statistics of an unexpected Python type: cannot reason, so keep the file
        return True


# --------------------------------------------------------------------------- statistics


def _decoded(values: pa.ChunkedArray) -> pa.ChunkedArray:
    t = values.type
    if pa.types.is_dictionary(t):
        return _decoded(values.cast(t.value_type))
    if pa.types.is_string_view(t):
        return values.cast(pa.large_string())
    if pa.types.is_binary_view(t):
        return values.cast(pa.large_binary())
    return values


_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1000, "us": 1}


def _timestamp_bounds(values: pa.ChunkedArray) -> tuple[object | None, object | None]:
    """Timestamp min/max as microsecond datetimes, min rounded down and max up (stays conservative)."""
    t = values.type
    mm = pc.min_max(values.cast(pa.int64()))
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None or hi is None:
        return None, None
    if t.unit == "ns":
        lo_us, hi_us = lo // 1000, -(-hi // 1000)
    else:
        lo_us, hi_us = lo * _MICROS_PER_UNIT[t.unit], hi * _MICROS_PER_UNIT[t.unit]
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC if t.tz is not None else None)
    try:
        return epoch + dt.timedelta(microseconds=lo_us), epoch + dt.timedelta(microseconds=hi_us)
    except OverflowError:
        return None, None


def _bounds_of(values: pa.ChunkedArray) -> tuple[object | None, object | None]:
    t = values.type
    if pa.types.is_timestamp(t):
        return _timestamp_bounds(values)
    orderable = (
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date(t)
    )
    if not orderable or pa.types.is_float16(t):
        return None, None
    mm = pc.min_max(values)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if isinstance(lo, float) and math.isnan(lo):  # only when every value is NaN
        return None, None
    return lo, hi


def stats_from_table(table: pa.Table | pa.RecordBatch) -> dict[str, ColumnStats]:
    """Per-column statistics of ``table`` in the form :meth:`Predicate.might_match` expects.

    Unorderable columns (lists, structs, ...) get unknown min/max but a
    null count; timestamps come back as microsecond ``datetime`` bounds.
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    stats: dict[str, ColumnStats] = {}
    for name, values in zip(table.column_names, table.columns, strict=True):
        lo, hi = _bounds_of(_decoded(values))
        stats[name] = ColumnStats(lo, hi, values.null_count, table.num_rows)
    return stats
