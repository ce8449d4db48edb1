"""Point reads: decoding only the Parquet pages that hold the wanted rows.

pyarrow reads whole column chunks: it has no row or page selection. A superfile is therefore written with
the Parquet page index (``write_page_index``) and bounded pages, and carries a *page table* (section
``pages``): for every page of every column chunk its byte range, first row, value count and whether it
is dictionary-encoded, and for every chunk its dictionary page. The writer builds it from the offset index
and the page headers (:func:`build_page_table`), so that readers parse no Thrift to find pages.

To read rows, :class:`PageReader` picks the pages holding them, copies those pages (and a chunk's dictionary
page when a picked page needs it) into a small Parquet file of their own, one row group per row group they
come from, with a footer written here (:mod:`superfile.format.thrift`), and lets pyarrow decode it. The pages
are copied byte for byte, so the decoded values are the stored ones; the row positions come from the page
table. Layout of the section: ``docs/format.md``.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
from pyarrow._parquet import ParquetReader

from superfile.format.thrift import BINARY, I32, LIST, STRUCT, Struct, ThriftError, decode_struct, encode_struct

__all__ = ["PAGES_SECTION", "PageReader", "PageTable", "build_page_table"]

PAGES_SECTION = "pages"
_MAGIC = b"SFPAGES1"
_HEAD = struct.Struct("<8sI")
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_DICTIONARY_ENCODINGS = frozenset({2, 8})  # PLAIN_DICTIONARY, RLE_DICTIONARY
_NEEDS_DICT = 1
# the arrays of the section, in order: (name, dtype, length: "pages" | "chunks" | "leaves+1")
_ARRAYS = (
    ("page_row", "<i8", "pages"),
    ("page_offset", "<i8", "pages"),
    ("page_size", "<i4", "pages"),
    ("page_values", "<i4", "pages"),
    ("page_flags", "u1", "pages"),
    ("dict_offset", "<i8", "chunks"),
    ("dict_size", "<i4", "chunks"),
    ("leaf_start", "<i8", "leaves+1"),
)


def build_page_table(parquet: memoryview, footer: Struct) -> bytes | None:
    """The ``pages`` section of a Parquet file written with the page index: ``parquet`` is the file's bytes
    up to at least its page index, ``footer`` its decoded ``FileMetaData``. None when a column chunk has no
    offset index (nothing to build it from)."""
    groups = [g for g in footer[4][1][1]] if 4 in footer else []
    if not groups:
        return None
    num_leaves = len(groups[0][1][1][1])
    leaves: list[dict[str, Any]] = []
    pages: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(num_leaves)]
    dict_offset = np.full(num_leaves * len(groups), -1, np.int64)
    dict_size = np.zeros(num_leaves * len(groups), np.int32)
    row = 0
    for g, group in enumerate(groups):
        chunks = group[1][1][1]
        if len(chunks) != num_leaves:
            return None
        for leaf, chunk in enumerate(chunks):
            meta = chunk[3][1]
            if 4 not in chunk or 5 not in chunk:
                return None
            if g == 0:
                leaves.append(
                    {
                        "type": meta[1][1],
                        "codec": meta[4][1],
                        "path": [p.decode() for p in meta[3][1][1]],
                        "encodings": set(),
                    }
                )
            leaves[leaf]["encodings"].update(meta[2][1][1])
            index, _ = decode_struct(parquet, chunk[4][1])
            for location in index[1][1][1]:
                offset, size, first = location[1][1], location[2][1], location[3][1]
                header, _ = decode_struct(parquet, offset)
                kind = header[1][1]
                if kind == _DATA_PAGE:
                    page = header[5][1]
                    values, encoding = page[1][1], page[2][1]
                elif kind == _DATA_PAGE_V2:
                    page = header[8][1]
                    values, encoding = page[1][1], page[4][1]
                else:
                    raise ThriftError(f"offset index points at a page of type {kind}")
                flags = _NEEDS_DICT if encoding in _DICTIONARY_ENCODINGS else 0
                pages[leaf].append((row + first, offset, size, values, flags))
            if 11 in meta:  # the dictionary page: its header says how long it is
                at = meta[11][1]
                header, end = decode_struct(parquet, at)
                if header[1][1] != _DICTIONARY_PAGE:
                    raise ThriftError(f"dictionary_page_offset points at a page of type {header[1][1]}")
                dict_offset[leaf * len(groups) + g] = at
                dict_size[leaf * len(groups) + g] = end - at + header[3][1]
        row += group[3][1]
    starts = np.zeros(num_leaves + 1, np.int64)
    starts[1:] = np.cumsum([len(p) for p in pages])
    flat = [p for leaf_pages in pages for p in leaf_pages]
    cols = np.array(flat, dtype=np.int64).reshape(-1, 5) if flat else np.zeros((0, 5), np.int64)
    arrays = {
        "page_row": cols[:, 0],
        "page_offset": cols[:, 1],
        "page_size": cols[:, 2],
        "page_values": cols[:, 3],
        "page_flags": cols[:, 4],
        "dict_offset": dict_offset,
        "dict_size": dict_size,
        "leaf_start": starts,
    }
    head = {
        "row_groups": len(groups),
        "pages": len(flat),
        "leaves": [{**leaf, "encodings": sorted(leaf["encodings"])} for leaf in leaves],
    }
    meta_json = json.dumps(head, separators=(",", ":")).encode()
    out = bytearray(_HEAD.pack(_MAGIC, len(meta_json)) + meta_json)
    for name, dtype, _ in _ARRAYS:
        out += b"\0" * (-len(out) % 8)
        out += np.ascontiguousarray(arrays[name], dtype=dtype).tobytes()
    return bytes(out)


@dataclass(frozen=True)
class PageTable:
    """The decoded ``pages`` section: per leaf column, its pages in row order (row-group-major)."""

    row_groups: int
    leaves: list[dict[str, Any]]
    page_row: np.ndarray  # absolute first row of each page
    page_offset: np.ndarray
    page_size: np.ndarray  # header and compressed data
    page_values: np.ndarray  # values (level entries) of each page, as its header says
    page_flags: np.ndarray
    dict_offset: np.ndarray  # per (leaf, row group), leaf-major; -1: no dictionary page
    dict_size: np.ndarray
    leaf_start: np.ndarray  # leaf i's pages are [leaf_start[i], leaf_start[i + 1])

    @classmethod
    def parse(cls, blob: memoryview, num_row_groups: int, num_leaves: int) -> PageTable:
        """Raises ``ValueError`` when the section is damaged or does not describe this file's shape."""
        if len(blob) < _HEAD.size:
            raise ValueError("page table shorter than its header")
        magic, n = _HEAD.unpack_from(blob)
        if magic != _MAGIC:
            raise ValueError(f"page table has magic {bytes(magic)!r}")
        head = json.loads(bytes(blob[_HEAD.size : _HEAD.size + n]))
        pos = _HEAD.size + n
        num_pages = int(head["pages"])
        if int(head["row_groups"]) != num_row_groups or len(head["leaves"]) != num_leaves:
            raise ValueError("page table does not match the Parquet footer's row groups and columns")
        lengths = {"pages": num_pages, "chunks": num_leaves * num_row_groups, "leaves+1": num_leaves + 1}
        arrays: dict[str, np.ndarray] = {}
        for name, dtype, length in _ARRAYS:
            pos += -pos % 8
            count = lengths[length]
            size = np.dtype(dtype).itemsize * count
            if pos + size > len(blob):
                raise ValueError("page table truncated")
            arrays[name] = np.frombuffer(blob[pos : pos + size], dtype=dtype)
            pos += size
        starts = arrays["leaf_start"]
        if starts[0] != 0 or starts[-1] != num_pages or np.any(np.diff(starts) < 0):
            raise ValueError("page table's leaf starts do not tile its pages")
        return cls(num_row_groups, list(head["leaves"]), **arrays)


