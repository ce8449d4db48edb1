"""Typed tree -> Arrow compute calls.

One compiler serves both uses: with :class:`ExpressionBackend` it builds a
lazy ``pyarrow.compute.Expression`` (for datasets and ``Table.filter``); with
:class:`TableBackend` the very same kernel calls run eagerly on a table or
batch. Sharing the code keeps ``to_arrow`` and ``evaluate`` from drifting.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import UnknownColumnError
from .nodes import (
    And,
    Arith,
    Between,
    BinaryPlan,
    Column,
    Compare,
    ConstPlan,
    Func,
    InList,
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    ScalarPlan,
)

__all__ = ["ExpressionBackend", "TableBackend", "compile_node", "evaluate_mask"]

# An Arrow value under construction: Expression (lazy) or Array/ChunkedArray/Scalar (eager).
ArrowValue = Any

_NULL_BOOL = pa.scalar(None, pa.bool_())
_COMPARE: dict[str, Callable[..., ArrowValue]] = {
    "=": pc.equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_ARITH: dict[str, Callable[..., ArrowValue]] = {
    "+": pc.add_checked,
    "-": pc.subtract_checked,
    "*": pc.multiply_checked,
    "/": pc.divide,  # float division: x / 0 is +-inf or NaN, as in DuckDB
}


class ExpressionBackend:
    """Leaves as ``pc.field`` / ``pc.scalar`` so every kernel call yields an Expression."""

    def column(self, node: Column) -> ArrowValue:
        ref = pc.field(node.name)
        return ref if node.source == node.working else ref.cast(node.working)

    def scalar(self, value: pa.Scalar) -> ArrowValue:
        # A typed Scalar keeps its exact type (uint64, timestamp[ns], ...); the stubs only list Python values.
        return pc.scalar(cast(Any, value))


class TableBackend:
    """Leaves as the batch's columns (cast to the working type when stored differently)."""

    def __init__(self, table: pa.Table | pa.RecordBatch) -> None:
        self._table = table

    def column(self, node: Column) -> ArrowValue:
        if node.name not in self._table.schema.names:
            raise UnknownColumnError(f'column "{node.name}" used by the predicate is missing from the data')
        values = self._table.column(node.name)
        return values if values.type == node.working else values.cast(node.working)

    def scalar(self, value: pa.Scalar) -> ArrowValue:
        return value


Backend = ExpressionBackend | TableBackend


def _cast(value: ArrowValue, target: pa.DataType | None) -> ArrowValue:
    return value if target is None else value.cast(target)


def _const(outcome: bool | None, subject: Node | None, b: Backend) -> ArrowValue:
    """A known outcome, except that rows where ``subject`` is NULL stay NULL (SQL comparison rules)."""
    if outcome is None:
        return b.scalar(_NULL_BOOL)
    value = b.scalar(pa.scalar(outcome))
    if subject is None:
        return value
    return pc.if_else(pc.is_null(compile_node(subject, b)), b.scalar(_NULL_BOOL), value)


def _operand(node: Node, target: pa.DataType, b: Backend) -> ArrowValue:
    if isinstance(node, Literal):
        v = node.value
        assert isinstance(v, int | float | Decimal)
        return b.scalar(pa.scalar(v if pa.types.is_integer(target) else float(v), target))
    return _cast(compile_node(node, b), None if node.dtype == target else target)


def _arith(node: Arith, b: Backend) -> ArrowValue:
    left, right = _operand(node.left, node.result, b), _operand(node.right, node.result, b)
    if node.op != "%":
        return _ARITH[node.op](left, right)
    # Arrow has no remainder kernel: a - trunc(a / b) * b, with x % 0 -> NULL.
    zero, null = b.scalar(pa.scalar(0, node.result)), b.scalar(pa.scalar(None, node.result))
    divisor = pc.if_else(pc.equal(right, zero), null, right)
    return pc.subtract_checked(left, pc.multiply_checked(pc.divide_checked(left, divisor), divisor))


