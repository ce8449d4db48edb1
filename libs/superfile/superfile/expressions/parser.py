"""SQL text -> typed predicate tree, with every type question settled here.

sqlglot does the tokenising and parsing; this module accepts only a small,
whitelisted subset of its tree (anything else is an
:class:`InvalidPredicateError` naming the construct), resolves columns
against the table schema, folds constants, and decides how each comparison
is computed (see the plans in :mod:`.nodes`).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import operator
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from ..errors import InvalidPredicateError, UnknownColumnError
from .nodes import (
    NUMERIC,
    TEMPORAL,
    And,
    Arith,
    Between,
    BinaryPlan,
    Column,
    Compare,
    ConstPlan,
    Domain,
    Func,
    InList,
    InPlan,
    IsNull,
    Kind,
    Like,
    LikePlan,
    Literal,
    LiteralValue,
    Negate,
    Node,
    Not,
    Or,
    ScalarPlan,
    kind_of_type,
    kind_of_value,
    literal_sql,
    to_sql,
)

__all__ = ["parse", "parse_conjuncts"]

_DIALECT = Dialect.get_or_raise("duckdb")
_CONTEXT = Context(prec=400)  # wide enough that folding and decimal casts never round
_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1)

_COMPARISONS: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PY_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITHMETIC: dict[type[exp.Expression], str] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Lower: "lower",
    exp.Upper: "upper",
    exp.Length: "length",
    exp.Abs: "abs",
}
_ALLOWED_FUNCTIONS = ", ".join(sorted(_FUNCTIONS.values()))

# CAST targets by sqlglot type name (names are stable across sqlglot versions).
_INT_CASTS: dict[str, tuple[int, int]] = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "INT128": (-(2**127), 2**127 - 1),
    "UTINYINT": (0, 2**8 - 1),
    "USMALLINT": (0, 2**16 - 1),
    "UINT": (0, 2**32 - 1),
    "UBIGINT": (0, 2**64 - 1),
    "UINT128": (0, 2**128 - 1),
}
_STRING_CASTS = frozenset({"VARCHAR", "TEXT", "CHAR", "NVARCHAR"})
_TIMESTAMP_CASTS = frozenset({"TIMESTAMP", "TIMESTAMPNTZ", "DATETIME"})
_TIMESTAMPTZ_CASTS = frozenset({"TIMESTAMPTZ", "TIMESTAMPLTZ"})


def parse(where: str, schema: pa.Schema) -> Node:
    """Parse and type-check ``where``; the result is a boolean-valued tree."""
    if not isinstance(where, str):
        raise InvalidPredicateError(f"a predicate must be a string, got {type(where).__name__}")
    if not where.strip():
        raise InvalidPredicateError("the predicate is empty")
    try:
        tokens = _DIALECT.tokenize(where)
        if any(t.token_type == TokenType.SEMICOLON for t in tokens):
            raise InvalidPredicateError("';' is not allowed: a predicate is one expression, not statements")
        trees = sqlglot.parse(where, dialect=_DIALECT)
        if len(trees) != 1 or trees[0] is None:
            raise InvalidPredicateError(f"cannot parse predicate {where!r}: expected exactly one expression")
        tree = trees[0]
        if not isinstance(tree, exp.Expression):
            raise InvalidPredicateError(f"cannot parse predicate {where!r}: not an expression")
    except (ParseError, TokenError) as e:
        raise InvalidPredicateError(f"cannot parse predicate {where!r}: {_parse_error_text(e)}") from None
    except RecursionError:
        raise InvalidPredicateError("the predicate is nested too deeply") from None
    return parse_conjuncts([tree], schema)


def parse_conjuncts(trees: list[exp.Expression], schema: pa.Schema) -> Node:
    """Type-check the AND of sqlglot trees already parsed (a SQL query's ``WHERE`` conjuncts), without
    rendering them to text and parsing them again."""
    if not trees:
        raise InvalidPredicateError("the predicate is empty")
    try:
        converter = _Converter(schema)
        if len(trees) == 1:
            root = converter.convert(trees[0])
        else:
            nodes = [converter.conjunct(tree) for tree in trees]
            root = functools.reduce(And, nodes)
    except RecursionError:
        raise InvalidPredicateError("the predicate is nested too deeply") from None
    if root.kind not in (Kind.BOOL, Kind.NULL):
        raise InvalidPredicateError(f"a predicate must be a boolean expression, got {_typed(root)}")
    return root


def _parse_error_text(e: ParseError | TokenError) -> str:
    """sqlglot's first error without its terminal colour codes."""
    errors = getattr(e, "errors", None)
    if errors:
        first = errors[0]
        return f"{first.get('description')} (near {first.get('highlight')!r}, column {first.get('col')})"
    return str(e).splitlines()[0]


# --------------------------------------------------------------------------- descriptions for messages


def _describe(node: Node) -> str:
    if isinstance(node, Column):
        return f'column "{node.name}"'
    return to_sql(node)


def _type_name(node: Node) -> str:
    if isinstance(node, Literal):
        return "NULL" if node.value is None else f"{node.kind.value} literal"
    return str(node.dtype)


def _typed(node: Node) -> str:
    return f"{_describe(node)} ({_type_name(node)})"


def _clash(what: str, *nodes: Node) -> InvalidPredicateError:
    return InvalidPredicateError(f"{what}, got {' and '.join(_typed(n) for n in nodes)}")


def _compare_clash(left: Node, right: Node) -> InvalidPredicateError:
    return InvalidPredicateError(f"cannot compare {_typed(left)} with {_typed(right)}")


# --------------------------------------------------------------------------- domains


def _temporal_micros(v: object) -> Fraction | None:
    """Exact microseconds since the Unix epoch (naive values are UTC); None for non-temporal values."""
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(_UTC).replace(tzinfo=None)
        delta = v - _EPOCH
        whole = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return whole + Fraction(getattr(v, "nanosecond", 0), 1000)  # pandas Timestamps carry nanoseconds
    if isinstance(v, dt.date):
        return Fraction((v - _EPOCH.date()).days * 86_400_000_000)
    return None


def _numeric_key(scale: int) -> Callable[[object], Fraction | None]:
    def key(v: object) -> Fraction | None:
        if isinstance(v, bool) or not isinstance(v, int | float | Decimal):
            return None
        try:
            return Fraction(v) * scale
        except (ValueError, OverflowError):  # NaN / infinity
            return None

    return key


def _temporal_key(micros_per_tick: Fraction) -> Callable[[object], Fraction | None]:
    def key(v: object) -> Fraction | None:
        micros = _temporal_micros(v)
        return None if micros is None else micros / micros_per_tick

    return key


def _float_key(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float | Decimal):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return None if math.isnan(f) else f


def _typed_key(cls: type) -> Callable[[object], object | None]:
    return lambda v: v if isinstance(v, cls) else None


def _storage_scalar(storage: pa.DataType, t: pa.DataType) -> Callable[[int], pa.Scalar]:
    return lambda n: pa.scalar(n, storage).cast(t)


_TIMESTAMP_TICK = {"s": Fraction(10**6), "ms": Fraction(10**3), "us": Fraction(1), "ns": Fraction(1, 1000)}
_INT64 = (-(2**63), 2**63 - 1)


def _integral_domain(t: pa.DataType) -> Domain:
    """Tick-count view of integers, decimals, dates and timestamps (exact comparisons, known range)."""
    if pa.types.is_integer(t):
        bits = t.bit_width
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if pa.types.is_signed_integer(t) else (0, 2**bits - 1)
        return Domain(Kind.INT, t, _numeric_key(1), lo, hi, lambda n: pa.scalar(n, t))
    if pa.types.is_decimal(t):
        limit = 10**t.precision - 1
        scale = t.scale
        return Domain(
            Kind.DECIMAL,
            t,
            _numeric_key(10**scale),
            -limit,
            limit,
            lambda n: pa.scalar(Decimal(n).scaleb(-scale, _CONTEXT), t),
        )
    if pa.types.is_date32(t):
        day = Fraction(86_400_000_000)
        return Domain(Kind.DATE, t, _temporal_key(day), -(2**31), 2**31 - 1, _storage_scalar(pa.int32(), t))
    if pa.types.is_date64(t):
        return Domain(Kind.DATE, t, _temporal_key(Fraction(1000)), *_INT64, _storage_scalar(pa.int64(), t))
    assert pa.types.is_timestamp(t)
    tick = _TIMESTAMP_TICK[t.unit]
    return Domain(Kind.TIMESTAMP, t, _temporal_key(tick), *_INT64, _storage_scalar(pa.int64(), t))


def _plain_domain(kind: Kind, t: pa.DataType) -> Domain:
    """Floats, strings, binaries and booleans compare by value (no rewriting needed)."""
    if kind is Kind.FLOAT:
        return Domain(kind, t, _float_key)
    if kind is Kind.STRING:
        return Domain(kind, t, _typed_key(str))
    if kind is Kind.BINARY:
        return Domain(kind, t, _typed_key(bytes))
    return Domain(kind, t, _typed_key(bool))


def _domain_for(subject: Node, literal_kinds: set[Kind]) -> Domain:
    """Where ``subject`` is compared with literals of the given kinds (SQL: the column's type wins)."""
    kind, t = subject.kind, subject.dtype
    assert t is not None
    if kind is Kind.DECIMAL and Kind.FLOAT in literal_kinds:
        return _plain_domain(Kind.FLOAT, pa.float64())  # DECIMAL vs DOUBLE compares as DOUBLE
    if kind in (Kind.INT, Kind.DECIMAL, Kind.DATE, Kind.TIMESTAMP):
        return _integral_domain(t)
    return _plain_domain(kind, t)


def _integral_target(op: str, ticks: Fraction, lo: int, hi: int) -> tuple[str, int] | bool:
    """Rewrite ``x op ticks`` over integers in [lo, hi] as ``x op' n``, or decide it outright.

    A fractional literal is never equal, and ``x < 1.5`` is ``x <= 1``; a
    literal outside the type's range is above or below every value.
    """
    if ticks.denominator != 1:
        if op in ("=", "<>"):
            return op == "<>"
        if op in ("<", "<="):
            op, n = "<=", math.floor(ticks)
        else:
            op, n = ">=", math.ceil(ticks)
    else:
        n = int(ticks)
    if n > hi:
        return op in ("<", "<=", "<>")
    if n < lo:
        return op in (">", ">=", "<>")
    return op, n


def _parse_temporal(value: str, subject: Node) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidPredicateError(
            f"cannot compare {_typed(subject)} with {literal_sql(value)}: the string is not an ISO date or timestamp"
        ) from None


def _convert_literal(
    op: str, subject: Node, value: LiteralValue, domain: Domain
) -> tuple[str, pa.Scalar, object] | bool:
    """``subject op value`` in ``domain``: (op, scalar, pruning key), or its constant outcome."""
    if domain.scalar_of is not None:  # integral domain
        assert domain.lo is not None and domain.hi is not None
        if isinstance(value, str):
            value = _parse_temporal(value, subject)
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value):
                return op == "<>"
            ticks = Fraction(domain.hi + 1 if value > 0 else domain.lo - 1)
        else:
            key = domain.key(value)
            assert isinstance(key, Fraction)
            ticks = key
        target = _integral_target(op, ticks, domain.lo, domain.hi)
        if isinstance(target, bool):
            return target
        op, n = target
        return op, domain.scalar_of(n), n
    if domain.kind is Kind.FLOAT:
        assert isinstance(value, int | float | Decimal)
        try:
            f = float(value)
        except OverflowError:
            f = math.copysign(math.inf, value)
        scalar = pa.scalar(f, domain.dtype)
    elif domain.kind is Kind.BINARY:
        assert isinstance(value, str)
        scalar = pa.scalar(value.encode(), domain.dtype)
    else:
        scalar = pa.scalar(value, domain.dtype)
    return op, scalar, domain.key(scalar.as_py())


