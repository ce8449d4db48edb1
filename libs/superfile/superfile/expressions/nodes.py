"""The typed predicate tree shared by the parser, the evaluator and the pruner.

The parser resolves every type question once and records the outcome in
*plans* (how a comparison is to be computed), so the evaluator and the pruner
never re-derive coercions and cannot disagree about them.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa

__all__ = [
    "NUMERIC",
    "TEMPORAL",
    "And",
    "Arith",
    "Between",
    "BinaryPlan",
    "Column",
    "Compare",
    "ConstPlan",
    "Domain",
    "Func",
    "InList",
    "InPlan",
    "IsNull",
    "Kind",
    "Like",
    "LikePlan",
    "Literal",
    "LiteralValue",
    "Negate",
    "Node",
    "Not",
    "Or",
    "ScalarPlan",
    "iter_columns",
    "kind_of_type",
    "kind_of_value",
    "literal_sql",
    "quote_identifier",
    "to_sql",
]

LiteralValue = None | bool | int | Decimal | float | str | dt.date | dt.datetime


class Kind(enum.Enum):
    """Type families: values of one family compare with each other, never across (bar coercions)."""

    NULL = "null"
    BOOL = "boolean"
    INT = "integer"
    FLOAT = "float"
    DECIMAL = "decimal"
    STRING = "string"
    BINARY = "binary"
    DATE = "date"
    TIMESTAMP = "timestamp"


NUMERIC = frozenset({Kind.INT, Kind.FLOAT, Kind.DECIMAL})
TEMPORAL = frozenset({Kind.DATE, Kind.TIMESTAMP})


def kind_of_type(t: pa.DataType) -> Kind | None:
    """Family of a (working) Arrow type; None when predicates cannot use it."""
    if pa.types.is_boolean(t):
        return Kind.BOOL
    if pa.types.is_integer(t):
        return Kind.INT
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return Kind.FLOAT
    if pa.types.is_decimal(t):
        return Kind.DECIMAL
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Kind.STRING
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return Kind.BINARY
    if pa.types.is_date(t):
        return Kind.DATE
    if pa.types.is_timestamp(t):
        return Kind.TIMESTAMP
    return None


def kind_of_value(v: LiteralValue) -> Kind:
    """Family of a folded literal (bool before int: bool is an int subclass)."""
    if v is None:
        return Kind.NULL
    if isinstance(v, bool):
        return Kind.BOOL
    if isinstance(v, int):
        return Kind.INT
    if isinstance(v, Decimal):
        return Kind.DECIMAL
    if isinstance(v, float):
        return Kind.FLOAT
    if isinstance(v, str):
        return Kind.STRING
    if isinstance(v, dt.datetime):
        return Kind.TIMESTAMP
    return Kind.DATE


# --------------------------------------------------------------------------- domains and plans


@dataclass(frozen=True, eq=False)
class Domain:
    """The value space a comparison is computed in.

    Integral domains (integers, decimals, dates, timestamps) compare exact
    tick counts, so literals that fall between representable values or
    outside the type's range are rewritten instead of rounded or overflowed.
    ``key`` maps a literal or a statistics value into comparable form (None:
    not convertible, treat as unknown).
    """

    kind: Kind
    dtype: pa.DataType
    key: Callable[[object], object | None]
    lo: int | None = None
    hi: int | None = None
    scalar_of: Callable[[int], pa.Scalar] | None = None


@dataclass(frozen=True, eq=False)
class ConstPlan:
    """The comparison's outcome is known statically; ``subject`` rows that are NULL still yield NULL."""

    outcome: bool | None
    subject: Node | None


@dataclass(frozen=True, eq=False)
class ScalarPlan:
    """``subject op scalar`` with the literal already converted into the subject's domain."""

    subject: Node
    op: str
    scalar: pa.Scalar
    key: object
    domain: Domain


@dataclass(frozen=True, eq=False)
class BinaryPlan:
    """Both sides are computed; each is cast to the common type when it differs."""

    left_cast: pa.DataType | None
    right_cast: pa.DataType | None


