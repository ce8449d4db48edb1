"""What travels between the SDK and the gateway: Arrow IPC streams, schemas as JSON, rows as JSON.

Both sides import this module, so a schema or a result table makes the round
trip unchanged: Arrow IPC carries exact types (and the search results' schema
metadata); the JSON forms exist for curl and other languages.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import re
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from superfile.errors import InvalidInputError

__all__ = [
    "ARROW_STREAM",
    "from_ipc",
    "json_default",
    "parse_type",
    "schema_from_b64",
    "schema_from_json",
    "schema_to_b64",
    "schema_to_json",
    "table_to_json",
    "to_ipc",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def to_ipc(table: pa.Table) -> bytes:
    """One Arrow IPC stream holding ``table`` (schema metadata included)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table in an Arrow IPC stream; a typed error (not an Arrow one) when the bytes are not a stream."""
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
        raise InvalidInputError(f"the body is not a valid Arrow IPC stream: {e}") from None


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (ValueError, pa.ArrowInvalid, OSError) as e:
        raise InvalidInputError(f"schema_ipc is not a base64 Arrow IPC schema: {e}") from None


_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "halffloat": pa.float16(),
    "float16": pa.float16(),
    "float": pa.float32(),
    "float32": pa.float32(),
    "double": pa.float64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "utf8": pa.string(),
    "large_string": pa.large_string(),
    "large_utf8": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "date32": pa.date32(),
    "date32[day]": pa.date32(),
    "date64": pa.date64(),
    "date64[ms]": pa.date64(),
}
_UNIT = re.compile(r"^(timestamp|time32|time64|duration)\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]$")
_DECIMAL = re.compile(r"^decimal(128|256)?\(\s*(\d+)\s*,\s*(-?\d+)\s*\)$")
_LIST = re.compile(r"^(list|large_list|fixed_size_list)<(?:[A-Za-z_][\w]*:\s*)?(.+)>(?:\[(\d+)\])?$")
_DICT = re.compile(r"^dictionary<values=(.+), indices=(\w+)(?:, ordered=([01]))?>$")
_VECTOR = re.compile(r"^vector\[(\d+)\]$")


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its ``str()`` form (``int64``, ``timestamp[us, tz=UTC]``, ``fixed_size_list<item:
    float>[384]``, ...) or a short alias (``utf8``, ``float32``, ``vector[384]``)."""
    if not isinstance(text, str):
        raise InvalidInputError(f"a column type must be a string, got {text!r}")
    t = text.strip()
    if t in _PRIMITIVES:
        return _PRIMITIVES[t]
    try:
        if m := _UNIT.match(t):
            kind, unit, tz = m.groups()
            if tz is None:
                return pa.type_for_alias(cast(Any, f"{kind}[{unit}]"))
            if kind != "timestamp":
                raise InvalidInputError(f"only timestamps take a time zone: {text!r}")
            return pa.timestamp(cast(Any, unit), tz=tz)
        if m := _DECIMAL.match(t):
            width, precision, scale = m.groups()
            return (pa.decimal256 if width == "256" else pa.decimal128)(int(precision), int(scale))
        if m := _VECTOR.match(t):
            return pa.list_(pa.float32(), int(m.group(1)))
        if m := _LIST.match(t):
            kind, inner, size = m.groups()
            value = parse_type(inner)
            if kind == "fixed_size_list":
                if size is None:
                    raise InvalidInputError(f"a fixed_size_list needs its size: {text!r}")
                return pa.list_(value, int(size))
            if size is not None:
                raise InvalidInputError(f"only a fixed_size_list has a size: {text!r}")
            return pa.large_list(value) if kind == "large_list" else pa.list_(value)
        if m := _DICT.match(t):
            values, indices, ordered = m.groups()
            return pa.dictionary(
                cast(Any, parse_type(indices)), cast(Any, parse_type(values)), cast(Any, ordered == "1")
            )
    except (ValueError, TypeError, pa.ArrowInvalid) as e:
        raise InvalidInputError(f"invalid column type {text!r}: {e}") from None
    raise InvalidInputError(f"unknown column type {text!r}")


def schema_to_json(schema: pa.Schema) -> list[dict[str, Any]]:
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]


def schema_from_json(fields: Any) -> pa.Schema:
    """A schema from ``[{"name": ..., "type": ..., "nullable": true}, ...]``."""
    if not isinstance(fields, list) or not fields:
        raise InvalidInputError('schema must be a non-empty list of {"name": ..., "type": ...} objects')
    out = []
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
            raise InvalidInputError(f'each schema field needs a "name" and a "type", got {f!r}')
        unknown = set(f) - {"name", "type", "nullable"}
        if unknown:
            raise InvalidInputError(f"unknown schema field keys {sorted(unknown)} in {f!r}")
        nullable = f.get("nullable", True)
        if not isinstance(nullable, bool):
            raise InvalidInputError(f"nullable must be true or false, got {nullable!r}")
        out.append(pa.field(f["name"], parse_type(f["type"]), nullable=nullable))
    try:
        return pa.schema(out)
    except (pa.ArrowInvalid, ValueError) as e:
        raise InvalidInputError(f"invalid schema: {e}") from None


def json_default(value: Any) -> Any:
    """JSON for the Python values Arrow hands out that ``json`` cannot write itself."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _finite(array: pa.Array) -> pa.Array:
    """``array`` with NaN and infinities (at any depth) as nulls: JSON has no such numbers."""
    t = array.type
    if pa.types.is_floating(t):
        return pc.if_else(pc.is_finite(array), array, pa.scalar(None, t))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if not _has_floats(t.value_type):
            return array
        if array.offset:  # ``values`` ignores a slice: work on a compact copy
            array = pa.concat_arrays([array])
        cls = type(array)
        values = _finite(array.values)  # type: ignore[attr-defined]
        if pa.types.is_fixed_size_list(t):
            return pa.FixedSizeListArray.from_arrays(values, t.list_size, mask=array.is_null())
        return cls.from_arrays(array.offsets, values, mask=array.is_null())  # type: ignore[attr-defined]
    if pa.types.is_struct(t) and _has_floats(t):
        fields = [_finite(array.field(i)) for i in range(t.num_fields)]  # type: ignore[attr-defined]
        return pa.StructArray.from_arrays(fields, fields=list(t), mask=array.is_null())
    return array


def _has_floats(t: pa.DataType) -> bool:
    if pa.types.is_floating(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_floats(t.value_type)
    return pa.types.is_struct(t) and any(_has_floats(f.type) for f in t)


def table_to_json(table: pa.Table) -> bytes:
    """``{"columns": [...], "num_rows": n, "rows": [{...}, ...]}`` (binary as base64, times as ISO 8601,
    NaN and infinities as null: strict JSON that every parser reads)."""
    columns = [
        pa.chunked_array([_finite(c) for c in col.chunks], col.type) if _has_floats(col.type) else col
        for col in table.columns
    ]
    rows = pa.Table.from_arrays(columns, schema=table.schema).to_pylist()
    body = {"columns": table.column_names, "num_rows": table.num_rows, "rows": rows}
    return json.dumps(body, default=json_default, separators=(",", ":"), allow_nan=False).encode()