# --------------------------------------------------------------------------- compatibility rules


def _comparable(a: Node, b: Node) -> bool:
    ka, kb = a.kind, b.kind
    if Kind.NULL in (ka, kb) or ka is kb:
        return True
    if ka in NUMERIC and kb in NUMERIC:
        return True
    if ka in TEMPORAL and kb in TEMPORAL:
        return True
    for lit, other in ((a, b), (b, a)):
        # A string literal stands for a date/timestamp, or for bytes in a binary column.
        if isinstance(lit, Literal) and lit.kind is Kind.STRING:
            if other.kind in TEMPORAL:
                return True
            if other.kind is Kind.BINARY and not isinstance(other, Literal):
                return True
    return False


def _fold_compare(op: str, a: LiteralValue, b: LiteralValue) -> bool | None:
    """Compare two literals as SQL would; Python's cross-type numeric comparisons are exact."""
    if a is None or b is None:
        return None
    if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        return op == "<>"  # IEEE: NaN is unequal and unordered (and Decimal refuses to compare with it)
    if kind_of_value(a) in TEMPORAL or kind_of_value(b) in TEMPORAL:
        return _PY_OPS[op](_literal_micros(a, b), _literal_micros(b, a))
    return _PY_OPS[op](a, b)


def _literal_micros(v: LiteralValue, other: LiteralValue) -> Fraction | None:
    if isinstance(v, str):
        try:
            v = dt.datetime.fromisoformat(v.strip())
        except ValueError:
            raise InvalidPredicateError(
                f"cannot compare {literal_sql(v)} with {literal_sql(other)}: the string is not an ISO date or timestamp"
            ) from None
    return _temporal_micros(v)