@dataclass(frozen=True, eq=False)
class InPlan:
    """``subject IN value_set``; values that can never be equal were dropped at parse time."""

    subject: Node
    value_set: pa.Array
    keys: tuple[object, ...]  # sorted domain keys of value_set, for pruning
    has_null: bool
    domain: Domain


@dataclass(frozen=True, eq=False)
class LikePlan:
    """Pattern rewritten for Arrow's ``match_like`` (backslash escapes) plus its literal prefix."""

    arrow_pattern: str
    prefix: str
    prefix_only: bool  # pattern is exactly prefix followed by '%'s


# --------------------------------------------------------------------------- nodes


class Node:
    """Base of every tree node; ``kind``/``dtype`` describe the value it produces."""

    __slots__ = ()

    @property
    def kind(self) -> Kind:
        return Kind.BOOL

    @property
    def dtype(self) -> pa.DataType | None:
        return pa.bool_()


@dataclass(frozen=True, eq=False)
class Column(Node):
    """A schema column; ``source`` is its stored type, ``working`` the type computed on."""

    name: str
    source: pa.DataType
    working: pa.DataType

    @property
    def kind(self) -> Kind:
        k = kind_of_type(self.working)
        assert k is not None  # the parser only builds columns of supported types
        return k

    @property
    def dtype(self) -> pa.DataType:
        return self.working


@dataclass(frozen=True, eq=False)
class Literal(Node):
    """A constant, folded at parse time; typed by its Python value."""

    value: LiteralValue

    @property
    def kind(self) -> Kind:
        return kind_of_value(self.value)

    @property
    def dtype(self) -> None:
        return None


class _Numeric(Node):
    """An arithmetic node: its kind and type follow the numeric ``result`` type fixed at parse time."""

    result: pa.DataType

    @property
    def kind(self) -> Kind:
        return Kind.INT if pa.types.is_integer(self.result) else Kind.FLOAT

    @property
    def dtype(self) -> pa.DataType:
        return self.result


@dataclass(frozen=True, eq=False)
class Negate(_Numeric):
    operand: Node
    result: pa.DataType


@dataclass(frozen=True, eq=False)
class Arith(_Numeric):
    op: str
    left: Node
    right: Node
    result: pa.DataType


@dataclass(frozen=True, eq=False)
class Func(Node):
    name: str
    arg: Node
    result: pa.DataType

    @property
    def kind(self) -> Kind:
        k = kind_of_type(self.result)
        assert k is not None
        return k

    @property
    def dtype(self) -> pa.DataType:
        return self.result


@dataclass(frozen=True, eq=False)
class Compare(Node):
    op: str
    left: Node
    right: Node
    plan: ConstPlan | ScalarPlan | BinaryPlan


@dataclass(frozen=True, eq=False)
class Between(Node):
    """Kept for printing; computed as ``lower AND upper`` (SQL defines it that way)."""

    operand: Node
    low: Node
    high: Node
    lower: Compare
    upper: Compare


@dataclass(frozen=True, eq=False)
class InList(Node):
    operand: Node
    values: tuple[Literal, ...]
    plan: ConstPlan | InPlan


@dataclass(frozen=True, eq=False)
class IsNull(Node):
    operand: Node


@dataclass(frozen=True, eq=False)
class Like(Node):
    operand: Node
    pattern: Literal
    escape: str | None
    case_insensitive: bool
    plan: ConstPlan | LikePlan


@dataclass(frozen=True, eq=False)
class Not(Node):
    operand: Node


@dataclass(frozen=True, eq=False)
class And(Node):
    left: Node
    right: Node


@dataclass(frozen=True, eq=False)
class Or(Node):
    left: Node
    right: Node


def iter_columns(node: Node) -> Iterator[Column]:
    """Every column reference below ``node`` (the values a predicate reads)."""
    if isinstance(node, Column):
        yield node
    elif isinstance(node, Negate | IsNull | Not):
        yield from iter_columns(node.operand)
    elif isinstance(node, Arith | And | Or | Compare):
        yield from iter_columns(node.left)
        yield from iter_columns(node.right)
    elif isinstance(node, Func):
        yield from iter_columns(node.arg)
    elif isinstance(node, Between):
        for part in (node.operand, node.low, node.high):
            yield from iter_columns(part)
    elif isinstance(node, InList | Like):
        yield from iter_columns(node.operand)


