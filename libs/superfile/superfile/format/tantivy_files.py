"""Reading tantivy's own index files: ``meta.json``, which files are live, and the per-field norms.

Tantivy's Python binding exposes neither the fieldnorms nor the token totals
BM25 uses, so :func:`field_norms` reads them from the ``.fieldnorm`` and
``.idx`` files of each segment. :data:`FIELDNORMS` decodes a fieldnorm id the
way tantivy does. The layouts are tantivy's; a build checks what it read
against tantivy's own BM25 explanation, so a tantivy upgrade that changed them
fails loudly (see "Table-wide BM25" in ``docs/format.md``).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FIELDNORMS",
    "SegmentNorms",
    "composite_section",
    "field_norms",
    "fieldnorm_id",
    "live_files",
    "read_meta",
    "segment_files",
]

_TAIL = struct.Struct("<II")  # every tantivy file ends with a JSON footer, its u32 length and u32 1337
_MAGIC = 1337


def _fieldnorm_table() -> np.ndarray:
    """Length of every u8 fieldnorm id, as tantivy decodes it (Lucene's ``SmallFloat.byte4ToInt``).

    Ids 0..40 are exact lengths; above, lengths keep 4 significant bits (42, 44, ..., 56, 60, ...).
    """
    out = np.empty(256, np.int64)
    for i in range(256):
        j = i - 24
        out[i] = i if j < 0 else 24 + (j & 7 if j < 8 else ((j & 7) | 8) << ((j >> 3) - 1))
    return out


FIELDNORMS = _fieldnorm_table()  # fieldnorm id -> the document length BM25 uses (tantivy's quantisation)


def fieldnorm_id(length: int) -> int:
    """The fieldnorm id tantivy stores for a document of ``length`` analysed tokens (rounded down)."""
    return int(np.searchsorted(FIELDNORMS, length, side="right")) - 1


def read_meta(directory: str) -> dict[str, Any]:
    """The index's ``meta.json``: its schema and its committed segments, in segment ordinal order."""
    with open(os.path.join(directory, "meta.json"), "rb") as fh:
        meta: dict[str, Any] = json.load(fh)
    return meta


def _segment_names(meta: dict[str, Any]) -> set[str]:
    """The file name stem of every live segment (its id without dashes)."""
    return {s["segment_id"].replace("-", "") for s in meta["segments"]}


def segment_files(directory: str, meta: dict[str, Any]) -> list[str]:
    """The names of the files in ``directory`` that belong to a segment ``meta`` lists (unordered)."""
    live = _segment_names(meta)
    return [n for n in os.listdir(directory) if n.split(".", 1)[0] in live]


def live_files(directory: str) -> list[str]:
    """The files a committed index needs, sorted: ``meta.json`` and its segments' files (no lock files, no
    ``.managed.json``, no files of segments merged away)."""
    return sorted(["meta.json", *segment_files(directory, read_meta(directory))])


def _read_vint(buf: bytes, pos: int) -> tuple[int, int]:
    """Tantivy's VInt: 7 bits per byte, least significant first, high bit set on the last byte."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated VInt")
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if b & 0x80:
            return value, pos
        shift += 7


def composite_section(data: bytes, field: int) -> bytes | None:
    """One field's bytes in a tantivy per-field ("composite") file such as ``.fieldnorm`` or ``.idx``.

    Layout: field sections, then VInt count and per section (VInt offset delta,
    u32 field, VInt index), u32 length of that table, then tantivy's file footer.
    None when the file has no section for the field.
    """
    if len(data) < _TAIL.size:
        raise ValueError("file too short")
    json_len, magic = _TAIL.unpack_from(data, len(data) - _TAIL.size)
    body_end = len(data) - _TAIL.size - json_len
    if magic != _MAGIC or body_end < 4:
        raise ValueError("no tantivy footer")
    (table_len,) = struct.unpack_from("<I", data, body_end - 4)
    table_start = body_end - 4 - table_len
    if table_start < 0:
        raise ValueError("bad composite table length")
    table = data[table_start : body_end - 4]
    count, pos = _read_vint(table, 0)
    starts, keys, offset = [], [], 0
    for _ in range(count):
        delta, pos = _read_vint(table, pos)
        offset += delta
        (f,) = struct.unpack_from("<I", table, pos)
        idx, pos = _read_vint(table, pos + 4)
        starts.append(offset)
        keys.append((f, idx))
    starts.append(table_start)
    for i, key in enumerate(keys):
        if key == (field, 0):
            if not 0 <= starts[i] <= starts[i + 1] <= table_start:
                raise ValueError("bad composite offsets")
            return data[starts[i] : starts[i + 1]]
    return None


@dataclass(frozen=True)
class SegmentNorms:
    """One segment's norms of one field, as its files hold them."""

    segment: str  # the segment's file name stem
    max_doc: int  # documents in the segment; segment doc ids are 0..max_doc-1
    fieldnorms: bytes  # one u8 fieldnorm id per document, in doc id order
    total_tokens: int  # the u64 sum of analysed lengths tantivy divides by N for avgdl


def field_norms(directory: str, field_name: str) -> list[SegmentNorms]:
    """The norms of the field named ``field_name`` in every segment of the index in ``directory``, in segment
    ordinal order.

    ``.fieldnorm`` holds one u8 per document and field; the field's section of
    ``.idx`` (its postings) starts with the u64 token total. Raises ValueError
    (or KeyError, StopIteration, struct.error) if the files are not laid out as
    expected, or a segment has deletes.
    """
    meta = read_meta(directory)
    field = next(i for i, f in enumerate(meta["schema"]) if f["name"] == field_name)
    out = []
    for segment in meta["segments"]:
        if segment.get("deletes"):
            raise ValueError("segment with deletes")
        name, max_doc = segment["segment_id"].replace("-", ""), int(segment["max_doc"])
        with open(os.path.join(directory, f"{name}.fieldnorm"), "rb") as fh:
            norms = composite_section(fh.read(), field)
        with open(os.path.join(directory, f"{name}.idx"), "rb") as fh:
            postings = composite_section(fh.read(), field)
        if norms is None or len(norms) != max_doc:
            raise ValueError(f"fieldnorms of segment {name} do not cover its {max_doc} documents")
        total = struct.unpack_from("<Q", postings, 0)[0] if postings else 0
        out.append(SegmentNorms(name, max_doc, norms, total))
    return out
