"""Reads of a few rows from only the Parquet pages that hold them.

pyarrow (26) decodes whole column chunks: a top-k search that returns a text
column decoded one row group of text per hit (8,192 rows to keep one). A
superfile is written with the Parquet page index (``write_page_index``), so
each column chunk's *offset index* lists its pages: where each starts, its size
and its first row. This module reads that index and has only the pages holding
the wanted rows decoded, the way Parquet readers with row selection do (arrow-rs
``RowSelection``, parquet-mr's column-index filtering).

pyarrow offers no page reader, but pages carry their own headers, so a run of
consecutive pages of a column chunk is a column chunk too (a chunk's run starts
at its dictionary page when it has one). :meth:`PageReads.read` writes a
footer of a one-column Parquet file whose row groups are those runs, at their
offsets in the superfile, with the column's own schema element (a few lines of
Thrift below), and has pyarrow read the superfile's bytes through it: the
pages are decoded natively and in place, with every encoding, codec and page
version pyarrow reads, in one call per column. Flat columns only (a nested
column's pages need not start at a record). pyarrow exposes neither the offset
index nor the footer's schema bytes, so the Thrift compact protocol is read
here too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ChunkPages", "PageReads"]

# Thrift compact protocol type codes
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# Parquet enums (parquet.thrift), by the names pyarrow's metadata gives
_PHYSICAL = {
    name: i
    for i, name in enumerate(
        ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
    )
}
_CODEC = {"UNCOMPRESSED": 0, "SNAPPY": 1, "GZIP": 2, "LZO": 3, "BROTLI": 4, "LZ4": 5, "ZSTD": 6, "LZ4_RAW": 7}
_ENCODING = {
    "PLAIN": 0,
    "PLAIN_DICTIONARY": 2,
    "RLE": 3,
    "BIT_PACKED": 4,
    "DELTA_BINARY_PACKED": 5,
    "DELTA_LENGTH_BYTE_ARRAY": 6,
    "DELTA_BYTE_ARRAY": 7,
    "RLE_DICTIONARY": 8,
    "BYTE_STREAM_SPLIT": 9,
}
_U32 = struct.Struct("<I")
_MAGIC = b"PAR1"


# -- Thrift compact protocol: reading -----------------------------------------------------------------------------
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


# -- Thrift compact protocol: writing (a footer) -----------------------------------------------------------------
def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Writer:
    """The compact protocol's writing side, for the few structs of a footer."""

    def __init__(self) -> None:
        self.out = bytearray()
        self._last = [0]  # the last field id of each open struct

    def _field(self, fid: int, kind: int) -> None:
        delta = fid - self._last[-1]
        if 0 < delta <= 15:
            self.out.append(delta << 4 | kind)
        else:
            self.out.append(kind)
            self.out += _uvarint(fid << 1 ^ fid >> 63)
        self._last[-1] = fid

    def integer(self, fid: int, value: int, kind: int = _I64) -> None:
        self._field(fid, kind)
        self.out += _uvarint(value << 1 ^ value >> 63)

    def binary(self, fid: int, value: bytes) -> None:
        self._field(fid, _BINARY)
        self.out += _uvarint(len(value)) + value

    def list_of(self, fid: int, kind: int, size: int) -> None:
        """A list header; its items follow (structs between :meth:`begin` and :meth:`end`)."""
        self._field(fid, _LIST)
        self.out += bytes([size << 4 | kind]) if size < 15 else bytes([0xF0 | kind]) + _uvarint(size)

    def items(self, values: list[int]) -> None:
        self.out += b"".join(_uvarint(v << 1 ^ v >> 63) for v in values)

    def begin(self, fid: int | None = None) -> None:
        """A struct: a field of the open struct, or (``fid`` None) a list item."""
        if fid is not None:
            self._field(fid, _STRUCT)
        self._last.append(0)

    def end(self) -> None:
        self.out.append(0)
        self._last.pop()


