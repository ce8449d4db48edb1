"""Schema evolution's rules: column identity, the schemas a table has had, defaults, and safe type changes.

A table schema names every user column by a stable **field id** (field metadata ``superfile.id``), so a
column keeps its identity whatever it is called. A superfile is written under one schema and keeps the
column names of that schema (its *physical* names) forever; the manifest entry of each superfile records
which schema that was (``SuperfileEntry.schema_id``), and the table schema carries, in its own metadata,
the field id -> name map of every earlier schema (``superfile.schemas``). A read of a superfile written
under schema *k* therefore maps each current column through its field id to the name it has in the file
(or to nothing: the column was added later, and reads its default or null), casts a widened type, and
ignores columns dropped since. Nothing in a superfile is rewritten by a rename, a drop, an added column or
a widened type.

Schema-level metadata:

- ``superfile.schema_id``: this schema's id (0 for a table that never evolved); every evolution adds one.
- ``superfile.last_column_id``: the highest field id ever assigned (a dropped column's id is never reused).
- ``superfile.schemas``: JSON ``{"<schema id>": {"<field id>": "<name>"}}`` of every earlier schema.

Field metadata:

- ``superfile.id``: the field id.
- ``superfile.default``: the value rows written before the column existed read (and appends that leave the
  column out get), as base64 of an Arrow IPC stream of one row.
- ``superfile.indexed_since``: the schema id from which superfiles carry the column's current full-text or
  vector index (the schema whose commit created the index). A superfile written under an earlier schema is
  searched without it (exactly), whatever index blob it may hold from an index dropped since.

A table created before field ids existed has none: ids are assigned by position (1..n) when its schema is
read (:func:`identified`), which is how its superfiles were written, so nothing needs converting.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import pyarrow as pa

from superfile.errors import InvalidInputError, SchemaMismatchError, UnknownColumnError

__all__ = [
    "columns_to_add",
    "current_names",
    "default_of",
    "field_id",
    "filled",
    "former_names",
    "identified",
    "indexed_since",
    "next_schema",
    "physical_names",
    "plain",
    "plain_field",
    "schema_id",
    "since_valid",
    "widens",
    "with_default",
    "with_since",
]

ID_KEY = b"superfile.id"
DEFAULT_KEY = b"superfile.default"
SINCE_KEY = b"superfile.indexed_since"
SCHEMA_ID_KEY = b"superfile.schema_id"
LAST_ID_KEY = b"superfile.last_column_id"
HISTORY_KEY = b"superfile.schemas"
_PREFIX = b"superfile."
Meta = dict[bytes | str, bytes | str]  # Arrow metadata, as pyarrow's stubs type it
_ROW_ID = "_id"  # the table's own column: no field id, never renamed or dropped


def _user(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if f.name != _ROW_ID]


def field_id(field: pa.Field) -> int:
    """The field's id (0 for ``_id`` and for a field of a schema that has none)."""
    meta = field.metadata or {}
    return int(meta.get(ID_KEY, b"0"))


def schema_id(schema: pa.Schema) -> int:
    """The schema's id: 0 until the table's first evolution."""
    return int((schema.metadata or {}).get(SCHEMA_ID_KEY, b"0"))


def _set(field: pa.Field, key: bytes, value: bytes | None) -> pa.Field:
    meta: Meta = {k: v for k, v in (field.metadata or {}).items() if k != key}
    if value is not None:
        meta[key] = value
    return field.with_metadata(meta)


def identified(schema: pa.Schema) -> pa.Schema:
    """``schema`` with a field id on every user column: as they are, or by position for a schema without
    ids (a table from before field ids: 1..n in column order). Other metadata is kept."""
    fields = list(schema)
    if all(field_id(f) for f in _user(schema)):
        return schema
    last = int((schema.metadata or {}).get(LAST_ID_KEY, b"0"))
    out = []
    for f in fields:
        if f.name != _ROW_ID and not field_id(f):
            last += 1
            f = _set(f, ID_KEY, str(last).encode())
        out.append(f)
    meta: Meta = {k: v for k, v in (schema.metadata or {}).items()}
    meta[LAST_ID_KEY] = str(max([last, *(field_id(f) for f in out)])).encode()
    return pa.schema(out, metadata=meta)