def _common_type(a: pa.DataType, b: pa.DataType, ka: Kind, kb: Kind) -> pa.DataType | None:
    """Type both sides of a column-vs-column comparison are cast to (None: leave both alone)."""
    if ka in NUMERIC and kb in NUMERIC:
        if Kind.FLOAT in (ka, kb):
            return pa.float64()
        if ka is Kind.INT and kb is Kind.INT:
            signed_a, signed_b = pa.types.is_signed_integer(a), pa.types.is_signed_integer(b)
            if signed_a and signed_b:
                return pa.int64()
            if not signed_a and not signed_b:
                return pa.uint64()
            # int64 vs uint64 has no common 64-bit integer type; decimal(20, 0) holds both exactly.
            return pa.decimal128(20, 0) if pa.uint64() in (a, b) else pa.int64()
        return None  # decimals: Arrow aligns scales itself (integers are cast below)
    if ka is Kind.STRING:
        return pa.large_string()
    if ka is Kind.BINARY:
        return pa.large_binary()
    if ka is Kind.DATE and kb is Kind.DATE:
        return pa.timestamp("ms")
    if ka is Kind.DATE:
        return b
    if kb is Kind.DATE:
        return a
    assert isinstance(a, pa.TimestampType) and isinstance(b, pa.TimestampType)
    finer = min(a.unit, b.unit, key=lambda u: _TIMESTAMP_TICK[u])
    return pa.timestamp(finer, a.tz or b.tz)