def _function(node: Func, b: Backend) -> ArrowValue:
    arg = compile_node(node.arg, b)
    if node.name == "lower":
        return pc.utf8_lower(arg)
    if node.name == "upper":
        return pc.utf8_upper(arg)
    if node.name == "length":
        return _cast(pc.utf8_length(arg), node.result)
    return pc.abs_checked(arg)


def _in_list(node: InList, b: Backend) -> ArrowValue:
    plan = node.plan
    if isinstance(plan, ConstPlan):
        return _const(plan.outcome, plan.subject, b)
    subject = _cast(
        compile_node(plan.subject, b), None if plan.subject.dtype == plan.domain.dtype else plan.domain.dtype
    )
    hit = pc.is_in(subject, value_set=plan.value_set)
    result = pc.if_else(pc.is_null(subject), b.scalar(_NULL_BOOL), hit)
    # x IN (..., NULL) is TRUE on a match and NULL otherwise.
    return pc.or_kleene(result, b.scalar(_NULL_BOOL)) if plan.has_null else result


def _compare(node: Compare, b: Backend) -> ArrowValue:
    plan = node.plan
    if isinstance(plan, ConstPlan):
        return _const(plan.outcome, plan.subject, b)
    if isinstance(plan, ScalarPlan):
        subject = compile_node(plan.subject, b)
        if plan.subject.dtype != plan.domain.dtype:
            subject = subject.cast(plan.domain.dtype)
        return _COMPARE[plan.op](subject, b.scalar(plan.scalar))
    assert isinstance(plan, BinaryPlan)
    left = _cast(compile_node(node.left, b), plan.left_cast)
    right = _cast(compile_node(node.right, b), plan.right_cast)
    return _COMPARE[node.op](left, right)


def compile_node(node: Node, b: Backend) -> ArrowValue:
    """Arrow value of ``node``; boolean results follow SQL three-valued logic (Kleene)."""
    if isinstance(node, Column):
        return b.column(node)
    if isinstance(node, Literal):  # only boolean/NULL literals stand alone; others are folded into plans
        return b.scalar(pa.scalar(node.value, pa.bool_()))
    if isinstance(node, Not):
        return pc.invert(compile_node(node.operand, b))
    if isinstance(node, And):
        return pc.and_kleene(compile_node(node.left, b), compile_node(node.right, b))
    if isinstance(node, Or):
        return pc.or_kleene(compile_node(node.left, b), compile_node(node.right, b))
    if isinstance(node, Compare):
        return _compare(node, b)
    if isinstance(node, Between):
        return pc.and_kleene(compile_node(node.lower, b), compile_node(node.upper, b))
    if isinstance(node, InList):
        return _in_list(node, b)
    if isinstance(node, IsNull):
        if isinstance(node.operand, Literal):
            return b.scalar(pa.scalar(node.operand.value is None))
        return pc.is_null(compile_node(node.operand, b))
    if isinstance(node, Like):
        if isinstance(node.plan, ConstPlan):
            return _const(node.plan.outcome, node.plan.subject, b)
        return pc.match_like(
            compile_node(node.operand, b), pattern=node.plan.arrow_pattern, ignore_case=node.case_insensitive
        )
    if isinstance(node, Arith):
        return _arith(node, b)
    if isinstance(node, Negate):
        return pc.negate_checked(_operand(node.operand, node.result, b))
    if isinstance(node, Func):
        return _function(node, b)
    raise TypeError(f"unknown node {node!r}")


def evaluate_mask(root: Node, table: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
    """Selection mask of ``root`` over ``table``: TRUE rows only (NULL counts as not selected)."""
    result = compile_node(root, TableBackend(table))
    if isinstance(result, pa.Scalar):
        return pa.repeat(pa.scalar(result.as_py() is True), table.num_rows)
    mask = pc.fill_null(result, False)
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks()
    return cast(pa.BooleanArray, mask)