# --------------------------------------------------------------------------- printing

# Precedence, loosest first; a child binding looser than its slot is parenthesised.
_OR, _AND, _NOT, _PREDICATE, _ADD, _MUL, _UNARY, _PRIMARY = range(1, 9)
_ARITH_PRECEDENCE = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "%": _MUL}


def _precedence(node: Node) -> int:
    if isinstance(node, Or):
        return _OR
    if isinstance(node, And):
        return _AND
    if isinstance(node, Not):
        return _PREDICATE if isinstance(node.operand, InList | Between | Like | IsNull) else _NOT
    if isinstance(node, Compare | Between | InList | IsNull | Like):
        return _PREDICATE
    if isinstance(node, Arith):
        return _ARITH_PRECEDENCE[node.op]
    if isinstance(node, Negate):
        return _UNARY
    if isinstance(node, Literal) and isinstance(node.value, int | Decimal) and node.value < 0:
        return _UNARY
    return _PRIMARY


def _wrap(node: Node, slot: int) -> str:
    text = to_sql(node)
    return f"({text})" if _precedence(node) < slot else text


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal_sql(v: LiteralValue) -> str:
    """SQL text that parses back to exactly ``v`` (DuckDB accepts it too)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int | Decimal):
        return str(v)
    if isinstance(v, float):
        return f"CAST('{v!r}' AS DOUBLE)"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            return f"TIMESTAMPTZ '{v.isoformat(sep=' ')}'"
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    return f"DATE '{v.isoformat()}'"


def to_sql(node: Node) -> str:
    """Normalised SQL: quoted identifiers, folded literals, minimal parentheses."""
    if isinstance(node, Column):
        return quote_identifier(node.name)
    if isinstance(node, Literal):
        return literal_sql(node.value)
    if isinstance(node, Or):
        return f"{_wrap(node.left, _OR)} OR {_wrap(node.right, _OR)}"
    if isinstance(node, And):
        return f"{_wrap(node.left, _AND)} AND {_wrap(node.right, _AND)}"
    if isinstance(node, Not):
        inner = node.operand
        if isinstance(inner, InList | Between | Like | IsNull):
            return _predicate_sql(inner, negated=True)
        return f"NOT {_wrap(inner, _PRIMARY)}"
    if isinstance(node, Compare):
        return f"{_wrap(node.left, _ADD)} {node.op} {_wrap(node.right, _ADD)}"
    if isinstance(node, InList | Between | Like | IsNull):
        return _predicate_sql(node, negated=False)
    if isinstance(node, Arith):
        slot = _ARITH_PRECEDENCE[node.op]
        return f"{_wrap(node.left, slot)} {node.op} {_wrap(node.right, slot + 1)}"
    if isinstance(node, Negate):
        return f"-{_wrap(node.operand, _PRIMARY)}"
    if isinstance(node, Func):
        return f"{node.name}({to_sql(node.arg)})"
    raise TypeError(f"unknown node {node!r}")


def _predicate_sql(node: InList | Between | Like | IsNull, negated: bool) -> str:
    subject = _wrap(node.operand, _ADD)
    not_ = "NOT " if negated else ""
    if isinstance(node, IsNull):
        return f"{subject} IS {not_}NULL"
    if isinstance(node, InList):
        return f"{subject} {not_}IN ({', '.join(to_sql(v) for v in node.values)})"
    if isinstance(node, Between):
        return f"{subject} {not_}BETWEEN {_wrap(node.low, _ADD)} AND {_wrap(node.high, _ADD)}"
    op = "ILIKE" if node.case_insensitive else "LIKE"
    escape = "" if node.escape is None else f" ESCAPE {literal_sql(node.escape)}"
    return f"{subject} {not_}{op} {to_sql(node.pattern)}{escape}"
