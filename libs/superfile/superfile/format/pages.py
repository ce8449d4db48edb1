"""Reads of a few rows from only the Parquet pages that hold them.

pyarrow (26) decodes whole column chunks: a top-k search that returns a text
column decoded one row group of text per hit (8,192 rows to keep one). A
superfile is written with the Parquet page index (``write_page_index``), so
each column chunk's *offset index* lists its pages: where each starts, its size
and its first row. This module reads that index and has only the pages holding
the wanted rows decoded, the way Parquet readers with row selection do (arrow-rs
``RowSelection``, parquet-mr's column-index filtering).

pyarrow exposes neither the offset index nor a page reader, but a data page of
a chunk without a dictionary is self-contained (its header names its encoding,
sizes and value count). So the chosen pages, from any row groups, are laid back
to back as the one column chunk of a small Parquet file in memory, under a
footer written here (the column's own schema element, copied), and pyarrow
decodes them all in one native call: no Python per page or per value, and
every encoding and codec pyarrow reads. The Thrift compact protocol of the
footer and the offset index is read and written by the few lines below.

A column is read by pages when it is a flat top-level leaf without a
dictionary, pyarrow reads its lone schema element back as the column's type (or
a type that casts to it exactly: large strings, a time zone, a duration), and every chunk has
an offset index. Rows under 1/8 of their row groups' are decoded by the compiled page decoder
(``format/page_decode.py``) where it takes the pages, else by pyarrow as above when the pages holding
them are under 4/5 of their row groups' pages; otherwise :meth:`PageReads.read` answers None and the
caller decodes the row groups. See docs/format.md, "Point reads by page".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

__all__ = ["ColumnPages", "PageReads"]

# Thrift compact protocol type codes
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_U32 = struct.Struct("<I")
_MAGIC = b"PAR1"
_DICTIONARY = {2, 8}  # the PLAIN_DICTIONARY and RLE_DICTIONARY encodings
_DELTA_BINARY_PACKED = 5
_UNCOMPRESSED, _LZ4_RAW = 0, 7
_BYTES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
# Pages are read when they are under 4/5 of their row groups' pages, else the groups whole: pyarrow decodes a page
# gathered here in ~1.2x the time of one in a whole chunk (measured: 4 KiB pages of LZ4 text, 2.8-3.0 against
# 2.4 us; of int64, 4.4 against 3.6 us)
_PAGES_OF_WHOLE = 4 / 5
# The compiled decoder (format/page_decode.py) takes rows under 1/8 of their row groups': it decodes each page
# up to its last wanted row, ~1.5 us a 4 KiB page of LZ4 text against pyarrow's 2.5-3, but integers one by
# one, where pyarrow's whole row groups win once a row in ~8 is wanted (measured on 62,500 rows: text 0.04-0.64x
# pyarrow's whole groups at every share; sorted ids 0.16x at 0.1%, 0.89x at 1/7, 2.5x at 1/2; random int64
# 1.2-1.4x from 1% to 1/8; float64 0.26x at 1%, 0.71x at 1/8)
_COMPILED_SHARE = 8


# -- Thrift compact protocol -------------------------------------------------------------------------------------
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
        size, item, pos = _list_head(buf, pos)
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


def _list_head(buf: memoryview, pos: int) -> tuple[int, int, int]:
    """A list's size and item type, and where its items start."""
    head = buf[pos]
    size, item = head >> 4, head & 0x0F
    if size == 15:
        size, pos = _varint(buf, pos + 1)
        return size, item, pos
    return size, item, pos + 1


def _field_head(buf: memoryview, pos: int, last: int) -> tuple[int, int, int]:
    """A struct field's header after field ``last``: its id and type (0, 0 at the struct's stop byte), and where
    its value starts."""
    head = buf[pos]
    if head == 0:
        return 0, 0, pos + 1
    delta, kind = head >> 4, head & 0x0F
    if delta:
        return last + delta, kind, pos + 1
    n, pos = _varint(buf, pos + 1)
    return _zigzag(n), kind, pos


def _struct(buf: memoryview, pos: int) -> tuple[dict[int, Any], int]:
    """A Thrift struct as {field id: value}; nested structs likewise."""
    fields: dict[int, Any] = {}
    field, kind, pos = _field_head(buf, pos, 0)
    while kind:
        fields[field], pos = _value(buf, pos, kind)
        field, kind, pos = _field_head(buf, pos, field)
    return fields, pos