# -- pages -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPages:
    """One column chunk's pages, from its offset index: file offset and size (header included) of each data
    page, and the first row of each (plus the chunk's row count at the end); its dictionary page, if any."""

    offsets: np.ndarray
    sizes: np.ndarray
    first_rows: np.ndarray  # len(offsets) + 1: the last entry is the row group's row count
    dictionary: tuple[int, int] | None  # (offset, size) of the dictionary page: every read of the chunk needs it
    codec: str  # the chunk's compression, as pyarrow names it
    encodings: tuple[str, ...]
    uncompressed: int  # the chunk's uncompressed size

    def page_of(self, rows: np.ndarray) -> np.ndarray:
        """The page holding each of ``rows`` (row offsets within the row group)."""
        return np.searchsorted(self.first_rows, rows, side="right") - 1

    def decoded_bytes(self, pages: np.ndarray) -> int:
        """About how many bytes decoding ``pages`` costs: their share of the chunk's rows of its uncompressed
        size (sizes in the offset index are compressed), the whole dictionary when there is one."""
        counts = self.first_rows[pages + 1] - self.first_rows[pages]
        share = self.uncompressed * int(counts.sum()) // max(int(self.first_rows[-1]), 1)
        if self.dictionary is None:
            return share
        return share + self.uncompressed * self.dictionary[1] // max(int(self.sizes.sum()) + self.dictionary[1], 1)


@dataclass(frozen=True)
class _Column:
    """What a file of one leaf column's pages needs, found once per reader."""

    element: bytes  # the leaf's SchemaElement, as the footer encodes it
    path: bytes
    physical: int
    arrow: pa.DataType  # the column's type in the superfile


