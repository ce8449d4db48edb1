"""Thrift compact protocol, generically: what Parquet's footer, page headers and page index are written in.

pyarrow exposes neither the offset index nor a way to change a written footer, so :mod:`superfile.format.pages`
reads and writes those structures itself. A struct decodes to ``{field id: (compact type, value)}`` and a
list to ``(element type, [values])``, so that anything decoded encodes back to the same bytes, fields this
module knows nothing about included.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = [
    "BINARY",
    "BOOL",
    "I32",
    "I64",
    "LIST",
    "STRUCT",
    "Struct",
    "ThriftError",
    "decode_struct",
    "encode_struct",
]

# compact protocol types (BOOL stands for both TRUE=1 and FALSE=2 in field headers)
BOOL, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
_FALSE = 2
_MAX_DEPTH = 64
_DOUBLE = struct.Struct("<d")

Struct = dict[int, tuple[int, Any]]


class ThriftError(ValueError):
    """Bytes that are not the Thrift compact encoding expected (truncated, an unknown type, too deep)."""


def decode_struct(buf: bytes | memoryview, pos: int = 0, *, until: int | None = None) -> tuple[Struct, int]:
    """The struct encoded at ``buf[pos:]`` and the offset just after it. With ``until``, decoding stops
    after the first field whose id is at least ``until`` (a prefix of a long struct, such as a footer's
    schema without its row groups); the offset returned is then where it stopped."""
    if isinstance(buf, memoryview) and buf.format != "B":
        buf = buf.cast("B")  # a pyarrow buffer's view indexes as signed bytes
    try:
        return _struct(buf, pos, 0, until)
    except (IndexError, struct.error):
        raise ThriftError(f"truncated Thrift struct at offset {pos}") from None


def encode_struct(value: Struct) -> bytes:
    out = bytearray()
    _write_struct(out, value)
    return bytes(out)


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ThriftError("varint longer than 10 bytes")


def _zigzag(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    n, pos = _varint(data, pos)
    return (n >> 1) ^ -(n & 1), pos


def _value(data: bytes | memoryview, pos: int, ctype: int, depth: int) -> tuple[Any, int]:
    if ctype in (I16, I32, I64):
        return _zigzag(data, pos)
    if ctype == BINARY:
        n, pos = _varint(data, pos)
        end = pos + n
        if end > len(data):
            raise ThriftError(f"binary of {n} bytes runs past the end")
        return bytes(data[pos:end]), end
    if ctype == STRUCT:
        return _struct(data, pos, depth + 1)
    if ctype in (LIST, SET):
        head = data[pos]
        pos += 1
        size, etype = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(data, pos)
        items = []
        for _ in range(size):
            if etype in (BOOL, _FALSE):
                items.append(data[pos] == BOOL)  # collections hold bools as one byte each: 1 true, 2 false
                pos += 1
            else:
                item, pos = _value(data, pos, etype, depth + 1)
                items.append(item)
        return (etype if etype != _FALSE else BOOL, items), pos
    if ctype == BYTE:
        b = data[pos]
        return (b - 256 if b > 127 else b), pos + 1
    if ctype == DOUBLE:
        return _DOUBLE.unpack_from(data, pos)[0], pos + 8
    if ctype == MAP:
        size, pos = _varint(data, pos)
        if not size:
            return (0, 0, []), pos
        kv = data[pos]
        pos += 1
        ktype, vtype = kv >> 4, kv & 0x0F
        pairs = []
        for _ in range(size):
            k, pos = _value(data, pos, ktype, depth + 1)
            v, pos = _value(data, pos, vtype, depth + 1)
            pairs.append((k, v))
        return (ktype, vtype, pairs), pos
    raise ThriftError(f"unknown Thrift compact type {ctype}")


def _struct(data: bytes | memoryview, pos: int, depth: int, until: int | None = None) -> tuple[Struct, int]:
    if depth > _MAX_DEPTH:
        raise ThriftError("Thrift structs nested too deep")
    out: Struct = {}
    last = 0
    while True:
        head = data[pos]
        pos += 1
        if head == 0:
            return out, pos
        ctype = head & 0x0F
        delta = head >> 4
        if delta:
            fid = last + delta
        else:
            fid, pos = _zigzag(data, pos)
        last = fid
        if ctype in (BOOL, _FALSE):
            out[fid] = (BOOL, ctype == BOOL)
        else:
            value, pos = _value(data, pos, ctype, depth)
            out[fid] = (ctype, value)
        if until is not None and fid >= until:
            return out, pos


def _write_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _write_value(out: bytearray, ctype: int, value: Any) -> None:
    if ctype in (I16, I32, I64):
        _write_varint(out, (value << 1) ^ (value >> 63))
    elif ctype == BINARY:
        _write_varint(out, len(value))
        out += value
    elif ctype == STRUCT:
        _write_struct(out, value)
    elif ctype in (LIST, SET):
        etype, items = value
        size = len(items)
        out.append((size << 4 | etype) if size < 15 else (0xF0 | etype))
        if size >= 15:
            _write_varint(out, size)
        for item in items:
            if etype == BOOL:
                out.append(BOOL if item else _FALSE)
            else:
                _write_value(out, etype, item)
    elif ctype == BYTE:
        out.append(value & 0xFF)
    elif ctype == DOUBLE:
        out += _DOUBLE.pack(value)
    elif ctype == MAP:
        ktype, vtype, pairs = value
        _write_varint(out, len(pairs))
        if pairs:
            out.append(ktype << 4 | vtype)
            for k, v in pairs:
                _write_value(out, ktype, k)
                _write_value(out, vtype, v)
    else:
        raise ThriftError(f"unknown Thrift compact type {ctype}")


def _write_struct(out: bytearray, value: Struct) -> None:
    last = 0
    for fid in sorted(value):
        ctype, v = value[fid]
        wire = (BOOL if v else _FALSE) if ctype == BOOL else ctype
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | wire)
        else:
            out.append(wire)
            _write_varint(out, (fid << 1) ^ (fid >> 63))
        last = fid
        if ctype != BOOL:
            _write_value(out, ctype, v)
    out.append(0)