def _schema_leaves(footer: memoryview) -> list[memoryview]:
    """The bytes of each leaf's SchemaElement of a FileMetaData (field 2), in leaf order, to copy into a footer.
    Depth first, the elements with children (``num_children``, field 5) are the root and the groups."""
    field, kind, pos = _field_head(footer, 0, 0)
    while field != 2:
        if not kind:
            raise ValueError("the footer has no schema")
        _, pos = _value(footer, pos, kind)
        field, kind, pos = _field_head(footer, pos, field)
    size, _, pos = _list_head(footer, pos)
    leaves = []
    for _ in range(size):
        element, end = _struct(footer, pos)
        if 5 not in element:
            leaves.append(footer[pos:end])
        pos = end
    return leaves


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode(kind: int, value: Any) -> bytes:
    """One value: an int (i32, i64, as zigzag varints), bytes (binary), (item type, items) (a list), or a struct
    as [(field id, type, value)] or as its encoded bytes."""
    if kind in (_I32, _I64):
        return _uvarint((value << 1) ^ (value >> 63))
    if kind == _BINARY:
        return _uvarint(len(value)) + bytes(value)
    if kind == _LIST:
        item, items = value
        head = bytes([len(items) << 4 | item]) if len(items) < 15 else bytes([0xF0 | item]) + _uvarint(len(items))
        return head + b"".join(_encode(item, v) for v in items)
    if kind == _STRUCT:
        return bytes(value) if isinstance(value, (bytes, memoryview)) else _encode_fields(value) + b"\0"
    raise ValueError(f"Thrift compact type {kind} not written here")


def _encode_fields(fields: list[tuple[int, int, Any]], last: int = 0) -> bytes:
    """A struct's fields after field ``last``, without the stop byte (a struct encoded in parts)."""
    out = bytearray()
    for field, kind, value in fields:
        out += bytes([(field - last) << 4 | kind])  # fields here are in order, at most 15 apart
        out += _encode(kind, value)
        last = field
    return bytes(out)


# -- pages -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnPages:
    """One leaf column's data pages in every row group, in file order, from the offset indexes."""

    offsets: np.ndarray  # file offset of each page, its header included
    sizes: np.ndarray  # bytes of each page, its header included
    first_rows: np.ndarray  # each page's first row (of the file), then the file's row count
    groups: np.ndarray  # each page's row group
    group_pages: np.ndarray  # each row group's count of pages: what decoding it whole decodes
    group_rows: np.ndarray  # each row group's count of rows
    least_group_rows: int  # the fewest rows a row group has
    chunk: bytes  # the leading fields of a chunk of them: type, encodings, path, codec (ColumnMetaData 1-4)
    codec: int  # the chunks' CompressionCodec
    delta: bool  # DELTA_BINARY_PACKED is among the chunks' encodings

    def page_of(self, rows: np.ndarray) -> np.ndarray:
        """The page holding each of ``rows`` (row offsets in the file)."""
        return np.searchsorted(self.first_rows, rows, side="right") - 1


@dataclass(frozen=True)
class _Column:
    """What decoding one leaf column by pages needs, checked once per reader."""

    head: bytes  # the leading fields of a footer of this column alone: version, schema (its element, as here)
    arrow: pa.DataType  # its type as pyarrow reads the whole file
    cast: bool  # pyarrow reads the element alone as another type, which casts to ``arrow`` exactly
    stored: pa.DataType | None  # the values as the compiled decoder gives them (``format/page_decode.py``)
    nullable: bool  # one bit of definition level a row


