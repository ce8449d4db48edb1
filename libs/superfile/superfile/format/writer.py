"""Building a superfile in one pass: Parquet data, then the index blobs, then the footer.

pyarrow's ``ParquetWriter`` writes column chunks to the sink as row groups
close and the footer only on ``close()``. In between we append the blobs to
the same sink and add the section directory as key/value metadata, so every
offset and checksum is known before the footer is written. The footer's own
checksum is patched in afterwards over a fixed-width placeholder.
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
from superfile.format.vector_index import build_vector_index

__all__ = ["ID_COLUMN", "build_superfile"]

ID_COLUMN = "_id"
_MIN_GROUP_ROWS = 1024  # below this, footers grow (statistics per group and column) for no read benefit


def build_superfile(data: pa.Table, spec: SuperfileSpec, *, work_dir: str | None = None) -> BuiltSuperfile:
    """Write ``data`` as one superfile: Parquet (``_id`` first, vector columns left out) plus one tantivy
    blob per full-text column, one vector blob per vector column and one scalar index (``idx/<column>``)
    per entry of ``spec.scalar_indexes``. Row offset i is document i in every index. Thread-safe: builds
    share no state (``work_dir`` holds temporary index directories).
    """
    _validate(data, spec)
    # a blob is bytes, or a function of its absolute file offset (scalar indexes align their arrays to it)
    blobs: list[tuple[dict[str, object], bytes | Callable[[int], bytes]]] = []
    terms: dict[str, list[str]] = {}
    fts_stats: dict[str, tuple[int, int]] = {}
    for column, tokenizer in spec.fts_columns.items():
        fts: FullTextBlob = build_fulltext(data.column(column), tokenizer, work_dir=work_dir)
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
    # _id again as raw little-endian u64: search results resolve ids with a zero-copy view, no Parquet decode
    ids = np.asarray(data.column(ID_COLUMN).to_numpy(), dtype="<u8")
    blobs.append(({"name": IDS_SECTION, "kind": "u64le"}, ids.tobytes()))

    parquet_columns = [ID_COLUMN] + [c for c in data.column_names if c != ID_COLUMN and c not in spec.vector_columns]
    table = data.select(parquet_columns)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if not k.startswith(b"superfile.")}
    table = table.replace_schema_metadata(meta or None)

    sink = io.BytesIO()
    try:
        writer = pq.ParquetWriter(
            sink, table.schema, compression=cast(Any, spec.compression), use_dictionary=spec.dictionary
        )  # compression checked by pyarrow
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
            sink.write(blob)
            sections.append(s)
            entries.append(_entry(s, info))
            offset += len(blob)
        blobs.clear()  # the sink holds them now; free the copies before getvalue() below
        directory = {
            "num_rows": data.num_rows,
            "data_end": data_end,
            "blob_region_length": offset - data_end,
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
        if footer_start != offset:
            raise RuntimeError(f"pyarrow wrote the footer at {footer_start}, expected {offset}")
        footer = view[footer_start:]
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


def _rows_per_group(table: pa.Table, spec: SuperfileSpec) -> int:
    """Rows per row group: ``row_group_bytes`` of data, at least 1024 rows, at most ``row_group_size``.

    Row reads decode whole row groups (pyarrow cannot read single pages), so
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


def _vector_blob(column: pa.ChunkedArray, name: str, vspec: VectorColumnSpec) -> tuple[dict[str, object], bytes]:
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
    return info, build_vector_index(vectors, vspec.metric, params)


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
