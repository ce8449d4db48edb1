"""Row-level scalar indexes: one blob per indexed column (``idx/<column>``), kind ``bitmap`` or ``sorted``.

``bitmap``: one Roaring bitmap of row offsets per distinct value (at most
:data:`BITMAP_CARDINALITY_LIMIT`), for bools and low-cardinality columns.
``sorted``: the column's non-null values sorted, with their row offsets, for
range predicates on numbers, temporals and strings. Both keep the null rows
(and, for floats, the NaN rows) as bitmaps. Byte layout and semantics:
``docs/format.md`` ("Scalar indexes").

Lookups follow SQL and IEEE: NULL matches no comparison; NaN equals nothing
and is unordered, so ``x != v`` holds for NaN rows while ``=``, ``<`` ... never do.
"""

from __future__ import annotations

import array
import datetime
import decimal
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyroaring

from superfile.errors import CorruptSuperfileError, InvalidOptionError, InvalidPredicateError, SchemaMismatchError
from superfile.format.layout import idx_section

__all__ = [
    "BITMAP_CARDINALITY_LIMIT",
    "KINDS",
    "OPS",
    "ScalarIndex",
    "ScalarIndexParts",
    "prepare_scalar_index",
]

KINDS = ("bitmap", "sorted")
OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "is_null", "is_not_null")
BITMAP_CARDINALITY_LIMIT = 65536
MAGIC = b"SFSIDX01"
_HEAD = struct.Struct("<8sI")  # magic, JSON header length; parts follow, 8-byte aligned in the file
_ALIGN = 8
_MAX_ROWS = 1 << 32  # Roaring bitmaps and the u32 row arrays address rows with 32 bits
# nanoseconds per unit of a temporal column's integer storage
_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_DAY_NS = 86400 * 10**9


def _key_kind(t: pa.DataType) -> str:
    """How values of type ``t`` are keyed: bool, int, float, temporal (int64 storage) or bytes."""
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "temporal"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "bytes"
    if _is_binary(t):
        return "bytes"
    raise SchemaMismatchError(f"cannot build a scalar index on type {t}")


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))


def _unit_ns(t: pa.DataType) -> int:
    if pa.types.is_date32(t):
        return _DAY_NS
    if pa.types.is_date64(t):
        return _UNIT_NS["ms"]
    return _UNIT_NS[cast(pa.TimestampType, t).unit]


# -- building ------------------------------------------------------------------------------------


@dataclass
class ScalarIndexParts:
    """A built index before encoding: ``encode(base_offset)`` lays its arrays out 8-byte aligned in the file."""

    column: str
    kind: str
    type: pa.DataType
    num_rows: int
    count: int  # keys: distinct values (bitmap) or indexed rows (sorted)
    header: dict[str, Any]
    parts: dict[str, bytes] = field(default_factory=dict)

    def info(self) -> dict[str, object]:
        return {
            "name": idx_section(self.column),
            "kind": self.kind,
            "column": self.column,
            "type": str(self.type),
            "count": self.count,
        }

    def encode(self, base_offset: int = 0) -> bytes:
        """The blob. ``base_offset`` is its absolute offset in the file: parts start 8-byte aligned there,
        so readers of a memory-mapped (page-aligned) file view them without copying."""
        names = list(self.parts)
        # the header's length depends on the offsets it lists: widen the offsets until it is stable
        width = 1
        while True:
            layout: dict[str, list[int]] = {}
            header = {**self.header, "parts": layout}
            head_len = len(json.dumps({**header, "parts": {n: [10**width, 10**width] for n in names}}))
            pos = _HEAD.size + head_len
            for n in names:
                pos += -(base_offset + pos) % _ALIGN
                layout[n] = [pos, len(self.parts[n])]
                pos += len(self.parts[n])
            text = json.dumps(header).encode()
            if len(text) <= head_len:
                break
            width += 1
        out = bytearray(_HEAD.pack(MAGIC, head_len))
        out += text.ljust(head_len)
        for n in names:
            out += bytes(layout[n][0] - len(out))
            out += self.parts[n]
        return bytes(out)