class PageReads:
    """The page-level reads of one Parquet file held in ``buf`` (``ensure`` makes a byte range present in a
    copy still being filled). Thread-safe: what it caches is computed idempotently."""

    def __init__(self, buf: pa.Buffer, metadata: pq.FileMetaData, ensure: Callable[[int, int], None] | None) -> None:
        self._buf = buf
        self._view = memoryview(buf).cast("B")  # unsigned bytes (a pa.Buffer views as signed)
        self._meta = metadata
        self._ensure = ensure
        self._footer: tuple[list[list[tuple[int, int]]], dict[str, bytes]] | None = None
        self._chunks: dict[tuple[int, int], ChunkPages | None] = {}
        self._columns: dict[int, _Column | None] = {}

    def _present(self, offset: int, length: int) -> memoryview:
        if self._ensure is not None:
            self._ensure(offset, length)
        return self._view[offset : offset + length]

    def _parsed_footer(self) -> tuple[list[list[tuple[int, int]]], dict[str, bytes]]:
        """From the file's Thrift footer (pyarrow's metadata exposes neither): (offset, length) of every column
        chunk's offset index ((0, 0) where a chunk has none), per row group; and the encoded SchemaElement of
        each top-level leaf column, by name."""
        if self._footer is None:
            size = len(self._view)
            footer_len = _U32.unpack_from(self._present(size - 8, 4))[0]
            buf = self._present(size - 8 - footer_len, footer_len)
            footer, _ = _struct(buf, 0)
            locations = [[(int(c.get(4, 0)), int(c.get(5, 0))) for c in g.get(1, [])] for g in footer.get(4, [])]
            self._footer = (locations, _top_level_leaves(buf))
        return self._footer

    def column(self, index: int) -> _Column | None:
        """How leaf column ``index`` is read by pages, or None when it is not (a nested column)."""
        if index not in self._columns:
            self._columns[index] = self._column(index)
        return self._columns[index]

    def _column(self, index: int) -> _Column | None:
        leaf = self._meta.schema.column(index)
        if leaf.max_repetition_level != 0 or leaf.max_definition_level > 1 or "." in leaf.path:
            return None
        schema = self._meta.schema.to_arrow_schema()
        element = self._parsed_footer()[1].get(leaf.path)
        if element is None or schema.get_field_index(leaf.path) < 0:
            return None
        arrow = schema.field(leaf.path).type
        column = _Column(element, leaf.path.encode(), _PHYSICAL[leaf.physical_type], arrow)
        # the file of pages has no Arrow schema: pyarrow reads the type the Parquet schema gives, then casts
        read_as = pq.read_metadata(pa.BufferReader(_footer(column, []))).schema.to_arrow_schema().field(0).type
        try:
            pa.array([], read_as).cast(arrow)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return None
        return column

    def chunk(self, group: int, index: int) -> ChunkPages | None:
        """The pages of one column chunk, or None when it cannot be read by pages (no offset index, a nested
        column, a type the Parquet schema alone does not bring back)."""
        key = (group, index)
        if key not in self._chunks:
            self._chunks[key] = self._chunk(group, index)
        return self._chunks[key]

    def _chunk(self, group: int, index: int) -> ChunkPages | None:
        meta = self._meta.row_group(group).column(index)
        if self.column(index) is None or not meta.has_offset_index or meta.compression not in _CODEC:
            return None
        offset, length = self._parsed_footer()[0][group][index]
        if length <= 0:
            return None
        index_struct, _ = _struct(self._present(offset, length), 0)
        locations = index_struct.get(1, [])
        if not locations:
            return None
        offsets = np.array([loc[1] for loc in locations], np.int64)
        sizes = np.array([loc[2] for loc in locations], np.int64)
        first = np.array([loc[3] for loc in locations] + [self._meta.row_group(group).num_rows], np.int64)
        dictionary = None
        if meta.has_dictionary_page and meta.dictionary_page_offset is not None:
            dictionary = (meta.dictionary_page_offset, int(offsets[0]) - meta.dictionary_page_offset)
        encodings = tuple(meta.encodings)
        return ChunkPages(offsets, sizes, first, dictionary, meta.compression, encodings, meta.total_uncompressed_size)

    def read(self, groups: np.ndarray, rows: np.ndarray, index: int) -> pa.Array:
        """Leaf column ``index`` at the given rows, as pyarrow would read it, in the given order: ``groups`` and
        ``rows`` name each row's row group and its offset within it; every chunk named must be page-readable
        (:meth:`chunk`)."""
        column = self.column(index)
        assert column is not None
        runs: list[_Run] = []
        at = np.empty(len(rows), np.int64)  # each wanted row's place among the rows of the runs
        base = 0
        for group in np.unique(groups).tolist():
            pages = self.chunk(group, index)
            assert pages is not None
            chosen = np.flatnonzero(groups == group)
            which = pages.page_of(rows[chosen])
            kept = np.unique(which)
            if pages.dictionary is not None:  # a run must start at the dictionary: from the first page on
                kept = np.arange(int(kept[-1]) + 1)
            counts = pages.first_rows[kept + 1] - pages.first_rows[kept]
            starts = base + np.concatenate(([0], np.cumsum(counts)[:-1]))
            at[chosen] = starts[np.searchsorted(kept, which)] + rows[chosen] - pages.first_rows[which]
            cut = np.flatnonzero(np.diff(kept) != 1) + 1  # runs of consecutive pages
            firsts, lasts = kept[np.r_[0, cut]].tolist(), kept[np.r_[cut - 1, len(kept) - 1]].tolist()
            for first, last in zip(firsts, lasts, strict=True):
                run = _Run.of(pages, first, last)
                self._present(run.start, run.size)
                runs.append(run)
            base += int(counts.sum())
        metadata = pq.read_metadata(pa.BufferReader(_footer(column, runs)))
        table = pq.ParquetFile(pa.BufferReader(self._buf), metadata=metadata).read(use_threads=False)
        out = table.column(0).take(at).combine_chunks()
        return out if out.type == column.arrow else out.cast(column.arrow)