def _binary_plan(left: Node, right: Node) -> BinaryPlan:
    a, b = left.dtype, right.dtype
    assert a is not None and b is not None
    if a == b:
        return BinaryPlan(None, None)
    target = _common_type(a, b, left.kind, right.kind)
    if target is None:  # decimal with decimal or integer
        return BinaryPlan(
            pa.decimal128(20, 0) if left.kind is Kind.INT else None,
            pa.decimal128(20, 0) if right.kind is Kind.INT else None,
        )
    return BinaryPlan(target if a != target else None, target if b != target else None)


# --------------------------------------------------------------------------- literal folding


def _fold_arith(op: str, a: LiteralValue, b: LiteralValue) -> LiteralValue:
    """Constant arithmetic, DuckDB-style: exact for integers/decimals, '/' is float division."""
    if a is None or b is None:
        return None
    assert isinstance(a, int | float | Decimal) and isinstance(b, int | float | Decimal)
    if op == "/":
        fa, fb = float(a), float(b)
        if fb == 0:
            return math.nan if fa == 0 or math.isnan(fa) else math.copysign(math.inf, fa) * math.copysign(1, fb)
        return fa / fb
    if op == "%":
        assert isinstance(a, int) and isinstance(b, int)
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return a - b * (q if (a < 0) == (b < 0) else -q)  # remainder takes the dividend's sign
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
    with localcontext(_CONTEXT):
        result: int | float | Decimal = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op](a, b)
    return result


def _round_half_away(v: Decimal | float) -> int:
    return int(Decimal(v).to_integral_value(rounding=ROUND_HALF_UP))


def _to_float32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _cast_literal(value: LiteralValue, to: exp.DataType) -> LiteralValue:
    """Fold ``CAST(literal AS type)``; the result keeps only what comparisons need (its value)."""
    if value is None:
        return None
    target: str = to.this.name
    name = to.sql(dialect="duckdb")
    fail = f"cannot CAST {literal_sql(value)} AS {name}"
    try:
        if target in _INT_CASTS:
            if isinstance(value, int):  # bool included
                result = int(value)
            elif isinstance(value, Decimal | float):
                result = _round_half_away(value)
            elif isinstance(value, str):
                result = _round_half_away(Decimal(value.strip()))
            else:
                raise InvalidPredicateError(fail)
            lo, hi = _INT_CASTS[target]
            if not lo <= result <= hi:
                raise InvalidPredicateError(f"{fail}: out of range [{lo}, {hi}]")
            return result
        if target in ("DOUBLE", "FLOAT"):
            if isinstance(value, int | float | Decimal | str):
                f = float(value.strip()) if isinstance(value, str) else float(value)
                return _to_float32(f) if target == "FLOAT" else f
            raise InvalidPredicateError(fail)
        if target == "DECIMAL":
            return _cast_decimal(value, to, fail)
        if target in _STRING_CASTS:
            if isinstance(value, bool):
                return "true" if value else "false"
            if isinstance(value, dt.datetime):
                return value.isoformat(sep=" ")
            if isinstance(value, dt.date):
                return value.isoformat()
            return repr(value) if isinstance(value, float) else str(value)
        if target == "BOOLEAN":
            return _cast_bool(value, fail)
        if target == "DATE":
            if isinstance(value, dt.datetime):
                return _naive_utc(value).date()
            if isinstance(value, dt.date):
                return value
            if isinstance(value, str):
                return dt.date.fromisoformat(value.strip())
            raise InvalidPredicateError(fail)
        if target in _TIMESTAMP_CASTS or target in _TIMESTAMPTZ_CASTS:
            if isinstance(value, str):
                stamp = dt.datetime.fromisoformat(value.strip())
            elif isinstance(value, dt.datetime):
                stamp = value
            elif isinstance(value, dt.date):
                stamp = dt.datetime(value.year, value.month, value.day)
            else:
                raise InvalidPredicateError(fail)
            stamp = _naive_utc(stamp)
            return stamp.replace(tzinfo=_UTC) if target in _TIMESTAMPTZ_CASTS else stamp
    except InvalidPredicateError:
        raise
    except InvalidOperation:
        raise InvalidPredicateError(f"{fail}: not a number") from None
    except (ValueError, ArithmeticError) as e:  # malformed dates, NaN to integer, ...
        raise InvalidPredicateError(f"{fail}: {e}") from None
    raise InvalidPredicateError(f"CAST to {name} is not supported in predicates")


