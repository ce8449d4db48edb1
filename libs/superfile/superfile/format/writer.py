"""Building a superfile in one pass: Parquet data, then the index blobs, then the footer.

pyarrow's ``ParquetWriter`` writes column chunks to the sink as row groups
close, and the page index and the footer only on ``close()``. In between we
append the blobs to the same stream and add the section directory as
key/value metadata, so every blob's offset and checksum is known before the
footer is written. The page index's size and checksum, and the footer's own
checksum, are patched in afterwards over fixed-width placeholders.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from superfile.errors import (
    InvalidOptionError,
    InvalidVectorError,
    SchemaMismatchError,
    UnknownColumnError,
    VectorDimensionError,
)
from superfile.format.fulltext import INDEX_OPTION, TOKENIZERS, FullTextBlob, build_fulltext
from superfile.format.layout import (
    CRC_PLACEHOLDER,
    FORMAT,
    IDS_SECTION,
    KEY_FOOTER_CRC,
    KEY_FORMAT,
    KEY_SECTIONS,
    KEY_VERSION,
    PAGE_INDEX_SECTION,
    VERSION,
    BuiltSuperfile,
    Section,
    SuperfileSpec,
    VectorColumnSpec,
    crc_value_offset,
    footer_bounds,
    footer_self_crc,
    fts_section,
    vec_section,
)
from superfile.format.scalar_index import KINDS, prepare_scalar_index
from superfile.format.vector_index import build_vector_blob

__all__ = ["ID_COLUMN", "build_superfile"]

ID_COLUMN = "_id"
_MIN_GROUP_ROWS = 1024  # below this, footers grow (statistics per group and column) for no read benefit
# Parquet data pages of about 4 KiB, the size checked every 64 rows: a read of a few rows decodes only their pages
# (format/pages.py), so a page is what fetching one row costs. Small pages pay off with LZ4 (the default codec),
# whose per-page cost is small; zstd sets up a decoder per page (~10 us), which made small-page scans 3.5x slower.
# Checked every 32 rows instead, pages of ~400-byte texts were 10% larger and scanned 30% slower for no gain in
# narrow texts' point reads (docs/format.md, "Parquet part")
_DATA_PAGE_BYTES = 4 * 1024
_WRITE_BATCH_ROWS = 64
# Section-directory values known only once pyarrow has written the page index: same width as the 20-digit
# numbers that replace them (the footer's length must not change)
_PENDING = {key: f"@{key}@".ljust(20, "@") for key in ("length", "crc32", "blob_region_length")}
_DICTIONARY_SAMPLE_ROWS = 8192  # the values a column's cardinality is judged on (a default row group's worth)


def build_superfile(data: pa.Table, spec: SuperfileSpec, *, work_dir: str | None = None) -> BuiltSuperfile:
    """Write ``data`` as one superfile: Parquet (``_id`` first, vector columns left out) plus one tantivy
    blob per full-text column, one vector blob per vector column and one scalar index (``idx/<column>``)
    per entry of ``spec.scalar_indexes``. Row offset i is document i in every index. Thread-safe: builds
    share no state (``work_dir`` holds temporary index directories).
    """
    _validate(data, spec)
    # a blob is bytes, or a function of its absolute file offset (index blobs align their arrays to it)
    blobs: list[tuple[dict[str, object], bytes | Callable[[int], bytes]]] = []
    terms: dict[str, list[str]] = {}
    fts_stats: dict[str, tuple[int, int]] = {}
    # _id as raw little-endian u64: search results resolve ids with a zero-copy view, no Parquet decode
    ids = np.asarray(data.column(ID_COLUMN).to_numpy(), dtype="<u8")
    for column, tokenizer in spec.fts_columns.items():
        fts: FullTextBlob = build_fulltext(data.column(column), ids, tokenizer, work_dir=work_dir)
        terms[column] = fts.terms
        fts_stats[column] = (fts.num_docs, fts.total_tokens)
        info = {
            "name": fts_section(column),
            "kind": "tantivy",
            "column": column,
            "tokenizer": tokenizer,
            "index_option": INDEX_OPTION,
            "num_docs": fts.num_docs,
            "avg_len": fts.avg_len,
            "total_tokens": fts.total_tokens,
        }
        blobs.append((info, fts.blob))
    for column, vspec in spec.vector_columns.items():
        blobs.append(_vector_blob(data.column(column), column, vspec))
    for column, kind in spec.scalar_indexes.items():
        parts = prepare_scalar_index(data.column(column), kind, column)  # raises before anything is written
        blobs.append((parts.info(), parts.encode))
    blobs.append(({"name": IDS_SECTION, "kind": "u64le"}, ids.tobytes()))

    parquet_columns = [ID_COLUMN] + [c for c in data.column_names if c != ID_COLUMN and c not in spec.vector_columns]
    table = data.select(parquet_columns)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if not k.startswith(b"superfile.")}
    table = table.replace_schema_metadata(meta or None)

    sink = io.BytesIO()
    # every write goes through the one stream pyarrow writes to: it counts the bytes it is given, not the sink's,
    # and records the page index's offsets by that count
    stream = pa.PythonFile(sink, mode="w")
    dictionary = _dictionary_columns(table) if spec.dictionary else []
    try:
        writer = pq.ParquetWriter(
            stream,
            table.schema,
            compression=cast(Any, spec.compression),  # checked by pyarrow
            use_dictionary=cast(Any, dictionary),  # a list is allowed
            column_encoding=_delta_columns(table, dictionary) or None,
            data_page_size=_DATA_PAGE_BYTES,
            write_batch_size=_WRITE_BATCH_ROWS,
            write_page_index=True,  # the offset index: a read of a few rows decodes only their pages
        )
    except (ValueError, pa.ArrowException) as e:
        raise InvalidOptionError(f"cannot write Parquet with compression {spec.compression!r}: {e}") from None
    try:
        writer.write_table(table, row_group_size=_rows_per_group(table, spec))
        data_end = sink.tell()
        with sink.getbuffer() as view:
            data_crc = zlib.crc32(view[:data_end])
        sections = [Section("data", "parquet", 0, data_end, data_crc)]
        entries: list[dict[str, object]] = [_entry(sections[0], {})]
        offset = data_end
        for info, make in blobs:
            blob = make if isinstance(make, bytes) else make(offset)
            s = Section(str(info["name"]), str(info["kind"]), offset, len(blob), zlib.crc32(blob))
            stream.write(blob)
            sections.append(s)
            entries.append(_entry(s, info))
            offset += len(blob)
        blobs.clear()  # the sink holds them now; free the copies before getvalue() below
        # pyarrow writes the page index on close(), after the blobs: its section's size and checksum are known
        # only then, and are patched into the footer over fixed-width placeholders (as the footer's checksum is)
        entries.append(
            {"name": PAGE_INDEX_SECTION, "kind": "parquet-page-index", "offset": offset}
            | {"length": _PENDING["length"], "crc32": _PENDING["crc32"]}
        )
        directory = {
            "num_rows": data.num_rows,
            "data_end": data_end,
            "blob_region_length": _PENDING["blob_region_length"],
            "sections": entries,
        }
        writer.add_key_value_metadata(
            {
                KEY_FORMAT: FORMAT,
                KEY_VERSION: str(VERSION),
                KEY_SECTIONS: json.dumps(directory, separators=(",", ":")),
                KEY_FOOTER_CRC: CRC_PLACEHOLDER.decode(),
            }
        )
    finally:
        writer.close()

    with sink.getbuffer() as view:
        footer_start = footer_bounds(view, "<being built>")
        if footer_start < offset:
            raise RuntimeError(f"pyarrow wrote the footer at {footer_start}, before the blobs' end {offset}")
        footer = view[footer_start:]
        length, crc = footer_start - offset, zlib.crc32(view[offset:footer_start])
        settled = {"length": length, "crc32": crc, "blob_region_length": footer_start - data_end}
        for key, value in settled.items():
            _patch(footer, _PENDING[key], value)
        sections.append(Section(PAGE_INDEX_SECTION, "parquet-page-index", offset, length, crc))
        entries[-1] |= {"length": length, "crc32": crc}
        directory["blob_region_length"] = settled["blob_region_length"]
        at = crc_value_offset(footer)
        if at < 0:
            raise RuntimeError("pyarrow's footer does not hold the checksum entry where expected")
        footer[at : at + len(CRC_PLACEHOLDER)] = b"%08x" % footer_self_crc(footer, at)
        footer_crc = zlib.crc32(footer)
        del footer
    out = sink.getvalue()
    by_name = {s.name: s for s in sections}
    by_name["footer"] = Section("footer", "footer", footer_start, len(out) - footer_start, footer_crc)
    return BuiltSuperfile(out, by_name, data.num_rows, terms, footer_crc, directory, fts_stats)


def _patch(footer: memoryview, placeholder: str, value: int) -> None:
    """Write ``value`` over ``placeholder`` (a JSON string in the section directory) as a JSON number of the same
    width, right-aligned after spaces."""
    quoted = json.dumps(placeholder).encode()
    at = bytes(footer).find(quoted)
    if at < 0:
        raise RuntimeError(f"pyarrow's footer does not hold the placeholder {placeholder!r}")
    footer[at : at + len(quoted)] = str(value).rjust(len(quoted)).encode()


def _dictionary_columns(table: pa.Table) -> list[str]:
    """The columns worth Parquet's dictionary encoding: those whose first row group's worth of values holds at
    most half as many distinct values as rows (nested columns keep it: pyarrow applies it to their leaves).

    A dictionary of unique values (ids, texts) saves nothing and makes every page of the chunk need it: a read of
    one row decodes the whole dictionary page (a text column's: up to 1 MiB) instead of the row's page.
    """
    sample = table.slice(0, _DICTIONARY_SAMPLE_ROWS)

    def few_values(column: pa.ChunkedArray) -> bool:
        if pa.types.is_nested(column.type) or pa.types.is_dictionary(column.type):
            return True
        try:
            return 2 * int(pc.count_distinct(column, mode="all").as_py()) <= len(column)
        except pa.ArrowNotImplementedError:  # no distinct count for the type (null, views): pyarrow's default
            return True

    return [name for name, column in zip(table.column_names, sample.columns, strict=True) if few_values(column)]


def _delta_columns(table: pa.Table, dictionary: list[str]) -> dict[str, str]:
    """DELTA_BINARY_PACKED for the integer-valued columns (ints, timestamps, dates, times, durations) without a
    dictionary: measured on 62,500 rows against PLAIN under LZ4, ids in order took 3 KB instead of 261 KB and
    random int64 330 KB instead of 470 KB, scans were 1.9-5.6x faster and 62-row reads by page 1.0-2.7x
    (docs/format.md, "Parquet part")."""
    return {
        field.name: "DELTA_BINARY_PACKED"
        for field in table.schema
        if field.name not in dictionary and _integer_valued(field.type)
    }


def _integer_valued(kind: pa.DataType) -> bool:
    temporal = pa.types.is_timestamp(kind) or pa.types.is_date32(kind) or pa.types.is_duration(kind)
    return pa.types.is_integer(kind) or temporal or pa.types.is_time(kind)


def _rows_per_group(table: pa.Table, spec: SuperfileSpec) -> int:
    """Rows per row group: ``row_group_bytes`` of data, at least 1024 rows, at most ``row_group_size``.

    A read of more than a few rows decodes whole row groups (a few are read by page, format/pages.py), so
    groups are sized by bytes: 65536 rows of 1 KB texts made a 10-row read take
    ~0.5 s; ~4 MB groups take a few ms each and also scan fastest.
    """
    per_row = table.nbytes / max(table.num_rows, 1)
    by_bytes = max(_MIN_GROUP_ROWS, int(spec.row_group_bytes / max(per_row, 1.0)))
    return min(spec.row_group_size, by_bytes)


def _entry(section: Section, info: dict[str, object]) -> dict[str, object]:
    return {
        **info,
        "name": section.name,
        "kind": section.kind,
        "offset": section.offset,
        "length": section.length,
        "crc32": section.crc32,
    }


def _vector_blob(
    column: pa.ChunkedArray, name: str, vspec: VectorColumnSpec
) -> tuple[dict[str, object], Callable[[int], bytes]]:
    """The vector index blob of one column: non-null, ``dim`` floats each (the index checks values)."""
    arr = cast(pa.FixedSizeListArray, column.combine_chunks())
    if not pa.types.is_fixed_size_list(arr.type) or not pa.types.is_floating(arr.type.value_type):
        raise SchemaMismatchError(f"vector column {name!r} must be fixed_size_list<float>, got {arr.type}")
    if arr.type.list_size != vspec.dim:
        raise VectorDimensionError(f"vector column {name!r} has dimension {arr.type.list_size}, expected {vspec.dim}")
    if arr.null_count:
        raise InvalidVectorError(f"vector column {name!r} has {arr.null_count} null vectors")
    flat = arr.flatten()
    if flat.null_count:
        raise InvalidVectorError(f"vector column {name!r} has null components")
    vectors = np.asarray(flat.to_numpy(zero_copy_only=False), np.float32).reshape(len(arr), vspec.dim)
    params = vspec.params
    info: dict[str, object] = {
        "name": vec_section(name),
        "kind": "vector",
        "column": name,
        "dim": vspec.dim,
        "metric": vspec.metric,
        "params": asdict(params) if params is not None else None,
    }
    return info, build_vector_blob(vectors, vspec.metric, params)


def _validate(data: pa.Table, spec: SuperfileSpec) -> None:
    names = set(data.column_names)
    if ID_COLUMN not in names:
        raise SchemaMismatchError(f"data lacks the {ID_COLUMN!r} column")
    if not pa.types.is_uint64(data.schema.field(ID_COLUMN).type):
        raise SchemaMismatchError(f"{ID_COLUMN!r} must be uint64, got {data.schema.field(ID_COLUMN).type}")
    if len(names) != len(data.column_names):
        raise SchemaMismatchError("data has duplicate column names")
    indexed: Sequence[str] = [*spec.fts_columns, *spec.vector_columns]
    for c in indexed:
        if c not in names:
            raise UnknownColumnError(f"indexed column {c!r} is not in the data")
        if c == ID_COLUMN:
            raise InvalidOptionError(f"{ID_COLUMN!r} cannot be indexed")
    for c, kind in spec.scalar_indexes.items():
        if c not in names:
            raise UnknownColumnError(f"indexed column {c!r} is not in the data")
        if c in spec.vector_columns:
            raise InvalidOptionError(f"vector column {c!r} cannot have a scalar index")
        if kind not in KINDS:
            raise InvalidOptionError(f"scalar index of {c!r} must be one of {KINDS}, got {kind!r}")
    overlap = set(spec.fts_columns) & set(spec.vector_columns)
    if overlap:
        raise InvalidOptionError(f"columns {sorted(overlap)} cannot be both full-text and vector columns")
    for c, tokenizer in spec.fts_columns.items():
        if tokenizer not in TOKENIZERS:
            raise InvalidOptionError(f"tokenizer of {c!r} must be one of {TOKENIZERS}, got {tokenizer!r}")
        t = data.schema.field(c).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            raise SchemaMismatchError(f"full-text column {c!r} must be a string column, got {t}")
    if spec.row_group_size < 1 or spec.row_group_bytes < 1:
        raise InvalidOptionError(
            f"row_group_size and row_group_bytes must be >= 1, got {spec.row_group_size} and {spec.row_group_bytes}"
        )