@dataclass(frozen=True)
class _Leaf:
    """One leaf column's pages, ready for selection."""

    first: int  # index of its first page in the table's arrays
    rows: np.ndarray  # absolute first row of each page (ascending)
    counts: np.ndarray  # rows of each page
    groups: np.ndarray  # row group of each page
    meta_prefix: bytes  # ColumnMetaData fields 1-4 (type, encodings, path, codec), Thrift compact, no stop


@dataclass(frozen=True)
class _Column:
    """The parts of a one-column Parquet file's footer that do not depend on the pages picked."""

    head: bytes  # FileMetaData fields 1-2 (version, schema), no stop
    tail: bytes  # fields 5-6 (ARROW:schema, created_by) and the stop, encoded as following field 4


class PageReader:
    """Reads rows of one-leaf columns by decoding only the pages that hold them. Thread-safe: the lazily
    built per-leaf and per-column parts are immutable and replaced whole."""

    def __init__(
        self,
        buf: memoryview,
        table: PageTable,
        footer: memoryview,
        arrow_schema: pa.Schema,
        rg_starts: np.ndarray,
        created_by: str | None,
        pool: pa.MemoryPool,
    ) -> None:
        self._buf = buf
        self._table = table
        self._schema = arrow_schema
        self._rg_starts = rg_starts
        self._created_by = created_by
        self._pool = pool
        head, _ = decode_struct(footer, until=2)  # version and schema: the row groups are not needed
        self._version = head[1][1] if 1 in head else 1
        elements: list[Struct] = head[2][1][1]
        self._root = elements[0]
        self._subtrees: dict[str, list[Struct]] = {}
        at = 1
        while at < len(elements):
            end = _subtree_end(elements, at)
            self._subtrees[elements[at][4][1].decode()] = elements[at:end]
            at = end
        self._leaves: dict[int, _Leaf] = {}
        self._columns: dict[str, _Column] = {}

    def supports(self, column: str, leaves: list[int]) -> bool:
        """Whether ``column`` (its leaf columns ``leaves``) can be read by pages: a single leaf."""
        return len(leaves) == 1 and column in self._subtrees and column in self._schema.names

    def plan(self, leaf: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(page of each offset, the distinct pages, their bytes with the dictionary pages they need, the bytes
        of the whole column chunks holding them): what a read of these offsets by pages would copy and decode."""
        lf = self._leaf(leaf)
        t = self._table
        page = np.searchsorted(lf.rows, offsets, side="right") - 1
        picked = np.unique(page)
        ids = lf.first + picked
        groups = lf.groups[picked]
        chunk = leaf * t.row_groups + groups
        dicts = np.unique(chunk[(t.page_flags[ids] & _NEEDS_DICT) != 0])
        cost = int(t.page_size[ids].sum()) + int(t.dict_size[dicts].sum())
        held = np.unique(groups)
        whole = int(t.page_size[lf.first : lf.first + len(lf.rows)][np.isin(lf.groups, held)].sum())
        whole += int(t.dict_size[leaf * t.row_groups + held].sum())
        return page, picked, cost, whole

    def ranges(self, leaf: int, picked: np.ndarray) -> list[tuple[int, int]]:
        """The byte ranges (offset, length) a read of these pages copies: runs of adjacent pages, and each
        dictionary page needed."""
        t = self._table
        lf = self._leaf(leaf)
        ids = lf.first + picked
        offs, sizes = t.page_offset[ids], t.page_size[ids].astype(np.int64)
        out: list[tuple[int, int]] = []
        for a, b in _runs(offs, sizes):
            out.append((a, b - a))
        chunk = leaf * t.row_groups + lf.groups[picked]
        for c in np.unique(chunk[(t.page_flags[ids] & _NEEDS_DICT) != 0]).tolist():
            out.append((int(t.dict_offset[c]), int(t.dict_size[c])))
        return out

    def read(self, column: str, leaf: int, offsets: np.ndarray, page: np.ndarray, picked: np.ndarray) -> pa.Array:
        """Values of ``column`` at ``offsets`` (any order, repeats allowed), decoded from the ``picked`` pages
        (see :meth:`plan`)."""
        t = self._table
        lf = self._leaf(leaf)
        col = self._column(column)
        ids = lf.first + picked
        offs = t.page_offset[ids].tolist()
        sizes = t.page_size[ids].tolist()
        values = t.page_values[ids].tolist()
        needs = ((t.page_flags[ids] & _NEEDS_DICT) != 0).tolist()
        counts = lf.counts[picked]
        rows = counts.tolist()
        groups = lf.groups[picked].tolist()
        buf = self._buf
        out = bytearray(b"PAR1")
        row_groups = bytearray()
        n = len(ids)
        i = 0
        n_groups = 0
        while i < n:
            g = groups[i]
            j = i
            while j < n and groups[j] == g:
                j += 1
            chunk_start = len(out)
            dict_at = -1
            if any(needs[i:j]):
                c = leaf * t.row_groups + g
                at, size = int(t.dict_offset[c]), int(t.dict_size[c])
                if at < 0:
                    raise ValueError(f"column {column!r}: a dictionary-encoded page in a chunk without dictionary")
                dict_at = len(out)
                out += buf[at : at + size]
            data_at = len(out)
            run_start = offs[i]
            run_end = run_start + sizes[i]
            for k in range(i + 1, j):  # adjacent pages are one copy
                if offs[k] != run_end:
                    out += buf[run_start:run_end]
                    run_start = offs[k]
                run_end = offs[k] + sizes[k]
            out += buf[run_start:run_end]
            length = len(out) - chunk_start
            meta = bytearray(lf.meta_prefix)
            meta += b"\x16" + _varint(2 * sum(values[i:j]))  # 5 num_values
            meta += b"\x16" + _varint(2 * length)  # 6 total_uncompressed_size (only its presence matters)
            meta += b"\x16" + _varint(2 * length)  # 7 total_compressed_size
            meta += b"\x26" + _varint(2 * data_at)  # 9 data_page_offset
            if dict_at >= 0:
                meta += b"\x26" + _varint(2 * dict_at)  # 11 dictionary_page_offset
            meta += b"\x00"
            # RowGroup {1: [ColumnChunk {2: file_offset, 3: meta}], 2: total_byte_size, 3: num_rows}
            row_groups += b"\x19\x1c\x26" + _varint(2 * chunk_start) + b"\x1c" + meta + b"\x00"
            row_groups += b"\x16" + _varint(2 * length) + b"\x16" + _varint(2 * sum(rows[i:j])) + b"\x00"
            n_groups += 1
            i = j
        footer = bytearray(col.head)
        footer += b"\x16" + _varint(2 * int(counts.sum()))  # 3 num_rows
        footer += b"\x19" + (bytes([n_groups << 4 | STRUCT]) if n_groups < 15 else b"\xfc" + _varint(n_groups))
        footer += row_groups
        footer += col.tail
        out += footer
        out += len(footer).to_bytes(4, "little") + b"PAR1"
        reader = ParquetReader(memory_pool=self._pool)
        reader.open(pa.BufferReader(pa.py_buffer(out)), pre_buffer=False)
        decoded = reader.read_all(use_threads=False).column(0)
        # each offset's place among the decoded rows: the rows of the picked pages before its page, then its own
        base = np.zeros(len(picked), np.int64)
        np.cumsum(counts[:-1], out=base[1:])
        positions = base[np.searchsorted(picked, page)] + offsets - lf.rows[page]
        array = decoded.chunk(0) if decoded.num_chunks == 1 else pa.concat_arrays(decoded.chunks)
        return cast(pa.Array, array.take(pa.array(positions)))

    def _leaf(self, leaf: int) -> _Leaf:
        lf = self._leaves.get(leaf)
        if lf is None:
            t = self._table
            a, b = int(t.leaf_start[leaf]), int(t.leaf_start[leaf + 1])
            rows = t.page_row[a:b]
            counts = np.diff(np.append(rows, self._rg_starts[-1]))
            groups = np.searchsorted(self._rg_starts, rows, side="right") - 1
            info = t.leaves[leaf]
            prefix = encode_struct(
                {
                    1: (I32, int(info["type"])),
                    2: (LIST, (I32, [int(e) for e in info["encodings"]])),
                    3: (LIST, (BINARY, [str(p).encode() for p in info["path"]])),
                    4: (I32, int(info["codec"])),
                }
            )[:-1]
            lf = _Leaf(a, rows, counts, groups, prefix)
            self._leaves[leaf] = lf
        return lf

    def _column(self, column: str) -> _Column:
        col = self._columns.get(column)
        if col is None:
            root = dict(self._root)
            root[5] = (I32, 1)
            head = encode_struct({1: (I32, self._version), 2: (LIST, (STRUCT, [root, *self._subtrees[column]]))})
            arrow = base64.b64encode(pa.schema([self._schema.field(column)]).serialize().to_pybytes())
            rest: Struct = {
                4: (LIST, (STRUCT, [])),
                5: (LIST, (STRUCT, [{1: (BINARY, b"ARROW:schema"), 2: (BINARY, arrow)}])),
            }
            if self._created_by:
                rest[6] = (BINARY, self._created_by.encode())
            tail = encode_struct(rest)[2:]  # drop field 4's header and its empty list: fields 5-6 follow field 4
            col = _Column(head[:-1], tail)
            self._columns[column] = col
        return col


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _runs(offsets: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of adjacent byte ranges (ranges in ascending order)."""
    if not len(offsets):
        return []
    ends = offsets + sizes
    breaks = np.flatnonzero(offsets[1:] != ends[:-1]) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(offsets)]]) - 1
    return list(zip(offsets[starts].tolist(), ends[stops].tolist(), strict=True))


def _subtree_end(elements: list[Struct], at: int) -> int:
    """One past the last schema element of the subtree rooted at ``elements[at]`` (depth-first order)."""
    pending = 1
    while pending:
        if at >= len(elements):
            raise ThriftError("schema elements end inside a group")
        pending += (elements[at][5][1] if 5 in elements[at] else 0) - 1
        at += 1
    return at