def prepare_scalar_index(values: pa.Array | pa.ChunkedArray, kind: str, column: str) -> ScalarIndexParts:
    """Index one column. Raises InvalidOptionError for an unknown kind or a bitmap index over more than
    :data:`BITMAP_CARDINALITY_LIMIT` distinct values, SchemaMismatchError for an unsupported type."""
    if kind not in KINDS:
        raise InvalidOptionError(f"scalar index of {column!r} must be one of {KINDS}, got {kind!r}")
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    t = arr.type
    key = _key_kind(t)
    n = len(arr)
    if n >= _MAX_ROWS:
        raise InvalidOptionError(f"scalar index of {column!r}: {n} rows, at most {_MAX_ROWS - 1} supported")
    if key == "bytes" and not (pa.types.is_string(t) or pa.types.is_binary(t)):
        arr = arr.cast(
            pa.large_string() if pa.types.is_string_view(t) or pa.types.is_large_string(t) else pa.large_binary()
        )
    valid = _valid_mask(arr)
    nans = np.zeros(n, bool)
    if key == "float":
        nans = np.isnan(cast(Any, pc.fill_null(cast(Any, arr), 0)).to_numpy(zero_copy_only=False)) & valid
    indexed = valid & ~nans  # rows with an orderable value
    nulls = _bitmap(np.flatnonzero(~valid))
    parts: dict[str, bytes] = {
        "schema": pa.schema([pa.field("value", t)]).serialize().to_pybytes(),
        "nulls": nulls.serialize(),
        "nans": _bitmap(np.flatnonzero(nans)).serialize(),
    }
    header: dict[str, Any] = {"kind": kind, "num_rows": n, "key": key}
    rows = np.flatnonzero(indexed).astype(np.uint32)
    if kind == "sorted":
        if key == "bytes":
            sel = arr.filter(pa.array(indexed))
            order = pc.sort_indices(sel).to_numpy()
            _put_bytes(parts, sel.take(pa.array(order)))
        else:
            keys = _numeric_keys(arr, key)[indexed]
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            header["dtype"] = keys.dtype.str
            parts["keys"] = keys.tobytes()
        parts["rows"] = rows[order].astype("<u4").tobytes()
        count = len(rows)
    else:
        encoded = cast(pa.DictionaryArray, arr.filter(pa.array(indexed)).dictionary_encode())
        dictionary = encoded.dictionary
        count = len(dictionary)
        if count > BITMAP_CARDINALITY_LIMIT:
            raise InvalidOptionError(
                f"bitmap index of {column!r}: {count} distinct values, at most {BITMAP_CARDINALITY_LIMIT} "
                "(use a sorted index)"
            )
        if key == "bytes":
            dict_order = pc.sort_indices(dictionary).to_numpy()
            _put_bytes(parts, dictionary.take(pa.array(dict_order)))
        else:
            dkeys = _numeric_keys(dictionary, key)
            dict_order = np.argsort(dkeys, kind="stable")
            dkeys = dkeys[dict_order]
            header["dtype"] = dkeys.dtype.str
            parts["keys"] = dkeys.tobytes()
        rank = np.empty(count, np.int64)
        rank[dict_order] = np.arange(count)
        codes = rank[encoded.indices.to_numpy()] if count else np.zeros(0, np.int64)
        by_value = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=count))])
        grouped = rows[by_value]
        blobs = [_bitmap(grouped[bounds[i] : bounds[i + 1]]).serialize() for i in range(count)]
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs], dtype=np.int64)]).astype("<u8")
        parts["bitmap_offsets"] = offsets.tobytes()
        parts["bitmaps"] = b"".join(blobs)
    header["count"] = count
    return ScalarIndexParts(column, kind, t, n, count, header, parts)


def _valid_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), bool)


def _numeric_keys(arr: pa.Array, key: str) -> np.ndarray:
    """Fixed-width little-endian keys of a bool/int/float/temporal array (nulls as 0)."""
    t = arr.type
    if key == "temporal":
        storage = pa.int32() if pa.types.is_date32(t) else pa.int64()
        arr = arr.view(storage)
    filled = cast(Any, pc.fill_null(cast(Any, arr), False if key == "bool" else 0))
    out = np.asarray(filled.to_numpy(zero_copy_only=False))
    if key == "bool":
        return out.astype("u1")
    if key == "temporal":
        return out.astype("<i8")
    return out.astype(out.dtype.newbyteorder("<"), copy=False)