def plain_field(field: pa.Field) -> pa.Field:
    """The field without this module's metadata (what results and files carry)."""
    meta: Meta = {k: v for k, v in (field.metadata or {}).items() if not k.startswith(_PREFIX)}
    return field.with_metadata(meta) if meta else field.remove_metadata()


def plain(schema: pa.Schema) -> pa.Schema:
    """The schema without this module's metadata, on the schema and on its fields."""
    meta: Meta = {k: v for k, v in (schema.metadata or {}).items() if not k.startswith(_PREFIX)}
    return pa.schema([plain_field(f) for f in schema], metadata=meta or None)


@functools.lru_cache(maxsize=256)
def _parse_history(raw: bytes) -> dict[int, dict[int, str]]:
    return {int(sid): {int(fid): name for fid, name in names.items()} for sid, names in json.loads(raw).items()}


def _history(schema: pa.Schema) -> dict[int, dict[int, str]]:
    raw = (schema.metadata or {}).get(HISTORY_KEY)
    return _parse_history(raw) if raw else {}


def _names_at(schema: pa.Schema, sid: int) -> dict[int, str]:
    """Field id -> column name in superfiles written under schema ``sid`` (as ``schema`` knows them)."""
    if sid == schema_id(schema):
        return {field_id(f): f.name for f in _user(schema)}
    try:
        return _history(schema)[sid]
    except KeyError:
        raise SchemaMismatchError(f"schema {sid} is not among this table's schemas (at {schema_id(schema)})") from None


def physical_names(schema: pa.Schema, sid: int) -> dict[str, str]:
    """Current column name -> its name in superfiles written under schema ``sid``, for every current column
    such a superfile holds (a column added since is absent)."""
    then = _names_at(schema, sid)
    names = {f.name: then[field_id(f)] for f in _user(schema) if field_id(f) in then}
    return {_ROW_ID: _ROW_ID, **names} if _ROW_ID in schema.names else names


def current_names(schema: pa.Schema, sid: int) -> dict[str, str]:
    """The inverse of :func:`physical_names`: a name in superfiles of schema ``sid`` -> the current name
    (columns dropped since are absent)."""
    return {then: now for now, then in physical_names(schema, sid).items()}


def former_names(schema: pa.Schema) -> dict[str, str | None]:
    """Names columns had in earlier schemas and have no more -> the column's name now (None: dropped since).
    A name several columns had means the latest of them. What lets a writer that has not seen a rename or a
    drop yet still write (``schema.coerce``): its columns are matched by field id."""
    now = {field_id(f): f.name for f in _user(schema)}
    out: dict[str, str | None] = {}
    for _, names in sorted(_history(schema).items()):
        for fid, name in names.items():
            if name not in now.values():
                out[name] = now.get(fid)
    return out


def indexed_since(field: pa.Field) -> int:
    """The schema id from which superfiles carry the column's current full-text or vector index."""
    return int((field.metadata or {}).get(SINCE_KEY, b"0"))


def with_since(field: pa.Field, sid: int | None) -> pa.Field:
    """The field with its index valid from schema ``sid`` (None: the mark removed, when the index is)."""
    return _set(field, SINCE_KEY, None if sid is None else str(sid).encode())


def since_valid(schema: pa.Schema, name: str, sid: int) -> bool:
    """Whether a superfile of schema ``sid`` carries the current index of column ``name`` (if it has one)."""
    return sid >= indexed_since(schema.field(name))


def with_default(field: pa.Field, value: Any) -> pa.Field:
    """The field carrying ``value`` as its default (checked against its type: SchemaMismatchError)."""
    if value is None:
        return _set(field, DEFAULT_KEY, None)
    try:
        row = pa.table({"v": pa.array([value], field.type)})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise SchemaMismatchError(f"default {value!r} does not fit column {field.name!r} ({field.type}): {e}") from None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, row.schema) as out:
        out.write_table(row)
    return _set(field, DEFAULT_KEY, base64.b64encode(sink.getvalue().to_pybytes()))


@functools.lru_cache(maxsize=1024)
def _decode_default(raw: bytes) -> pa.Scalar:
    table = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(raw))).read_all()
    return table.column(0)[0]