def _naive_utc(v: dt.datetime) -> dt.datetime:
    return v if v.tzinfo is None else v.astimezone(_UTC).replace(tzinfo=None)


def _cast_decimal(value: LiteralValue, to: exp.DataType, fail: str) -> Decimal:
    params = [p.this.this for p in to.expressions]
    precision, scale = (int(params[0]), int(params[1]) if len(params) > 1 else 0) if params else (18, 3)
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise InvalidPredicateError(fail)
    d = Decimal(value.strip()) if isinstance(value, str) else Decimal(value)
    result = d.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=_CONTEXT)
    if len(result.as_tuple().digits) > precision and result != 0:
        raise InvalidPredicateError(f"{fail}: too many digits for precision {precision}")
    return result


def _cast_bool(value: LiteralValue, fail: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "t", "1"):
            return True
        if text in ("false", "f", "0"):
            return False
    raise InvalidPredicateError(fail)


# --------------------------------------------------------------------------- the converter


def _working_type(t: pa.DataType) -> pa.DataType:
    """The type a column is computed as: dictionaries decoded, view/fixed-width layouts widened."""
    if pa.types.is_dictionary(t):
        return _working_type(t.value_type)
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return pa.large_binary()
    return t


def _is_list_like(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


class _Converter:
    """Walks one sqlglot tree; each method returns a typed node or raises a typed error."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    def convert(self, e: exp.Expression) -> Node:
        if isinstance(e, exp.Paren):
            return self.convert(e.this)
        if isinstance(e, exp.Column):
            return self._column(e)
        if isinstance(e, exp.Literal | exp.Boolean | exp.Null):
            return Literal(self._literal(e))
        if isinstance(e, exp.Neg):
            return self._negate(self.convert(e.this))
        if type(e) is exp.Cast:
            return self._cast(e)
        if type(e) in _COMPARISONS:
            return self._compare(_COMPARISONS[type(e)], self.convert(e.this), self.convert(e.expression))
        if isinstance(e, exp.And | exp.Or):
            left, right = self._boolean(e.this, e.key.upper()), self._boolean(e.expression, e.key.upper())
            return And(left, right) if isinstance(e, exp.And) else Or(left, right)
        if isinstance(e, exp.Not):
            return Not(self._boolean(e.this, "NOT"))
        if isinstance(e, exp.In):
            return self._in(e)
        if isinstance(e, exp.Between):
            return self._between(e)
        if isinstance(e, exp.Is):
            if not isinstance(e.expression, exp.Null):
                raise InvalidPredicateError(
                    f"{e.sql(dialect='duckdb')}: only IS NULL / IS NOT NULL are supported (compare with = instead)"
                )
            is_null = IsNull(self.convert(e.this))
            return Not(is_null) if e.args.get("negate") else is_null  # IS NOT NULL as some dialects parse it
        if isinstance(e, exp.Like | exp.ILike):
            return self._like(e, None)
        if isinstance(e, exp.Escape) and isinstance(e.this, exp.Like | exp.ILike):
            return self._like(e.this, e.expression)
        if type(e) in _ARITHMETIC:
            return self._arith(_ARITHMETIC[type(e)], self.convert(e.this), self.convert(e.expression))
        if type(e) in _FUNCTIONS:
            return self._function(e)
        raise self._unsupported(e)

    # ------------------------------------------------------------------ rejections

    def _unsupported(self, e: exp.Expression) -> InvalidPredicateError:
        text = e.sql(dialect="duckdb")
        if isinstance(e, exp.Subquery | exp.Query | exp.Exists):
            return InvalidPredicateError(f"subqueries are not allowed in a predicate: {text}")
        if isinstance(e, exp.Window):
            return InvalidPredicateError(f"window functions are not allowed in a predicate: {text}")
        if isinstance(e, exp.AggFunc):
            return InvalidPredicateError(f"aggregate functions are not allowed in a predicate: {text}")
        if isinstance(e, exp.Placeholder | exp.Parameter):
            return InvalidPredicateError(f"query parameters are not supported; inline the value: {text}")
        if isinstance(e, exp.Alias):
            return InvalidPredicateError(
                f"unexpected {e.alias!r} after {e.this.sql(dialect='duckdb')}: "
                "a predicate is a single boolean expression"
            )
        if isinstance(e, exp.Case):
            return InvalidPredicateError(f"CASE expressions are not supported in predicates: {text}")
        if isinstance(e, exp.Array):
            return InvalidPredicateError(f"array values are not supported in predicates: {text}")
        if isinstance(e, exp.TryCast):
            return InvalidPredicateError(f"TRY_CAST is not supported; use CAST on a literal: {text}")
        if isinstance(e, exp.Anonymous | exp.Func):
            name = e.name if isinstance(e, exp.Anonymous) else e.sql_name()
            return InvalidPredicateError(
                f"function {name.lower()}() is not supported in predicates (allowed: {_ALLOWED_FUNCTIONS})"
            )
        return InvalidPredicateError(f"unsupported SQL construct {e.key.upper()} in predicate: {text}")

    # ------------------------------------------------------------------ leaves

    def _column(self, e: exp.Column) -> Column:
        if any(e.args.get(part) for part in ("table", "db", "catalog")):
            raise InvalidPredicateError(
                f"qualified column reference {e.sql(dialect='duckdb')} is not supported; use the bare column name"
            )
        if isinstance(e.this, exp.Star):
            raise InvalidPredicateError("'*' is not allowed in a predicate")
        name = e.this.this
        names = self._schema.names
        matches = [n for n in names if n == name] or [n for n in names if n.lower() == name.lower()]
        if not matches:
            shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
            raise UnknownColumnError(f'unknown column "{name}" in predicate (the table has: {shown})')
        if len(matches) > 1:
            raise InvalidPredicateError(f'column reference "{name}" is ambiguous: the schema has {matches}')
        field = self._schema.field(matches[0])
        working = _working_type(field.type)
        if kind_of_type(working) is None:
            if _is_list_like(field.type):
                raise InvalidPredicateError(
                    f'column "{field.name}" is a vector/list column ({field.type}) and cannot be used in a predicate'
                )
            raise InvalidPredicateError(f'column "{field.name}" has type {field.type}, which predicates do not support')
        return Column(field.name, field.type, working)

    def _literal(self, e: exp.Literal | exp.Boolean | exp.Null) -> LiteralValue:
        if isinstance(e, exp.Null):
            return None
        if isinstance(e, exp.Boolean):
            return bool(e.this)
        text = e.this
        if e.is_string:
            return text
        if text.isdigit():
            return int(text)
        try:
            return Decimal(text)
        except InvalidOperation:
            raise InvalidPredicateError(f"malformed number {text!r}") from None

    def _cast(self, e: exp.Cast) -> Literal:
        operand = self.convert(e.this)
        if not isinstance(operand, Literal):
            raise InvalidPredicateError(
                f"CAST is only supported on literals, not on {_describe(operand)}: {e.sql(dialect='duckdb')}"
            )
        return Literal(_cast_literal(operand.value, e.to))

    # ------------------------------------------------------------------ scalar expressions

    def _negate(self, operand: Node) -> Node:
        if operand.kind not in NUMERIC and operand.kind is not Kind.NULL:
            raise _clash("unary minus needs a numeric operand", operand)
        if isinstance(operand, Literal):
            v = operand.value
            assert v is None or isinstance(v, int | float | Decimal)
            return Literal(None if v is None else -v)
        if operand.kind is Kind.FLOAT:
            assert operand.dtype is not None
            return Negate(operand, operand.dtype)
        return Negate(operand, pa.int64() if operand.kind is Kind.INT else pa.float64())

    def _arith(self, op: str, left: Node, right: Node) -> Node:
        for side in (left, right):
            if side.kind not in NUMERIC and side.kind is not Kind.NULL:
                raise _clash(f"operator {op} needs numeric operands", left, right)
        if op == "%" and (left.kind in (Kind.FLOAT, Kind.DECIMAL) or right.kind in (Kind.FLOAT, Kind.DECIMAL)):
            raise _clash("operator % needs integer operands", left, right)
        if isinstance(left, Literal) and isinstance(right, Literal):
            return Literal(_fold_arith(op, left.value, right.value))
        if Kind.NULL in (left.kind, right.kind):
            return Literal(None)  # NULL propagates through arithmetic
        result = self._arith_type(op, left, right)
        if pa.types.is_integer(result):
            lo, hi = (0, 2**64 - 1) if result == pa.uint64() else _INT64
            for side in (left, right):
                if isinstance(side, Literal):
                    assert isinstance(side.value, int)
                    if not lo <= side.value <= hi:
                        raise InvalidPredicateError(
                            f"integer literal {side.value} is out of range for {result} arithmetic"
                        )
        return Arith(op, left, right, result)

    @staticmethod
    def _arith_type(op: str, left: Node, right: Node) -> pa.DataType:
        """int op int stays 64-bit integer (uint64 when everything is unsigned); otherwise float64."""
        if op == "/" or left.kind is not Kind.INT or right.kind is not Kind.INT:
            return pa.float64()

        def unsigned(n: Node) -> bool:
            if isinstance(n, Literal):
                return isinstance(n.value, int) and n.value >= 0
            return n.dtype is not None and pa.types.is_unsigned_integer(n.dtype)

        has_uint64 = pa.uint64() in (left.dtype, right.dtype)
        return pa.uint64() if has_uint64 and unsigned(left) and unsigned(right) else pa.int64()

    def _function(self, e: exp.Expression) -> Node:
        name = _FUNCTIONS[type(e)]
        extra = [k for k, v in e.args.items() if v and k != "this"]
        if extra or e.this is None:
            raise InvalidPredicateError(f"{name}() takes exactly one argument: {e.sql(dialect='duckdb')}")
        arg = self.convert(e.this)
        wanted = NUMERIC if name == "abs" else frozenset({Kind.STRING})
        if arg.kind not in wanted and arg.kind is not Kind.NULL:
            expected = "a numeric" if name == "abs" else "a string"
            raise _clash(f"{name}() needs {expected} argument", arg)
        if isinstance(arg, Literal):
            return Literal(self._fold_function(name, arg.value))
        assert arg.dtype is not None
        result = pa.int64() if name == "length" else arg.dtype
        return Func(name, arg, result)

    @staticmethod
    def _fold_function(name: str, v: LiteralValue) -> LiteralValue:
        """Constant folding through the same Arrow kernels the evaluator uses."""
        if v is None:
            return None
        if name == "abs":
            assert isinstance(v, int | float | Decimal)
            return -v if v < 0 else v
        assert isinstance(v, str)
        arg = pa.scalar(v, pa.string())
        if name == "length":
            return int(pc.utf8_length(arg).as_py())
        folded = pc.utf8_lower(arg) if name == "lower" else pc.utf8_upper(arg)
        return str(folded.as_py())

    # ------------------------------------------------------------------ predicates

    def conjunct(self, e: exp.Expression) -> Node:
        """One operand of a top-level AND, converted and checked to be boolean."""
        return self._boolean(e, "AND")

    def _boolean(self, e: exp.Expression, context: str) -> Node:
        node = self.convert(e)
        if node.kind not in (Kind.BOOL, Kind.NULL):
            raise _clash(f"{context} needs boolean operands", node)
        return node

    def _compare(self, op: str, left: Node, right: Node) -> Compare:
        if not _comparable(left, right):
            raise _compare_clash(left, right)
        plan: ConstPlan | ScalarPlan | BinaryPlan
        if Kind.NULL in (left.kind, right.kind):
            plan = ConstPlan(None, None)
        elif isinstance(left, Literal) and isinstance(right, Literal):
            plan = ConstPlan(_fold_compare(op, left.value, right.value), None)
        elif isinstance(right, Literal):
            plan = self._scalar_plan(op, left, right.value)
        elif isinstance(left, Literal):
            plan = self._scalar_plan(_MIRROR[op], right, left.value)
        else:
            plan = _binary_plan(left, right)
        return Compare(op, left, right, plan)

    @staticmethod
    def _scalar_plan(op: str, subject: Node, value: LiteralValue) -> ConstPlan | ScalarPlan:
        domain = _domain_for(subject, {kind_of_value(value)})
        converted = _convert_literal(op, subject, value, domain)
        if isinstance(converted, bool):
            return ConstPlan(converted, subject)
        new_op, scalar, key = converted
        return ScalarPlan(subject, new_op, scalar, key, domain)

    def _between(self, e: exp.Between) -> Between:
        if e.args.get("symmetric"):
            raise InvalidPredicateError("BETWEEN SYMMETRIC is not supported")
        operand, low, high = self.convert(e.this), self.convert(e.args["low"]), self.convert(e.args["high"])
        return Between(operand, low, high, self._compare(">=", operand, low), self._compare("<=", operand, high))

    def _in(self, e: exp.In) -> InList:
        if e.args.get("query") is not None:
            raise InvalidPredicateError(f"subqueries are not allowed in a predicate: {e.sql(dialect='duckdb')}")
        if e.args.get("unnest") is not None or e.args.get("field") is not None:
            raise self._unsupported(e)
        if not e.expressions:
            raise InvalidPredicateError("the IN list is empty")
        operand = self.convert(e.this)
        values: list[Literal] = []
        for item in e.expressions:
            value = self.convert(item)
            if not isinstance(value, Literal):
                raise InvalidPredicateError(f"IN list values must be literals, got {_describe(value)}")
            if not _comparable(operand, value):
                raise _compare_clash(operand, value)
            values.append(value)
        return InList(operand, tuple(values), self._in_plan(operand, values))

    @staticmethod
    def _in_plan(operand: Node, values: list[Literal]) -> ConstPlan | InPlan:
        has_null = any(v.value is None for v in values)
        present = [v.value for v in values if v.value is not None]
        if isinstance(operand, Literal):
            if operand.value is None:
                return ConstPlan(None, None)
            if any(_fold_compare("=", operand.value, v) for v in present):
                return ConstPlan(True, None)
            return ConstPlan(None if has_null else False, None)
        domain = _domain_for(operand, {kind_of_value(v) for v in present})
        scalars: dict[Any, pa.Scalar] = {}
        for v in present:
            converted = _convert_literal("=", operand, v, domain)
            if isinstance(converted, bool):
                continue  # can never be equal (between representable values, out of range, NaN)
            _, scalar, key = converted
            if key is not None:  # NaN is equal to nothing
                scalars[key] = scalar
        keys = sorted(scalars)  # one domain, so the keys are mutually comparable
        value_set = pa.array([scalars[k] for k in keys], type=domain.dtype)
        return InPlan(operand, value_set, tuple(keys), has_null, domain)

    def _like(self, e: exp.Like | exp.ILike, escape_expr: exp.Expression | None) -> Node:
        operand = self.convert(e.this)
        pattern = self.convert(e.expression)
        keyword = "ILIKE" if isinstance(e, exp.ILike) else "LIKE"
        if operand.kind not in (Kind.STRING, Kind.NULL):
            raise _clash(f"{keyword} needs a string operand", operand)
        if not isinstance(pattern, Literal) or pattern.kind not in (Kind.STRING, Kind.NULL):
            raise InvalidPredicateError(f"the {keyword} pattern must be a string literal, got {_describe(pattern)}")
        escape: str | None = None
        if escape_expr is not None:
            escape_node = self.convert(escape_expr)
            if not isinstance(escape_node, Literal) or not isinstance(escape_node.value, str):
                raise InvalidPredicateError("ESCAPE needs a one-character string literal")
            if len(escape_node.value) != 1:
                raise InvalidPredicateError(f"ESCAPE needs exactly one character, got {literal_sql(escape_node.value)}")
            escape = escape_node.value
        plan: ConstPlan | LikePlan
        if pattern.value is None or (isinstance(operand, Literal) and operand.value is None):
            plan = ConstPlan(None, None)
        else:
            assert isinstance(pattern.value, str)
            plan = _like_plan(pattern.value, escape)
            if isinstance(operand, Literal):
                folded = pc.match_like(
                    pa.scalar(operand.value, pa.string()),
                    pattern=plan.arrow_pattern,
                    ignore_case=isinstance(e, exp.ILike),
                )
                plan = ConstPlan(folded.as_py(), None)
        node = Like(operand, pattern, escape, isinstance(e, exp.ILike), plan)
        return Not(node) if e.args.get("negate") else node


def _like_plan(pattern: str, escape: str | None) -> LikePlan:
    """Translate SQL LIKE (no default escape, as in DuckDB) to Arrow's backslash-escaped form."""
    out: list[str] = []
    prefix: list[str] = []
    in_prefix = True
    only_percent_after = True
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            i += 1
            if i == len(pattern):
                raise InvalidPredicateError(f"the LIKE pattern {literal_sql(pattern)} ends with its escape character")
            wildcard, c = False, pattern[i]
        else:
            wildcard = c in "%_"
        if wildcard:
            out.append(c)
            in_prefix = False
            only_percent_after = only_percent_after and c == "%"
        else:
            out.append("\\" + c if c in "\\%_" else c)
            if in_prefix:
                prefix.append(c)
            else:
                only_percent_after = False
        i += 1
    return LikePlan("".join(out), "".join(prefix), prefix_only=not in_prefix and only_percent_after)
