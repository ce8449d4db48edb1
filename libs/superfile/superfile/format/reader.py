"""Reading a superfile: checksums on open, Parquet columns by row offset, index blobs as zero-copy views."""

from __future__ import annotations

import functools
import os
import re
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from superfile.errors import CorruptSuperfileError, UnknownColumnError
from superfile.format.fulltext import FullTextIndex
from superfile.format.layout import (
    IDS_SECTION,
    Section,
    check_footer,
    footer_bounds,
    fts_section,
    idx_section,
    parse_directory,
    vec_section,
)
from superfile.format.pages import PageReads
from superfile.format.scalar_index import ScalarIndex
from superfile.format.vector_index import VectorIndex

__all__ = [
    "DEFAULT_CACHE_DIR",
    "FOOTER_FACTOR",
    "READER_OVERHEAD",
    "READ_WHOLE_BYTES",
    "SuperfileReader",
    "extraction_dir",
]

DEFAULT_CACHE_DIR = os.path.join(tempfile.gettempdir(), "superfile-cache")
# A local superfile up to this size is read into memory rather than mapped: a mapping costs a page and an entry
# in the process's map table (``vm.max_map_count``), which a table of many small (level-0) superfiles would fill.
READ_WHOLE_BYTES = 64 * 1024
# What an open reader holds besides its bytes: the decoded Parquet metadata, the section directory and their
# Python objects. Measured (RSS over 10,000 and 1,000 open level-0 readers, 3 and 14 columns): 21.9 KiB a
# reader with a 1.6 KiB footer, 48.4 KiB with a 4.7 KiB one, so ~8 KiB plus ~9 bytes per footer byte.
READER_OVERHEAD = 8 * 1024
FOOTER_FACTOR = 9
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SuperfileReader:
    """An opened, checked superfile. Thread-safe; indexes are opened once per reader and cached."""

    def __init__(
        self,
        name: str,
        buf: pa.Buffer,
        metadata: pq.FileMetaData,
        directory: dict[str, Any],
        sections: dict[str, Section],
        cache_dir: str,
        ensure: Callable[[int, int], None] | None = None,
        handles: int = 0,
    ) -> None:
        self.name = name
        self._buf = buf
        self._handles = handles  # file descriptors and mappings ``buf`` keeps open
        self._extracted_files = 0  # files of the full-text indexes opened (tantivy maps each one)
        # called with the reader when it opens an index, so that its cache weighs it again
        self.on_grow: Callable[[SuperfileReader], None] | None = None
        self._ensure = ensure  # makes a byte range of ``buf`` present before it is read (a copy still arriving)
        self._pq_meta = metadata
        self.metadata = directory
        self.sections = sections
        self.num_rows: int = metadata.num_rows
        self.footer_crc32 = sections["footer"].crc32
        self._schema = metadata.schema.to_arrow_schema()  # kept: ~4 us to build again for every read
        self.columns: list[str] = list(self._schema.names)
        self._cache_dir = cache_dir
        self._leaves: dict[str, list[int]] = {}  # top-level column -> its Parquet leaf columns
        for i in range(metadata.num_columns):
            self._leaves.setdefault(metadata.schema.column(i).path.split(".")[0], []).append(i)
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self._rg_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        # fts/vec metadata by column (a column may also have an idx/ section, which carries "column" too)
        self._info = {
            str(e.get("column")): e
            for e in directory["sections"]
            if "column" in e and not str(e.get("name", "")).startswith("idx/")
        }
        self._lock = threading.Lock()
        self._pages = PageReads(buf, metadata, ensure)
        self._fulltext: dict[str, FullTextIndex] = {}
        self._vector: dict[str, VectorIndex] = {}
        self._scalar: dict[str, ScalarIndex] = {}

    @classmethod
    def open(
        cls,
        source: str | os.PathLike[str] | bytes | bytearray | memoryview | pa.Buffer,
        *,
        name: str,
        verify: bool = True,
        cache_dir: str | None = None,
        expected_footer_crc32: int | None = None,
        ensure: Callable[[int, int], None] | None = None,
        handles: int | None = None,
    ) -> SuperfileReader:
        """Open a local path (memory-mapped; read into memory up to :data:`READ_WHOLE_BYTES`) or the whole file
        in memory; ``name`` appears in errors. ``handles``: the file descriptors and mappings a given buffer
        keeps open (a Python ``mmap`` keeps both: 2); counted here for a path, 0 for bytes by default.

        ``ensure(offset, length)``, when given, is called before every byte range of ``source`` is read: the
        buffer may be a copy still being filled (a remote superfile read by ranges while it downloads). Only
        the ranges a query needs are then read: the footer here, and later the sections and column chunks
        it uses (with ``verify``, the whole file).

        Structure (magic numbers, footer, section directory) is always checked,
        and so is the footer's own CRC-32: it is small and covers every offset
        we trust. ``verify`` additionally checks the CRC-32 of the data region
        and of every blob (reading the whole file), so that a flipped byte
        anywhere raises :class:`CorruptSuperfileError`. ``expected_footer_crc32``
        (kept by the manifest) is compared with the footer bytes when given.
        """
        held = 0
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as f:
                whole = f.read() if os.fstat(f.fileno()).st_size <= READ_WHOLE_BYTES else None
            if whole is not None:
                buf = pa.py_buffer(whole)
            else:
                buf = pa.memory_map(os.fspath(source), "r").read_buffer()  # the mapping outlives its descriptor
                held = 1
        elif isinstance(source, pa.Buffer):
            buf = source
        else:
            buf = pa.py_buffer(source)
        view = memoryview(buf)
        if ensure is not None:
            size = len(view)
            ensure(0, min(size, 4))  # the leading magic number
            ensure(max(0, size - 8), min(size, 8))  # the footer's length and the trailing magic number
            if size >= 12:
                footer_len = int.from_bytes(view[size - 8 : size - 4], "little")
                ensure(max(0, size - 8 - footer_len), min(size, 8 + footer_len))
            if verify:
                ensure(0, size)
        footer_start = footer_bounds(view, name)
        footer_crc = check_footer(view, footer_start, name)
        if expected_footer_crc32 is not None and footer_crc != expected_footer_crc32:
            raise CorruptSuperfileError(
                name, f"footer crc32 {footer_crc:08x} != {expected_footer_crc32:08x} recorded in the manifest"
            )
        try:
            metadata = pq.read_metadata(pa.BufferReader(buf))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise CorruptSuperfileError(name, f"Parquet footer does not parse: {e}") from None
        num_rows, directory, sections = parse_directory(metadata.metadata, footer_start, name)
        if num_rows != metadata.num_rows:
            raise CorruptSuperfileError(name, f"directory says {num_rows} rows, Parquet footer {metadata.num_rows}")
        if verify:
            for s in sections.values():
                actual = zlib.crc32(view[s.offset : s.offset + s.length])
                if actual != s.crc32:
                    raise CorruptSuperfileError(
                        name, f"section {s.name!r} crc32 {actual:08x} != recorded {s.crc32:08x}"
                    )
        sections["footer"] = Section("footer", "footer", footer_start, len(view) - footer_start, footer_crc)
        return cls(
            name,
            buf,
            metadata,
            directory,
            sections,
            cache_dir or DEFAULT_CACHE_DIR,
            ensure,
            held if handles is None else handles,
        )

    def held(self) -> tuple[int, int]:
        """What this reader holds open: (bytes, file handles). Bytes: its buffer when that is a copy in memory,
        and an estimate of the parsed metadata. A mapped buffer (one that keeps a handle) and the full-text
        files tantivy maps are not charged bytes: their pages are the kernel's page cache, shared and
        reclaimable, and charging them evicted live readers, to be mapped and checked again by the next query,
        once a table outgrew the budget (docs/storage.md). Handles: file descriptors plus mappings (each counts
        against ``ulimit -n`` or ``vm.max_map_count``). Vector and scalar indexes are views of the buffer."""
        overhead = READER_OVERHEAD + FOOTER_FACTOR * self.sections["footer"].length
        in_memory = 0 if self._handles else len(self._buf)
        return in_memory + overhead, self._handles + self._extracted_files

    def blob(self, section: str) -> memoryview:
        """Zero-copy view of one section's bytes."""
        s = self.sections[section]
        if self._ensure is not None:
            self._ensure(s.offset, s.length)
        return memoryview(self._buf)[s.offset : s.offset + s.length]

    def read(
        self, columns: Sequence[str] | None = None, rows: np.ndarray | None = None, *, use_threads: bool = True
    ) -> pa.Table:
        """Parquet columns (default: all), optionally only the given row offsets in the given order.

        Only row groups holding a requested row are decoded, and of a column whose pages holding them are under
        4/5 of those groups' pages, only those pages (``format/pages.py``). ``use_threads=False`` decodes on the
        calling thread only: faster when the caller already reads several superfiles in parallel, and always
        taken for a small file (up to :data:`READ_WHOLE_BYTES`), where handing its few chunks to Arrow's pool
        costs more than decoding them (0.06 against 0.15-0.24 ms a read of a 2-row superfile).
        """
        use_threads = use_threads and len(self._buf) > READ_WHOLE_BYTES
        cols = list(self.columns if columns is None else columns)
        for c in cols:
            if c not in self.columns:
                raise UnknownColumnError(f"{self.name}: no Parquet column {c!r}")
        indices = [i for c in cols for i in self._leaves[c]]
        if rows is None:
            self._ensure_chunks(range(self._pq_meta.num_row_groups), indices)
            return self._parquet().read_all(column_indices=indices, use_threads=use_threads)
        offsets = np.asarray(rows)
        if offsets.ndim != 1 or (offsets.size and not np.issubdtype(offsets.dtype, np.integer)):
            raise TypeError(f"rows must be a 1-d array of integer row offsets, got {offsets.dtype}{offsets.shape}")
        offsets = offsets.astype(np.int64, copy=False)
        if offsets.size == 0:
            return self._schema.empty_table().select(cols)
        if offsets.min() < 0 or offsets.max() >= self.num_rows:
            raise IndexError(f"{self.name}: row offsets must be in [0, {self.num_rows})")
        paged = {c: self._by_pages(self._leaves[c][0], offsets) for c in cols if len(self._leaves[c]) == 1}
        whole = [i for c in cols if paged.get(c) is None for i in self._leaves[c]]
        table: pa.Table | None = None
        if whole:
            group = np.searchsorted(self._rg_starts, offsets, side="right") - 1
            needed = np.unique(group)
            local = offsets - self._rg_starts[group]
            sizes = np.diff(self._rg_starts)[needed]
            base = np.zeros(len(self._rg_starts) - 1, np.int64)
            base[needed] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            self._ensure_chunks(needed.tolist(), whole)
            try:
                table = self._parquet().read_row_groups(needed.tolist(), column_indices=whole, use_threads=use_threads)
                table = table.take(pa.array(base[group] + local))
            except (pa.ArrowInvalid, pa.ArrowIndexError, OSError) as e:  # in memory: the bytes are damaged
                # (a page header that does not parse, or a page decoded into fewer rows than it holds)
                raise CorruptSuperfileError(self.name, f"its row groups do not decode: {e}") from None
            if len(whole) == len(indices):
                return table
        schema = self._schema
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for c in cols:
            array = paged.get(c)
            if array is None:
                assert table is not None  # its leaves were read whole above
                arrays.append(table.column(c))
            else:
                arrays.append(array)
        return pa.Table.from_arrays(
            arrays, schema=pa.schema([schema.field(c) for c in cols]).with_metadata(schema.metadata)
        )

    def _by_pages(self, leaf: int, rows: np.ndarray) -> pa.Array | pa.ChunkedArray | None:
        """Leaf column ``leaf`` at file rows ``rows`` decoded from only the pages holding them, when it can be read
        by pages and that saves decoding (``format/pages.py``); else None."""
        try:
            return self._pages.read(rows, leaf, decode_pool())
        except (ValueError, IndexError, KeyError, TypeError, struct.error, pa.ArrowException) as e:
            column = self._pq_meta.schema.column(leaf).path
            raise CorruptSuperfileError(self.name, f"the pages of column {column!r} do not decode: {e!r}") from None

    def _ensure_chunks(self, row_groups: Iterable[int], columns: list[int]) -> None:
        """Make the column chunks that a read of these row groups and leaf columns decodes present."""
        if self._ensure is None:
            return
        for g in row_groups:
            group = self._pq_meta.row_group(g)
            for c in columns:
                chunk = group.column(c)
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                    start = min(start, chunk.dictionary_page_offset)
                self._ensure(start, chunk.total_compressed_size)

    def _parquet(self) -> ParquetReader:
        """A Parquet reader over the file whose decoded buffers come from :func:`decode_pool`."""
        reader = ParquetReader(memory_pool=decode_pool())
        # the whole file is in memory (mapped or fetched): pre-buffering would only copy column chunks
        reader.open(pa.BufferReader(self._buf), metadata=self._pq_meta, pre_buffer=False)
        return reader

    def fulltext(self, column: str) -> FullTextIndex:
        """The column's full-text index, opened once per reader.

        It is extracted on first use to ``cache_dir/<name>-<footer crc32>/<column>``
        (the footer checksum identifies the file's content) and reused by later
        readers and processes.
        """
        with self._lock:
            index = self._fulltext.get(column)
            if index is None:
                section = self._section(column, fts_section(column))
                path = os.path.join(extraction_dir(self._cache_dir, self.name, self.footer_crc32), _safe(column) or "_")
                tokenizer = str(self._info[column]["tokenizer"])
                index = FullTextIndex.from_blob(self.blob(section.name), path, tokenizer, source=self.name)
                self._fulltext[column] = index
                self._extracted_files += sum(1 for e in os.scandir(path) if e.is_file())
                grew = self.on_grow
            else:
                grew = None
        if grew is not None:
            grew(self)
        return index

    def ids(self, rows: np.ndarray | None = None) -> np.ndarray:
        """``_id`` of the given row offsets (default: all) from the raw id section: no Parquet decode."""
        ids = np.frombuffer(self.blob(IDS_SECTION), dtype="<u8")
        return ids if rows is None else ids[rows]

    def vector_index(self, column: str) -> VectorIndex:
        """The column's vector index over a zero-copy view of its blob."""
        with self._lock:
            index = self._vector.get(column)
            if index is None:
                section = self._section(column, vec_section(column))
                index = VectorIndex.from_buffer(self.blob(section.name))
                self._vector[column] = index
            return index

    def scalar_index(self, column: str) -> ScalarIndex:
        """The column's scalar index (``bitmap`` or ``sorted``) over a zero-copy view of its blob, cached."""
        with self._lock:
            index = self._scalar.get(column)
            if index is None:
                section = self._section(column, idx_section(column))
                index = ScalarIndex(self.blob(section.name), source=self.name)
                self._scalar[column] = index
            return index

    def vectors(self, column: str, rows: np.ndarray | None = None) -> pa.FixedSizeListArray:
        """Vectors of a vector column (all, or the given row offsets in order), decoded from its blob."""
        index = self.vector_index(column)
        dim = int(self._info[column]["dim"])
        offsets = np.arange(index.num_rows) if rows is None else rows
        values = np.ascontiguousarray(index.vectors(offsets), np.float32).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), dim)

    def _section(self, column: str, section: str) -> Section:
        if section not in self.sections:
            raise UnknownColumnError(f"{self.name}: column {column!r} has no {section.split('/')[0]} index")
        return self.sections[section]