def default_of(field: pa.Field) -> pa.Scalar | None:
    """The field's default value (None: no default, rows without the column read null)."""
    raw = (field.metadata or {}).get(DEFAULT_KEY)
    return None if raw is None else _decode_default(raw)


def filled(field: pa.Field, rows: int) -> pa.Array:
    """``rows`` values of a column a superfile does not hold: the field's default, or nulls."""
    value = default_of(field)
    if value is None:
        return pa.nulls(rows, field.type)
    if value.type != field.type:  # the column was widened since the default was given
        value = value.cast(field.type)
    repeated: pa.Array = pa.repeat(cast(Any, value), rows)
    return repeated


def columns_to_add(
    fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None = None
) -> list[pa.Field]:
    """The columns of an ``add_columns`` call (a schema, a field or a list of fields), each carrying its
    default from ``defaults`` (checked against its type), without other metadata of this module."""
    if isinstance(fields, pa.Field):
        given = [fields]
    elif isinstance(fields, pa.Schema) or (
        isinstance(fields, Sequence) and not isinstance(fields, str) and all(isinstance(f, pa.Field) for f in fields)
    ):
        given = list(fields)
    else:
        raise InvalidInputError("columns must be a pyarrow.Schema, a pyarrow.Field or a list of pyarrow.Field")
    values = dict(defaults or {})
    unknown = sorted(set(values) - {f.name for f in given})
    if unknown:
        raise UnknownColumnError(f"defaults for columns not being added: {unknown}")
    out = []
    for f in given:
        value = values.get(f.name)
        f = plain_field(f)
        out.append(with_default(f, value) if value is not None else f)
    return out


def widens(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether every value of ``src`` converts to ``dst`` exactly, so stored values can be read as ``dst``:
    a wider integer of the same signedness, an unsigned integer to a wider signed one, an integer of at most
    32 bits (24 for float32) to float, float16/32 to float64, string/binary to their large form, and a
    decimal to one of the same scale and more digits. int64 to float64 is refused (not exact past 2^53)."""
    if src == dst:
        return False
    if pa.types.is_integer(src) and pa.types.is_integer(dst):
        if pa.types.is_signed_integer(src):
            return pa.types.is_signed_integer(dst) and dst.bit_width > src.bit_width
        return dst.bit_width > src.bit_width  # unsigned: to any wider integer
    if pa.types.is_integer(src) and pa.types.is_floating(dst):
        mantissa = {16: 11, 32: 24, 64: 53}[dst.bit_width]
        return src.bit_width + (0 if pa.types.is_signed_integer(src) else 1) <= mantissa + 1 and src.bit_width < 64
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return dst.bit_width > src.bit_width
    if pa.types.is_string(src) and pa.types.is_large_string(dst):
        return True
    if pa.types.is_binary(src) and pa.types.is_large_binary(dst):
        return True
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return dst.scale == src.scale and dst.precision > src.precision and dst.bit_width >= src.bit_width
    return False


def next_schema(old: pa.Schema, fields: Iterable[pa.Field]) -> pa.Schema:
    """The schema after one evolution of ``old``: ``fields`` (``_id`` first; fields keep their ids, a field
    without one gets a fresh id), the next schema id, and ``old``'s names recorded among the earlier schemas."""
    old = identified(old)
    meta: Meta = {k: v for k, v in (old.metadata or {}).items()}
    last = int(meta.get(LAST_ID_KEY, b"0"))
    out = []
    for f in fields:
        if f.name != _ROW_ID and not field_id(f):
            last += 1
            f = _set(f, ID_KEY, str(last).encode())
        out.append(f)
    history = {str(k): {str(fid): name for fid, name in v.items()} for k, v in _history(old).items()}
    history[str(schema_id(old))] = {str(field_id(f)): f.name for f in _user(old)}
    meta[HISTORY_KEY] = json.dumps(history, separators=(",", ":"), sort_keys=True).encode()
    meta[SCHEMA_ID_KEY] = str(schema_id(old) + 1).encode()
    meta[LAST_ID_KEY] = str(last).encode()
    return pa.schema(out, metadata=meta)
