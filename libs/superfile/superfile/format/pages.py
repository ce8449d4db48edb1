"""Reads of a few rows from only the Parquet pages that hold them.

pyarrow (26) decodes whole column chunks: a top-k search that returns a text
column decoded one row group of text per hit (8,192 rows to keep one). A
superfile is written with the Parquet page index (``write_page_index``), so
each column chunk's *offset index* lists its pages: where each starts, its size
and its first row. This module reads that index, and decompresses and decodes
only the pages holding the wanted rows, the way Parquet readers with row
selection do (arrow-rs ``RowSelection``, parquet-mr's column-index filtering).

It decodes what the superfile writer produces for such columns: flat columns
(no repetition, at most one definition level), PLAIN values with no dictionary,
data pages v1 and v2, and the codecs pyarrow decompresses. The writer keeps the
dictionary for low-cardinality columns only (``writer._dictionary_columns``),
and those are cheap to decode whole. Any chunk outside that (an older
superfile without the page index included) is not page-readable
(:meth:`PageReads.chunk` answers None) and the caller decodes its row groups.
The Thrift compact protocol is read by the few lines below: pyarrow exposes
neither the offset index nor a page reader.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ChunkPages", "PageReads"]

# Thrift compact protocol type codes
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# Parquet enums (parquet.thrift)
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_PLAIN, _RLE = 0, 3
# Parquet codec (as pyarrow names it) -> pyarrow's codec name; LZ4 (the Hadoop-framed one) is not decoded here
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd", "LZ4_RAW": "lz4_raw"}
_FIXED: dict[str, np.dtype[Any]] = {
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FLOAT": np.dtype("<f4"),
    "DOUBLE": np.dtype("<f8"),
}
_U32 = struct.Struct("<I")
# what each physical type may be read back as (the column's Arrow type, as pyarrow would read it)
_INT32_AS = (pa.int32(), pa.int8(), pa.int16(), pa.uint8(), pa.uint16(), pa.uint32(), pa.date32())
_INT64_AS = (pa.int64(), pa.uint64())
_BYTES_AS = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}


# -- Thrift compact protocol (reading only) --------------------------------------------------------------------
def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf: memoryview, pos: int, kind: int) -> tuple[Any, int]:
    if kind in (_TRUE, _FALSE):  # a bool field carries its value in its type; in a list it is a byte
        return kind == _TRUE, pos
    if kind == _BYTE:
        return buf[pos], pos + 1
    if kind in (_I16, _I32, _I64):
        n, pos = _varint(buf, pos)
        return _zigzag(n), pos
    if kind == _DOUBLE:
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    if kind == _BINARY:
        n, pos = _varint(buf, pos)
        return buf[pos : pos + n], pos + n
    if kind in (_LIST, _SET):
        head = buf[pos]
        pos += 1
        size, item = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            if item in (_TRUE, _FALSE):
                items.append(buf[pos] == 1)
                pos += 1
            else:
                value, pos = _value(buf, pos, item)
                items.append(value)
        return items, pos
    if kind == _MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return {}, pos
        types = buf[pos]
        pos += 1
        out = {}
        for _ in range(size):
            key, pos = _value(buf, pos, types >> 4)
            out[key], pos = _value(buf, pos, types & 0x0F)
        return out, pos
    if kind == _STRUCT:
        return _struct(buf, pos)
    raise ValueError(f"Thrift compact type {kind} unknown")


def _struct(buf: memoryview, pos: int) -> tuple[dict[int, Any], int]:
    """A Thrift struct as {field id: value}; nested structs likewise."""
    fields: dict[int, Any] = {}
    last = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:  # stop
            return fields, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            last += delta
        else:
            n, pos = _varint(buf, pos)
            last = _zigzag(n)
        fields[last], pos = _value(buf, pos, kind)


# -- pages -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPages:
    """One column chunk's data pages, from its offset index: file offset and size (header included) of each
    page, and the first row of each (plus the chunk's row count at the end)."""

    offsets: np.ndarray
    sizes: np.ndarray
    first_rows: np.ndarray  # len(offsets) + 1: the last entry is the row group's row count
    codec: str  # the chunk's compression, as pyarrow names it
    uncompressed: int  # the chunk's uncompressed size

    def page_of(self, rows: np.ndarray) -> np.ndarray:
        """The page holding each of ``rows`` (row offsets within the row group)."""
        return np.searchsorted(self.first_rows, rows, side="right") - 1

    def decoded_bytes(self, pages: np.ndarray) -> int:
        """About how many bytes decoding ``pages`` costs: their share of the chunk's rows of its uncompressed
        size (sizes in the offset index are compressed)."""
        counts = self.first_rows[pages + 1] - self.first_rows[pages]
        return int(self.uncompressed * int(counts.sum()) // max(int(self.first_rows[-1]), 1))


@dataclass(frozen=True)
class _Column:
    """What decoding one leaf column needs, checked once per reader."""

    physical: str
    nullable: bool  # one definition level (an optional top-level column)
    arrow: pa.DataType
    read_as: pa.DataType  # the values as decoded: the physical type, or a view of it with the same bits


class PageReads:
    """The page-level reads of one Parquet file held in ``buf`` (``ensure`` makes a byte range present in a
    copy still being filled). Thread-safe: what it caches is computed idempotently."""

    def __init__(self, buf: pa.Buffer, metadata: pq.FileMetaData, ensure: Callable[[int, int], None] | None) -> None:
        self._view = memoryview(buf).cast("B")  # unsigned bytes (a pa.Buffer views as signed)
        self._meta = metadata
        self._ensure = ensure
        self._locations: list[list[tuple[int, int]]] | None = None  # per row group, per column
        self._chunks: dict[tuple[int, int], ChunkPages | None] = {}
        self._columns: dict[int, _Column | None] = {}

    def _present(self, offset: int, length: int) -> memoryview:
        if self._ensure is not None:
            self._ensure(offset, length)
        return self._view[offset : offset + length]

    def _offset_indexes(self) -> list[list[tuple[int, int]]]:
        """(offset, length) of every column chunk's offset index, from the file's Thrift footer (pyarrow's
        metadata does not expose them); (0, 0) where a chunk has none."""
        if self._locations is None:
            size = len(self._view)
            footer_len = _U32.unpack_from(self._present(size - 8, 4))[0]
            footer, _ = _struct(self._present(size - 8 - footer_len, footer_len), 0)
            self._locations = [
                [(int(c.get(4, 0)), int(c.get(5, 0))) for c in group.get(1, [])] for group in footer.get(4, [])
            ]
        return self._locations

    def column(self, index: int) -> _Column | None:
        """How leaf column ``index`` decodes, or None when this module does not decode it."""
        if index not in self._columns:
            self._columns[index] = self._column(index)
        return self._columns[index]

    def _column(self, index: int) -> _Column | None:
        leaf = self._meta.schema.column(index)
        if leaf.max_repetition_level != 0 or leaf.max_definition_level > 1 or "." in leaf.path:
            return None
        name = leaf.path
        schema = self._meta.schema.to_arrow_schema()
        if schema.get_field_index(name) < 0:
            return None
        arrow = schema.field(name).type
        physical = leaf.physical_type
        read_as = _read_as(physical, arrow, leaf.logical_type.to_json())
        if read_as is None:
            return None
        nullable = leaf.max_definition_level == 1
        return _Column(physical, nullable, arrow, read_as)

    def chunk(self, group: int, index: int) -> ChunkPages | None:
        """The pages of one column chunk, or None when it cannot be read by pages (no offset index, a
        dictionary, an encoding or codec not decoded here, a column type not decoded here)."""
        key = (group, index)
        if key not in self._chunks:
            self._chunks[key] = self._chunk(group, index)
        return self._chunks[key]

    def _chunk(self, group: int, index: int) -> ChunkPages | None:
        meta = self._meta.row_group(group).column(index)
        if (
            self.column(index) is None
            or meta.has_dictionary_page
            or not set(meta.encodings) <= {"PLAIN", "RLE"}
            or (meta.compression != "UNCOMPRESSED" and meta.compression not in _CODECS)
            or not meta.has_offset_index
        ):
            return None
        offset, length = self._offset_indexes()[group][index]
        if length <= 0:
            return None
        index_struct, _ = _struct(self._present(offset, length), 0)
        locations = index_struct.get(1, [])
        if not locations:
            return None
        offsets = np.array([loc[1] for loc in locations], np.int64)
        sizes = np.array([loc[2] for loc in locations], np.int64)
        first = np.array([loc[3] for loc in locations] + [self._meta.row_group(group).num_rows], np.int64)
        return ChunkPages(offsets, sizes, first, meta.compression, meta.total_uncompressed_size)

    def read(self, groups: np.ndarray, rows: np.ndarray, index: int) -> pa.Array:
        """Leaf column ``index`` at the given rows, as pyarrow would read it, in the given order: ``groups`` and
        ``rows`` name each row's row group and its offset within it; every chunk named must be page-readable
        (:meth:`chunk`)."""
        column = self.column(index)
        assert column is not None
        out: list[Any] = [None] * len(rows)
        valid = np.ones(len(rows), bool)
        for group in np.unique(groups).tolist():
            pages = self.chunk(group, index)
            assert pages is not None
            chosen = np.flatnonzero(groups == group)
            which = pages.page_of(rows[chosen])
            for page in np.unique(which).tolist():
                at = chosen[which == page]
                local = rows[at] - pages.first_rows[page]
                offset, size = int(pages.offsets[page]), int(pages.sizes[page])
                values, present = self._page(column, pages.codec, offset, size, local)
                for j, v in zip(at.tolist(), values, strict=True):
                    out[j] = v
                if present is not None:
                    valid[at] = present
        return _array(column, out, valid)

    def _page(
        self, column: _Column, codec: str, offset: int, size: int, local: np.ndarray
    ) -> tuple[list[Any], np.ndarray | None]:
        """Values at ``local`` rows of one page (None where null), and which are present (None: all)."""
        raw = self._present(offset, size)
        header, start = _struct(raw, 0)
        kind = header[1]
        compressed = header[3]
        body = raw[start : start + compressed]
        uncompressed = header[2]
        if kind == _DATA_PAGE:
            page = header[5]
            count, encoding = page[1], page[2]
            data = _decompress(body, codec, uncompressed)
            levels_at = 0
            if column.nullable:
                if page[3] != _RLE:
                    raise ValueError("definition levels not RLE-encoded")
                n = _U32.unpack_from(data, 0)[0]
                levels = _levels(data[4 : 4 + n], count)
                levels_at = 4 + n
            else:
                levels = None
            values = data[levels_at:]
        elif kind == _DATA_PAGE_V2:
            page = header[8]
            count, nulls, encoding = page[1], page[2], page[4]
            def_len, rep_len = page[5], page[6]
            levels = _levels(body[rep_len : rep_len + def_len], count) if column.nullable and nulls else None
            rest = body[rep_len + def_len :]
            is_compressed = page.get(7, True)
            values = _decompress(rest, codec, uncompressed - rep_len - def_len) if is_compressed else rest
        else:
            raise ValueError(f"page type {kind} where a data page was expected")
        if encoding != _PLAIN:
            raise ValueError(f"page encoding {encoding} is not PLAIN")
        if levels is None:
            return _plain(column, values, local, count), None
        present = levels[local] == 1
        slots = np.cumsum(levels, dtype=np.int64) - 1  # a present row's place among the page's values
        found = _plain(column, values, slots[local[present]], int(levels.sum()))
        out: list[Any] = [None] * len(local)
        for j, v in zip(np.flatnonzero(present).tolist(), found, strict=True):
            out[j] = v
        return out, present


def _decompress(body: memoryview, codec: str, size: int) -> memoryview:
    if codec == "UNCOMPRESSED":
        return body
    return memoryview(_codec(codec).decompress(body, size)).cast("B")


@functools.cache
def _codec(name: str) -> pa.Codec:
    return pa.Codec(cast(Any, _CODECS[name]))


def _levels(data: memoryview, count: int) -> np.ndarray:
    """``count`` definition levels of bit width 1 from the RLE / bit-packed hybrid encoding."""
    out = np.empty(count, np.uint8)
    pos = filled = 0
    raw = np.frombuffer(data, np.uint8)
    while filled < count:
        head, pos = _varint(data, pos)
        if head & 1:  # bit-packed: (head >> 1) groups of 8 values, one bit each, least significant first
            nbytes = head >> 1
            bits = np.unpackbits(raw[pos : pos + nbytes], bitorder="little")
            take = min(len(bits), count - filled)
            out[filled : filled + take] = bits[:take]
            pos += nbytes
        else:  # a run of one value, in one byte
            take = min(head >> 1, count - filled)
            out[filled : filled + take] = data[pos]
            pos += 1
        filled += take
    return out


def _plain(column: _Column, data: memoryview, wanted: np.ndarray, count: int) -> list[Any]:
    """PLAIN values at ``wanted`` (indexes among the page's ``count`` values)."""
    if not len(wanted):
        return []
    if column.physical == "BYTE_ARRAY":
        need = sorted(set(wanted.tolist()))
        found: dict[int, bytes] = {}
        pos = 0
        nxt = 0
        for i in range(need[-1] + 1):
            n = _U32.unpack_from(data, pos)[0]
            if i == need[nxt]:
                found[i] = bytes(data[pos + 4 : pos + 4 + n])
                nxt += 1
            pos += 4 + n
        return [found[i] for i in wanted.tolist()]
    if column.physical == "BOOLEAN":
        bits = np.unpackbits(np.frombuffer(data, np.uint8, (count + 7) // 8), bitorder="little")
        return bits[wanted].astype(bool).tolist()
    values = np.frombuffer(data, _FIXED[column.physical], count)
    return list(values[wanted])


def _array(column: _Column, values: list[Any], valid: np.ndarray) -> pa.Array:
    """The decoded values as an Arrow array of the column's type."""
    mask = None if valid.all() else ~valid
    array: pa.Array
    if column.physical == "BYTE_ARRAY":
        array = pa.array(values, pa.binary())
    elif column.physical == "BOOLEAN":
        array = pa.array(values, pa.bool_())
    else:
        dtype = _FIXED[column.physical]
        filled = np.array([0 if v is None else v for v in values], dtype)
        array = pa.array(filled, pa.from_numpy_dtype(dtype), mask=mask)
    if column.read_as != array.type:
        array = array.view(column.read_as) if _same_width(array.type, column.read_as) else array.cast(column.read_as)
    return array if array.type == column.arrow else array.cast(column.arrow)


def _same_width(a: pa.DataType, b: pa.DataType) -> bool:
    return pa.types.is_primitive(a) and pa.types.is_primitive(b) and a.bit_width == b.bit_width


def _read_as(physical: str, arrow: pa.DataType, logical: str) -> pa.DataType | None:
    """The type the decoded values are read as on their way to ``arrow`` (the column's Arrow type), or None
    when this module does not decode that pair. A timestamp is read in its stored unit, then cast."""
    if physical == "INT32" and arrow in _INT32_AS:
        return arrow
    if physical == "INT64" and arrow in _INT64_AS:
        return arrow
    if physical == "INT64" and pa.types.is_timestamp(arrow):
        info = json.loads(logical) if logical else {}
        unit = _UNITS.get(str(info.get("timeUnit", "")))
        if info.get("Type") != "Timestamp" or unit is None:
            return None
        return pa.timestamp(cast(Any, unit), arrow.tz)
    if (physical, arrow) in (("FLOAT", pa.float32()), ("DOUBLE", pa.float64()), ("BOOLEAN", pa.bool_())):
        return arrow
    if physical == "BYTE_ARRAY" and arrow in _BYTES_AS:
        return pa.string() if arrow in (pa.string(), pa.large_string()) else pa.binary()
    return None