class PageReads:
    """The page-level reads of one Parquet file held in ``buf`` (``ensure`` makes a byte range present in a
    copy still being filled). Thread-safe: what it caches is computed idempotently."""

    def __init__(self, buf: pa.Buffer, metadata: pq.FileMetaData, ensure: Callable[[int, int], None] | None) -> None:
        self._buf = buf
        self._view = memoryview(buf).cast("B")  # unsigned bytes (a pa.Buffer views as signed)
        self._meta = metadata
        self._ensure = ensure
        self._footer: tuple[dict[int, Any], list[memoryview]] | None = None
        self._columns: dict[int, _Column | None] = {}
        self._pages: dict[int, ColumnPages | None] = {}

    def _present(self, offset: int, length: int) -> memoryview:
        if self._ensure is not None:
            self._ensure(offset, length)
        return self._view[offset : offset + length]

    def _thrift_footer(self) -> tuple[dict[int, Any], list[memoryview]]:
        """The file's Thrift FileMetaData, parsed, and its leaves' schema elements' bytes (pyarrow's metadata
        objects expose neither the offset indexes' locations nor the elements)."""
        if self._footer is None:
            size = len(self._view)
            footer_len = _U32.unpack_from(self._present(size - 8, 4))[0]
            footer = self._present(size - 8 - footer_len, footer_len)
            self._footer = (_struct(footer, 0)[0], _schema_leaves(footer))
        return self._footer

    def column(self, index: int) -> _Column | None:
        """How leaf column ``index`` decodes by pages, or None when it does not."""
        if index not in self._columns:
            self._columns[index] = self._column(index)
        return self._columns[index]

    def _column(self, index: int) -> _Column | None:
        leaf = self._meta.schema.column(index)
        if leaf.max_repetition_level != 0 or leaf.max_definition_level > 1 or "." in leaf.path:
            return None
        schema = self._meta.schema.to_arrow_schema()
        if schema.get_field_index(leaf.path) < 0:
            return None
        arrow = schema.field(leaf.path).type
        root = [(4, _BINARY, b"schema"), (5, _I32, 1)]
        head = _encode_fields([(1, _I32, 1), (2, _LIST, (_STRUCT, [root, self._thrift_footer()[1][index]]))])
        alone = pq.read_schema(pa.BufferReader(_MAGIC + _footer(head, None, 0, 0))).field(0).type
        stored = _stored(leaf.physical_type, arrow)
        nullable = leaf.max_definition_level == 1
        if alone == arrow:
            return _Column(head, arrow, cast=False, stored=stored, nullable=nullable)
        exact = (
            (alone, arrow) in ((pa.string(), pa.large_string()), (pa.binary(), pa.large_binary()))
            or (pa.types.is_timestamp(alone) and pa.types.is_timestamp(arrow) and alone.unit == arrow.unit)
            or (alone == pa.int64() and pa.types.is_duration(arrow))  # a duration is stored as its int64
        )
        return _Column(head, arrow, cast=True, stored=stored, nullable=nullable) if exact else None

    def pages(self, index: int) -> ColumnPages | None:
        """The data pages of leaf column ``index`` in every row group, or None when a chunk has a dictionary or
        no offset index, or the chunks differ in codec."""
        if index not in self._pages:
            self._pages[index] = self._column_pages(index)
        return self._pages[index]

    def _column_pages(self, index: int) -> ColumnPages | None:
        footer, _ = self._thrift_footer()
        offsets: list[int] = []
        sizes: list[int] = []
        first: list[int] = []
        groups: list[int] = []
        kept: tuple[Any, ...] | None = None
        start = 0
        for g, group in enumerate(footer.get(4, [])):
            chunk = group[1][index]
            meta = chunk[3]
            this = (meta[1], tuple(meta[2]), tuple(bytes(p) for p in meta[3]), meta[4])
            dictionary = 11 in meta or not _DICTIONARY.isdisjoint(this[1])
            if dictionary or 4 not in chunk or chunk.get(5, 0) <= 0 or (kept is not None and this[3] != kept[3]):
                return None  # a dictionary, no offset index, or another codec than the other chunks'
            kept = kept or this
            locations = _struct(self._present(int(chunk[4]), int(chunk[5])), 0)[0].get(1, [])
            offsets += [loc[1] for loc in locations]
            sizes += [loc[2] for loc in locations]
            first += [start + loc[3] for loc in locations]
            groups += [g] * len(locations)
            start += int(group[3])
        if kept is None or not offsets:
            return None
        physical, encodings, path, codec = kept
        return ColumnPages(
            offsets=np.array(offsets, np.int64),
            sizes=np.array(sizes, np.int64),
            first_rows=np.array([*first, start], np.int64),
            groups=np.array(groups, np.int64),
            group_pages=np.bincount(groups, minlength=len(footer[4])),
            group_rows=np.array([int(group[3]) for group in footer[4]], np.int64),
            least_group_rows=min(int(group[3]) for group in footer[4]),
            chunk=_encode_fields(
                [
                    (1, _I32, physical),
                    (2, _LIST, (_I32, list(encodings))),
                    (3, _LIST, (_BINARY, list(path))),
                    (4, _I32, codec),
                ]
            ),
            codec=codec,
            delta=_DELTA_BINARY_PACKED in encodings,
        )

    def read(
        self, rows: np.ndarray, index: int, pool: pa.MemoryPool | None = None, *, when_cheaper: bool = True
    ) -> pa.Array | pa.ChunkedArray | None:
        """Leaf column ``index`` at ``rows`` (row offsets in the file; any order, repeats allowed), decoded from
        only the pages holding them: by the compiled decoder when they are under 1/8 of their row groups' rows,
        else by pyarrow into ``pool``. None when the column is not read by pages or (``when_cheaper``) pyarrow
        would decode 4/5 of the row groups' pages or more."""
        column = self.column(index)
        pages = self.pages(index) if column is not None else None
        if column is None or pages is None:
            return None
        ordered = len(rows) < 2 or bool((rows[1:] >= rows[:-1]).all())  # in order, as an index gives them
        few = len(rows) * _COMPILED_SHARE <= pages.least_group_rows  # surely under 1/8 of their groups' rows
        if few:
            compiled = self._compiled(rows, ordered, column, pages)
            if compiled is not None:
                return compiled
        which = pages.page_of(rows)
        if ordered:
            first = _firsts(which)
            chosen, slot = which[first], np.cumsum(first) - 1
        else:
            chosen, slot = np.unique(which, return_inverse=True)
        groups = pages.groups[chosen]  # in order, as ``chosen`` is
        in_groups = groups[_firsts(groups)]
        if not few and len(rows) * _COMPILED_SHARE <= int(pages.group_rows[in_groups].sum()):
            compiled = self._compiled(rows, ordered, column, pages)
            if compiled is not None:
                return compiled
        if when_cheaper and len(chosen) >= _PAGES_OF_WHOLE * int(pages.group_pages[in_groups].sum()):
            return None
        counts = pages.first_rows[chosen + 1] - pages.first_rows[chosen]
        at = (np.cumsum(counts) - counts)[slot] + rows - pages.first_rows[which]  # each row among the chosen pages'
        spans = zip(pages.offsets[chosen].tolist(), pages.sizes[chosen].tolist(), strict=True)
        tail = _footer(column.head, pages.chunk, int(pages.sizes[chosen].sum()), int(counts.sum()))
        data = b"".join([_MAGIC, *(self._present(o, n) for o, n in spans), tail])  # one copy of the pages
        reader = ParquetReader(memory_pool=pool)
        try:
            reader.open(pa.BufferReader(data), pre_buffer=False)
            decoded = reader.read_all(column_indices=[0], use_threads=False).column(0)
        except OSError as e:  # pyarrow's error for a page that does not parse; the bytes are all in memory here
            raise ValueError(str(e)) from None
        values = (decoded.chunk(0) if decoded.num_chunks == 1 else pa.concat_arrays(decoded.chunks)).take(pa.array(at))
        return values.cast(column.arrow) if column.cast else values

    def _compiled(self, rows: np.ndarray, ordered: bool, column: _Column, pages: ColumnPages) -> pa.Array | None:
        """The column at ``rows`` from the compiled decoder (``format/page_decode.py``), or None when it does not
        decode these pages (another codec, encoding or type): pyarrow does then."""
        lz4 = 0
        if column.stored is None or pages.codec not in (_UNCOMPRESSED, _LZ4_RAW):
            return None
        from superfile.format import page_decode  # numba: ~0.2 s to import, paid by a first read of a few rows

        if pages.codec == _LZ4_RAW:
            lz4 = page_decode.LZ4_DECOMPRESS
            if not lz4:
                return None
        at: np.ndarray | None = None
        if len(rows) < 2 or bool((rows[1:] > rows[:-1]).all()):  # in order, no repeats (an index's rows)
            wanted = rows
        elif ordered:
            first = _firsts(rows)
            wanted, at = rows[first], np.cumsum(first) - 1
        else:
            wanted, at = np.unique(rows, return_inverse=True)
        which = pages.page_of(wanted)
        if self._ensure is not None:
            for p in which[_firsts(which)].tolist():
                self._present(int(pages.offsets[p]), int(pages.sizes[p]))
        stored = column.stored
        if stored in _BYTES:
            kind, width = page_decode.BYTES, 0
        else:
            kind, width = page_decode.DELTA if pages.delta else page_decode.FIXED, stored.bit_width // 8
        status, data, starts, valid = page_decode.decode_rows(
            self._buf.address, self._buf.size, pages.offsets, pages.first_rows, wanted, which, kind, width,
            column.nullable, lz4,
        )  # fmt: skip
        if status == page_decode.UNSUPPORTED:
            return None
        if status != page_decode.OK:
            raise ValueError("a data page does not decode")
        n = len(wanted)
        nulls = n - int(np.count_nonzero(valid))
        validity = _buffer(np.packbits(valid, bitorder="little")) if nulls else None
        if kind == page_decode.BYTES:
            large = stored in (pa.large_string(), pa.large_binary())
            offsets = _buffer(starts if large else starts.astype(np.int32))  # a few rows: under 2 GiB
            values = pa.Array.from_buffers(stored, n, [validity, offsets, _buffer(data)], null_count=nulls)
        else:
            values = pa.Array.from_buffers(stored, n, [validity, _buffer(data)], null_count=nulls)
            if column.arrow != stored:  # a narrower integer casts; a type of the same width is a view
                narrower = pa.types.is_integer(column.arrow) and column.arrow.bit_width < stored.bit_width
                values = values.cast(column.arrow) if narrower else values.view(column.arrow)
        return values if at is None else values.take(pa.array(at))