def _put_bytes(parts: dict[str, bytes], sorted_values: pa.Array) -> None:
    """Sorted strings/binaries as i64 offsets + concatenated UTF-8/bytes."""
    large = sorted_values.cast(pa.large_binary())
    n = len(large)
    if n == 0:
        parts["key_offsets"], parts["key_data"] = np.zeros(1, "<i8").tobytes(), b""
        return
    bufs = large.buffers()
    offsets = np.frombuffer(cast(Any, bufs[1]), "<i8", count=n + 1, offset=large.offset * 8)
    start, end = int(offsets[0]), int(offsets[-1])
    parts["key_offsets"] = (offsets - start).astype("<i8").tobytes()
    parts["key_data"] = cast(pa.Buffer, bufs[2]).to_pybytes()[start:end]


def _bitmap(rows: np.ndarray) -> pyroaring.BitMap:
    """A bitmap of row offsets (sorting first: Roaring builds sorted input fastest; pyroaring takes an
    ``array('I')`` in bulk, ~4x faster than a memoryview, which it converts value by value)."""
    r = np.sort(np.asarray(rows, dtype=np.uint32))
    return pyroaring.BitMap(array.array("I", r.tobytes())) if len(r) else pyroaring.BitMap()


# -- reading -------------------------------------------------------------------------------------


