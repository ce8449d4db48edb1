"""How the ``superfile`` command prints what a command returns: always rows (an Arrow table), in one of four
formats, with every value in full unless ``--truncate`` asks otherwise.

- ``table``: an aligned text table with a header, numbers right-aligned, ``null`` for a missing value,
  strings with their line breaks and tabs written as ``\\n``, ``\\r`` and ``\\t`` (one row per line);
  lists and structs as JSON.
- ``json``: JSON lines, one object per row: strict JSON (NaN and infinities are ``null``), binary as
  base64, times as ISO 8601, decimals as strings. ``jq -s .`` makes one array of them.
- ``csv``: RFC 4180 with a header row; a missing value is an empty field, lists and structs are JSON.
- ``parquet``: one Parquet file, to ``--output`` or to stdout when it is not a terminal.

32-bit floats are written as their shortest decimal (``0.1``, not ``0.10000000149011612``).
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["FORMATS", "Output", "write"]

FORMATS = ("table", "json", "csv", "parquet")
_ELLIPSIS = "…"


@dataclass(frozen=True)
class Output:
    """Where and how a command's rows go: ``--format``, ``--output``, ``--truncate``, ``--no-header``."""

    format: str = "table"
    path: str | None = None  # None: stdout
    truncate: int | None = None  # the table format's widest value, in characters (None: full values)
    header: bool = True  # the table and csv formats' header row


def write(rows: pa.Table, out: Output) -> None:
    """Write ``rows`` as ``out`` says (to a file, or to stdout)."""
    if out.format == "parquet":
        if out.path is not None:
            pq.write_table(rows, out.path)
        else:
            sys.stdout.flush()
            pq.write_table(rows, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        return
    if out.path is not None:
        with open(out.path, "w", encoding="utf-8", newline="") as f:
            _write_text(rows, out, f)
    else:
        _write_text(rows, out, sys.stdout)
        sys.stdout.flush()


def _write_text(rows: pa.Table, out: Output, f: IO[str]) -> None:
    if out.format == "json":
        converters = [_to_json(field.type) for field in rows.schema]
        names = rows.column_names
        for values in zip(*(c.to_pylist() for c in rows.columns), strict=True):
            row = {n: convert(v) for n, convert, v in zip(names, converters, values, strict=True)}
            f.write(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n")
    elif out.format == "csv":
        writer = csv.writer(f, lineterminator="\n")
        if out.header:
            writer.writerow(rows.column_names)
        writer.writerows(zip(*_cells(rows, null="", escape=False), strict=True))
    else:
        _write_aligned(rows, out, f)


def _write_aligned(rows: pa.Table, out: Output, f: IO[str]) -> None:
    columns = _cells(rows, null="null", escape=True)
    if out.truncate is not None:
        columns = [[_shorten(c, out.truncate) for c in col] for col in columns]
    names = [_shorten(n, out.truncate) if out.truncate is not None else n for n in rows.column_names]
    numeric = [_is_number(field.type) for field in rows.schema]
    widths = [max([len(n) if out.header else 0, *(len(c) for c in col)]) for n, col in zip(names, columns, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if right else c.ljust(w) for c, w, right in zip(cells, widths, numeric, strict=True)]
        return "  ".join(padded).rstrip()

    if out.header:
        f.write(line(names) + "\n")
        f.write(line(["-" * w for w in widths]) + "\n")
    for cells in zip(*columns, strict=True):
        f.write(line(list(cells)) + "\n")


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + _ELLIPSIS


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _cells(rows: pa.Table, *, null: str, escape: bool) -> list[list[str]]:
    """Every value of every column as text, column by column."""
    out = []
    for field, column in zip(rows.schema, rows.columns, strict=True):
        text = _to_text(field.type, null, escape)
        out.append([text(v) for v in column.to_pylist()])
    return out


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t)


def _to_text(t: pa.DataType, null: str, escape: bool) -> Callable[[Any], str]:
    """A value of type ``t`` (as ``to_pylist`` hands it out) as one cell's text."""
    if pa.types.is_dictionary(t):
        return _to_text(t.value_type, null, escape)
    if _is_nested(t):
        as_json = _to_json(t)
        return lambda v: null if v is None else json.dumps(as_json(v), allow_nan=False, ensure_ascii=False)
    if pa.types.is_floating(t):
        return lambda v: null if v is None else _float_text(v, t)
    if pa.types.is_boolean(t):
        return lambda v: null if v is None else ("true" if v else "false")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: null if v is None else (_escaped(v) if escape else v)
    scalar = _to_json(t)

    def text(v: Any) -> str:
        if v is None:
            return null
        value = scalar(v)
        return value if isinstance(value, str) else str(value)

    return text


_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _escaped(text: str) -> str:
    return text.translate(_ESCAPES)


def _float_text(v: float, t: pa.DataType) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(_shortest(v, t))


def _shortest(v: float, t: pa.DataType) -> float:
    """A 32-bit (or 16-bit) float as the double of its shortest decimal, so it prints as written."""
    if t == pa.float64():
        return v
    return float(str(np.float32(v)))


def _to_json(t: pa.DataType) -> Callable[[Any], Any]:
    """A value of type ``t`` (as ``to_pylist`` hands it out) as a value ``json.dumps`` writes as strict JSON."""
    if pa.types.is_dictionary(t):
        return _to_json(t.value_type)
    if pa.types.is_floating(t):
        return lambda v: None if v is None or not math.isfinite(v) else _shortest(v, t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = _to_json(t.value_type)
        return lambda v: None if v is None else [item(x) for x in v]
    if pa.types.is_struct(t):
        fields = [(f.name, _to_json(f.type)) for f in t]
        return lambda v: None if v is None else {name: conv(v.get(name)) for name, conv in fields}
    if pa.types.is_map(t):
        key, item = _to_json(t.key_type), _to_json(t.item_type)
        return lambda v: None if v is None else [[key(k), item(x)] for k, x in v]
    return _scalar_json


def _scalar_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    return v