def _buffer(array: np.ndarray) -> pa.Buffer:
    """A zero-copy Arrow buffer over ``array`` (the stubs do not know ndarrays have the buffer protocol)."""
    return pa.py_buffer(cast(Any, array))


def _stored(physical: str, arrow: pa.DataType) -> pa.DataType | None:
    """How the compiled decoder gives a leaf of Parquet type ``physical`` read as ``arrow``: byte arrays as
    ``arrow`` itself, numbers as their Parquet type (an integer or temporal type of that width is a view of
    it, a narrower integer a cast); None for the other types (booleans, decimals, fixed-size binary), which
    pyarrow decodes."""
    if physical == "BYTE_ARRAY":
        return arrow if arrow in _BYTES else None
    numbers: dict[str, pa.DataType] = {
        "INT32": pa.int32(),
        "INT64": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
    }
    stored = numbers.get(physical)
    if stored is None or arrow == stored:
        return stored
    if pa.types.is_integer(arrow) and arrow.bit_width <= stored.bit_width and pa.types.is_integer(stored):
        return stored
    temporal = pa.types.is_timestamp(arrow) or pa.types.is_date32(arrow) or pa.types.is_time(arrow)
    if (temporal or pa.types.is_duration(arrow)) and arrow.bit_width == stored.bit_width:
        return stored
    return None