@dataclass(frozen=True)
class _Run:
    """Consecutive pages of one column chunk, read in place as a column chunk of their own (a row group of the
    footer :func:`_footer` writes): from ``start``, ``size`` bytes holding ``rows`` rows."""

    pages: ChunkPages
    start: int  # the dictionary page's offset when the chunk has one (the run then starts at the first page)
    data: int  # the first data page's offset
    size: int
    rows: int

    @classmethod
    def of(cls, pages: ChunkPages, first: int, last: int) -> _Run:
        data = int(pages.offsets[first])
        start = data if pages.dictionary is None else pages.dictionary[0]
        end = int(pages.offsets[last] + pages.sizes[last])
        return cls(pages, start, data, end - start, int(pages.first_rows[last + 1] - pages.first_rows[first]))


def _top_level_leaves(footer: memoryview) -> dict[str, bytes]:
    """The encoded SchemaElement of each leaf directly under the root, by name, from a FileMetaData."""
    pos, last = 0, 0
    while footer[pos]:
        head = footer[pos]
        pos += 1
        delta, kind = head >> 4, head & 0x0F
        if delta:
            last += delta
        else:
            n, pos = _varint(footer, pos)
            last = _zigzag(n)
        if last != 2:  # not the schema
            _, pos = _value(footer, pos, kind)
            continue
        head = footer[pos]
        pos += 1
        size = head >> 4
        if size == 15:
            size, pos = _varint(footer, pos)
        elements = []
        for _ in range(size):
            fields, end = _struct(footer, pos)
            elements.append((fields, bytes(footer[pos:end])))
            pos = end
        leaves: dict[str, bytes] = {}
        i = 1  # the root first, then its children depth first
        while i < len(elements):
            fields, raw = elements[i]
            if fields.get(5):  # a group: skip its subtree
                i = _after_subtree(elements, i)
                continue
            leaves[bytes(fields[4]).decode()] = raw
            i += 1
        return leaves
    return {}


def _after_subtree(elements: list[tuple[dict[int, Any], bytes]], i: int) -> int:
    """The index past the subtree of the schema element at ``i`` (depth-first order)."""
    left = 1
    while left:
        left += int(elements[i][0].get(5, 0)) - 1
        i += 1
    return i


def _footer(column: _Column, runs: list[_Run]) -> bytes:
    """A Parquet file's footer (magic bytes around it) for one column whose row groups are ``runs``, at their
    offsets in the superfile: read with this footer, the superfile's bytes give only those pages."""
    w = _Writer()
    w.integer(1, 1, _I32)  # version
    w.list_of(2, _STRUCT, 2)  # schema: the root, then the leaf as the superfile's footer has it
    w.begin()
    w.binary(4, b"schema")
    w.integer(5, 1, _I32)
    w.end()
    w.out += column.element
    w.integer(3, sum(run.rows for run in runs))
    w.list_of(4, _STRUCT, len(runs))
    for run in runs:
        w.begin()  # RowGroup
        w.list_of(1, _STRUCT, 1)
        w.begin()  # ColumnChunk
        w.integer(2, run.start)  # file_offset
        w.begin(3)  # ColumnMetaData
        w.integer(1, column.physical, _I32)
        encodings = [_ENCODING[e] for e in run.pages.encodings if e in _ENCODING]
        w.list_of(2, _I32, len(encodings))
        w.items(encodings)
        w.list_of(3, _BINARY, 1)
        w.out += _uvarint(len(column.path)) + column.path
        w.integer(4, _CODEC[run.pages.codec], _I32)
        w.integer(5, run.rows)  # num_values: a flat column has one per row, nulls included
        w.integer(6, run.size)  # total_uncompressed_size: unknown without the headers, which size the reads
        w.integer(7, run.size)  # total_compressed_size
        w.integer(9, run.data)  # data_page_offset
        if run.start != run.data:
            w.integer(11, run.start)  # dictionary_page_offset
        w.end()
        w.end()
        w.integer(2, run.size)  # total_byte_size
        w.integer(3, run.rows)
        w.end()
    w.out.append(0)
    return _MAGIC + bytes(w.out) + _U32.pack(len(w.out)) + _MAGIC