class ScalarIndex:
    """A scalar index over a (zero-copy) view of its blob. Thread-safe: lookups share read-only state."""

    def __init__(self, buf: memoryview | bytes, *, source: str = "<scalar index>") -> None:
        view = memoryview(buf).cast("B")
        self._source = source
        try:
            magic, head_len = _HEAD.unpack_from(view, 0)
            if magic != MAGIC:
                raise ValueError(f"bad magic {bytes(magic)!r}")
            header = json.loads(bytes(view[_HEAD.size : _HEAD.size + head_len]))
            self.kind: str = header["kind"]
            self.num_rows: int = int(header["num_rows"])
            self._key: str = header["key"]
            self.count: int = int(header["count"])
            self._parts = {str(k): view[int(o) : int(o) + int(ln)] for k, (o, ln) in header["parts"].items()}
            for name, (o, ln) in header["parts"].items():
                if int(o) < 0 or int(o) + int(ln) > len(view):
                    raise ValueError(f"part {name!r} out of bounds")
            self.type: pa.DataType = pa.ipc.read_schema(pa.py_buffer(bytes(self._parts["schema"]))).field(0).type
            self._nulls = pyroaring.FrozenBitMap.deserialize(bytes(self._parts["nulls"]))
            if self._key == "bytes":
                self._offsets = self._array("key_offsets", "<i8", self.count + 1)
                self._data = self._parts["key_data"]
                self._keys: np.ndarray | None = None
            else:
                self._keys = self._array("keys", str(header["dtype"]), self.count)
            if self.kind == "sorted":
                self._rows = self._array("rows", "<u4", self.count)
            elif self.kind == "bitmap":
                self._bitmap_offsets = self._array("bitmap_offsets", "<u8", self.count + 1)
                self._bitmaps = self._parts["bitmaps"]
            else:
                raise ValueError(f"unknown kind {self.kind!r}")
        except (KeyError, TypeError, ValueError, struct.error, pa.ArrowException) as e:
            raise CorruptSuperfileError(source, f"scalar index does not parse: {e!r}") from None
        self._unit = _unit_ns(self.type) if self._key == "temporal" else 1
        self._not_null: pyroaring.FrozenBitMap | None = None

    def _array(self, part: str, dtype: str, count: int) -> np.ndarray:
        raw = self._parts[part]
        a = np.frombuffer(raw, dtype=np.dtype(dtype), count=count)
        return a if a.flags.aligned else a.copy()  # misaligned (blob copied out of its file): copy once

    # -- public -------------------------------------------------------------------------------

    def lookup(self, op: str, value: Any = None) -> pyroaring.BitMap:
        """Row offsets where ``column <op> value`` is TRUE (SQL: NULL rows never match a comparison).

        ``op`` is one of :data:`OPS`; ``"in"`` takes a list (NULL members match nothing), ``is_null`` and
        ``is_not_null`` ignore ``value``. The literal is compared in the column's type: integers and
        temporals exactly (``x < 2.5`` on ints is ``x <= 2``; a ``datetime`` against ``timestamp[s]``
        keeps its microseconds), floats after conversion to the column's float type.
        """
        if op == "is_null":
            return pyroaring.BitMap(self._nulls)
        if op == "is_not_null":
            return pyroaring.BitMap(self._non_null())
        if op == "in":
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise InvalidPredicateError(f"'in' takes a list of values, got {type(value).__name__}")
            out = pyroaring.BitMap()
            for v in value:
                if v is not None:
                    out |= self.lookup("=", v)
            return out
        if op not in OPS:
            raise InvalidPredicateError(f"unknown operator {op!r}; expected one of {OPS}")
        if value is None:
            return pyroaring.BitMap()  # a comparison with NULL is NULL
        lt, le = self._bounds(value)
        if op == "!=":
            return pyroaring.BitMap(self._non_null()) - self._range(lt, le)
        if lt < 0:  # the literal is NaN: unordered, equal to nothing
            return pyroaring.BitMap()
        lo, hi = {"=": (lt, le), "<": (0, lt), "<=": (0, le), ">": (le, self.count), ">=": (lt, self.count)}[op]
        return self._range(lo, hi)

    def lookup_range(self, low: tuple[str, Any] | None, high: tuple[str, Any] | None) -> pyroaring.BitMap:
        """Rows where ``column > / >= low`` and ``column < / <= high`` (``(op, value)``, either side optional):
        one bitmap built from the intersected key range, instead of two half-open ones intersected after."""
        lo, hi = 0, self.count
        for bound, ops in ((low, (">", ">=")), (high, ("<", "<="))):
            if bound is None:
                continue
            op, value = bound
            if op not in ops:
                raise InvalidPredicateError(f"lookup_range: expected one of {ops}, got {op!r}")
            if value is None:
                return pyroaring.BitMap()  # a comparison with NULL is NULL
            lt, le = self._bounds(value)
            if lt < 0:  # NaN: unordered, matches nothing
                return pyroaring.BitMap()
            if op in (">", ">="):
                lo = max(lo, le if op == ">" else lt)
            else:
                hi = min(hi, lt if op == "<" else le)
        return self._range(lo, hi)

    def values(self) -> pa.Array:
        """The index's keys in order: distinct values (bitmap) or every indexed row's value (sorted)."""
        if self._key == "bytes":
            offsets = pa.py_buffer(self._offsets.tobytes())
            data = pa.py_buffer(bytes(self._data))
            t = pa.large_binary() if _is_binary(self.type) else pa.large_string()
            arr = pa.Array.from_buffers(t, self.count, [None, offsets, data])
            return arr.cast(self.type)
        assert self._keys is not None
        if self._key == "bool":
            return pa.array(self._keys.astype(bool))
        if self._key == "temporal":
            storage = pa.int32() if pa.types.is_date32(self.type) else pa.int64()
            return pa.array(self._keys).cast(storage).view(self.type)
        return pa.array(self._keys).cast(self.type)

    # -- internals ---------------------------------------------------------------------------

    def _non_null(self) -> pyroaring.FrozenBitMap:
        if self._not_null is None:
            everything = pyroaring.BitMap()
            if self.num_rows:
                everything.add_range(0, self.num_rows)
            self._not_null = pyroaring.FrozenBitMap(everything - self._nulls)
        return self._not_null

    def _range(self, lo: int, hi: int) -> pyroaring.BitMap:
        """Rows of keys ``[lo, hi)``."""
        if hi <= lo:
            return pyroaring.BitMap()
        if self.kind == "sorted":
            return _bitmap(self._rows[lo:hi])
        offs = self._bitmap_offsets
        maps = [
            pyroaring.BitMap.deserialize(bytes(self._bitmaps[int(offs[i]) : int(offs[i + 1])])) for i in range(lo, hi)
        ]
        return maps[0] if len(maps) == 1 else pyroaring.BitMap.union(*maps)

    def _bounds(self, value: Any) -> tuple[int, int]:
        """(number of keys < value, number of keys <= value); (-1, -1) for NaN (matches nothing)."""
        if self._key == "bytes":
            lit = self._bytes_literal(value)
            return _bisect_bytes(self._offsets, self._data, lit, False), _bisect_bytes(
                self._offsets, self._data, lit, True
            )
        keys = self._keys
        assert keys is not None
        if self._key == "float":
            f = self._float_literal(value)
            if math.isnan(f):
                return -1, -1
            x = keys.dtype.type(f)
            return int(np.searchsorted(keys, x, "left")), int(np.searchsorted(keys, x, "right"))
        q = self._exact_literal(value)
        if q is None:
            return -1, -1
        info = np.iinfo(keys.dtype)
        return _int_bound(keys, math.ceil(q), "left", info), _int_bound(keys, math.floor(q), "right", info)

    def _fail(self, value: Any, why: str = "") -> InvalidPredicateError:
        return InvalidPredicateError(
            f"{self._source}: cannot compare {value!r} with a {self.type} column{': ' + why if why else ''}"
        )

    def _bytes_literal(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, bytes | bytearray | memoryview):
            if not _is_binary(self.type):
                raise self._fail(value, "expected a str")
            return bytes(value)
        raise self._fail(value, "expected a str")

    def _float_literal(self, value: Any) -> float:
        if isinstance(value, bool | str | bytes) or not isinstance(value, int | float | np.number | decimal.Decimal):
            raise self._fail(value, "expected a number")
        try:
            return float(cast(Any, pa.scalar(float(value), self.type).as_py()))
        except (pa.ArrowException, OverflowError, ValueError) as e:
            raise self._fail(value, str(e)) from None

    def _exact_literal(self, value: Any) -> Fraction | None:
        """The literal as an exact number in the column's storage units (None for NaN)."""
        if self._key == "bool":
            if not isinstance(value, bool | np.bool_):
                raise self._fail(value, "expected a bool")
            return Fraction(int(value))
        if self._key == "int":
            if isinstance(value, bool | str | bytes) or not isinstance(
                value, int | float | np.number | decimal.Decimal | Fraction
            ):
                raise self._fail(value, "expected a number")
            if isinstance(value, float | np.floating):
                if math.isnan(value):
                    return None
                if math.isinf(value):
                    return Fraction(10**40) if value > 0 else Fraction(-(10**40))
            return Fraction(cast(Any, value))
        return Fraction(self._temporal_ns(value), self._unit)

    def _temporal_ns(self, value: Any) -> int:
        """Nanoseconds since the epoch of a temporal literal (exact; naive datetimes count as UTC)."""
        tz = getattr(self.type, "tz", None)
        try:
            if isinstance(value, str):
                return int(cast(Any, pa.scalar(value).cast(pa.timestamp("ns", tz))).value)
            if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
                return (value - datetime.date(1970, 1, 1)).days * _DAY_NS
            if isinstance(value, datetime.datetime | np.datetime64) or type(value).__name__ == "Timestamp":
                try:
                    return int(cast(Any, pa.scalar(value, pa.timestamp("ns", tz))).value)
                except pa.ArrowInvalid:  # outside ns range (years 1677-2262): microseconds are exact
                    return int(cast(Any, pa.scalar(value, pa.timestamp("us", tz))).value) * 1000
            if isinstance(value, pa.Scalar) and (pa.types.is_timestamp(value.type) or pa.types.is_date(value.type)):
                return int(cast(Any, value.cast(pa.timestamp("us", tz))).value) * 1000
        except (pa.ArrowException, OverflowError, ValueError) as e:
            raise self._fail(value, str(e)) from None
        raise self._fail(value, "expected a date, datetime or ISO string")


def _int_bound(keys: np.ndarray, x: int, side: str, info: Any) -> int:
    """np.searchsorted for a Python int that may lie outside the key dtype's range."""
    if x > info.max:
        return len(keys)
    if x < info.min:
        return 0
    return int(np.searchsorted(keys, keys.dtype.type(x), cast(Any, side)))


def _bisect_bytes(offsets: np.ndarray, data: memoryview, lit: bytes, right: bool) -> int:
    """Number of sorted byte strings (offsets + data) < ``lit`` (<= if ``right``); byte order is UTF-8
    code point order, as Python's str and Arrow's string comparisons."""
    lo, hi = 0, len(offsets) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        key = bytes(data[int(offsets[mid]) : int(offsets[mid + 1])])
        if key < lit or (right and key == lit):
            lo = mid + 1
        else:
            hi = mid
    return lo