_DECAY_MS = 10_000


@functools.cache
def decode_pool() -> pa.MemoryPool:
    """The Arrow memory pool Parquet columns are decoded into: jemalloc when pyarrow has it, else the
    system allocator (``SUPERFILE_DECODE_POOL=default|jemalloc|system|mimalloc`` overrides).

    Why not pyarrow's default (mimalloc 3 in current wheels): it backs fresh pages with transparent huge
    pages, and a scan's buffers, decoded on worker threads and freed on others once the query ends, keep
    landing on new pages that the kernel zeroes 2 MiB at a time. Measured on a 1M-row GROUP BY: ~55% of
    the CPU in ``clear_page``, about 100 ms per query. jemalloc (with a decay, below) reuses its pages.
    That was measured while every SQL query leaked its rows (fixed since), which kept the process growing;
    since the fix the two pools measure the same (``BENCHMARKS.md``, SQL).
    """
    choice = os.environ.get("SUPERFILE_DECODE_POOL", "")
    pools = {
        "default": pa.default_memory_pool,
        "jemalloc": pa.jemalloc_memory_pool,
        "system": pa.system_memory_pool,
        "mimalloc": pa.mimalloc_memory_pool,
    }
    try:
        if choice not in pools:
            # pyarrow sets jemalloc's decay to 0 (every free unmapped at once); keep freed pages for the
            # next query's buffers instead, released after ~10 s idle (jemalloc's own default)
            pa.jemalloc_set_decay_ms(_DECAY_MS)
        return pools.get(choice, pa.jemalloc_memory_pool)()
    except NotImplementedError:
        return pa.system_memory_pool()


def extraction_dir(cache_dir: str, name: str, footer_crc32: int) -> str:
    """Where the full-text indexes of superfile ``name`` are extracted, one directory per column inside: named
    after the file and its footer checksum, which identifies its content."""
    return os.path.join(cache_dir, f"{_safe(name)}-{footer_crc32:08x}")


def _safe(name: str) -> str:
    """A single, safe path component derived from ``name`` (the CRC in the directory name disambiguates)."""
    return _UNSAFE.sub("_", name).strip("._")[-120:]