def _firsts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values of an ordered array starts (a unique without the sort)."""
    return np.concatenate([[True], ordered[1:] != ordered[:-1]])[: len(ordered)]


def _footer(head: bytes, chunk: bytes | None, size: int, rows: int) -> bytes:
    """The footer (with its length and the closing magic) of a Parquet file of one column: ``head`` its leading
    fields (version, schema), ``size`` bytes of pages after the opening magic, ``rows`` rows in one row group
    whose chunk starts with ``chunk`` (type, encodings, path, codec); no row group when ``chunk`` is None."""
    groups = []
    if chunk is not None:
        meta = chunk + _encode_fields(
            [
                (5, _I64, rows),  # num_values: a flat column has one a row, null or not
                (6, _I64, size),  # uncompressed size: not read back; the compressed one bounds the pages
                (7, _I64, size),
                (9, _I64, len(_MAGIC)),  # the first data page's offset
            ],
            last=4,
        )
        column = [(2, _I64, len(_MAGIC)), (3, _STRUCT, meta + b"\0")]
        groups.append([(1, _LIST, (_STRUCT, [column])), (2, _I64, size), (3, _I64, rows)])
    footer = head + _encode_fields([(3, _I64, rows), (4, _LIST, (_STRUCT, groups))], last=2) + b"\0"
    return footer + _U32.pack(len(footer)) + _MAGIC
