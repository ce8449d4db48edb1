"""Byte layout of a superfile: a Parquet file with index blobs spliced in before its footer.

::

    [PAR1][column chunks][blob 0]...[blob n-1][footer][u32 footer length][PAR1]
    |<----- "data" ----->|<--- blob region --->|<-------- "footer" -------->|

Parquet readers follow the footer's absolute column-chunk offsets and never
look at the blob region, so the file stays plain Parquet. The footer's
key/value metadata holds the section directory (JSON) and the footer's own
checksum; see ``docs/format.md``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from superfile.errors import CorruptSuperfileError
from superfile.format.vector_index import VectorIndexParams

__all__ = [
    "CRC_PLACEHOLDER",
    "FORMAT",
    "KEY_FOOTER_CRC",
    "KEY_FORMAT",
    "KEY_SECTIONS",
    "KEY_VERSION",
    "PAGE_INDEX_SECTION",
    "VERSION",
    "BuiltSuperfile",
    "Section",
    "SuperfileSpec",
    "VectorColumnSpec",
    "check_footer",
    "crc_value_offset",
    "footer_bounds",
    "footer_self_crc",
    "fts_section",
    "idx_section",
    "parse_directory",
    "vec_section",
]

FORMAT = "superfile"
VERSION = 1
MAGIC = b"PAR1"
KEY_FORMAT = "superfile.format"
KEY_VERSION = "superfile.version"
KEY_SECTIONS = "superfile.sections"
KEY_FOOTER_CRC = "superfile.footer_crc32"
CRC_PLACEHOLDER = b"00000000"
# Thrift compact encoding of a KeyValue whose key is KEY_FOOTER_CRC and whose value has 8 bytes:
# key (field 1, binary, length 22), then field 2 header 0x18 and length 0x08. Found with rfind: key/value
# metadata comes after the row groups (whose statistics may hold user strings) in FileMetaData.
_CRC_MARKER = bytes([len(KEY_FOOTER_CRC)]) + KEY_FOOTER_CRC.encode() + b"\x18\x08"
_TAIL = struct.Struct("<I4s")


IDS_SECTION = "ids"
# the Parquet page index (column and offset indexes), which pyarrow writes after the blobs, before the footer
PAGE_INDEX_SECTION = "pageindex"


def fts_section(column: str) -> str:
    return f"fts/{column}"


def vec_section(column: str) -> str:
    return f"vec/{column}"


def idx_section(column: str) -> str:
    """The scalar index of ``column`` (kind ``bitmap`` or ``sorted``)."""
    return f"idx/{column}"


@dataclass(frozen=True)
class Section:
    """A byte range of a superfile: absolute ``offset``, ``length`` and the zlib CRC-32 of those bytes."""

    name: str
    kind: str
    offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class VectorColumnSpec:
    """A vector column: stored only in its vector blob, never as a Parquet column."""

    dim: int
    metric: str
    params: VectorIndexParams | None = None


@dataclass(frozen=True)
class SuperfileSpec:
    """What to index in a superfile and how to write its Parquet part."""

    fts_columns: Mapping[str, str] = field(default_factory=dict)  # column -> tokenizer
    vector_columns: Mapping[str, VectorColumnSpec] = field(default_factory=dict)
    scalar_indexes: Mapping[str, str] = field(default_factory=dict)  # column -> "bitmap" | "sorted"
    compression: str = "lz4"  # LZ4_RAW: its 4 KiB pages scan ~1.8x faster than zstd's 64 KiB ones (docs/format.md)
    # Parquet dictionary encoding: off for level-0 superfiles, where it cost more than half of the Parquet write
    # of a 20-row append (floats of the vectors kept in Parquet) and bought nothing at that size
    dictionary: bool = True
    row_group_size: int = 8192  # at most this many rows per row group ...
    row_group_bytes: int = 4 << 20  # ... and about this much Arrow data (what a read of many rows decodes)


@dataclass
class BuiltSuperfile:
    """A built file plus what the manifest keeps about it (so blobs can be range-read without the footer)."""

    data: bytes  # the whole file
    sections: dict[str, Section]  # absolute offsets; includes "footer" (footer + length + magic)
    num_rows: int
    terms: dict[str, list[str]]  # per full-text column: its distinct indexed terms, sorted
    footer_crc32: int  # CRC-32 of the "footer" section: the manifest's check on the one unchecksummed range
    directory: dict[str, Any]  # the section directory as written into the footer
    # per full-text column: (rows, exact sum of analysed lengths): the manifest sums them for table-wide BM25
    fts_stats: dict[str, tuple[int, int]] = field(default_factory=dict)


def crc_value_offset(footer: bytes | memoryview) -> int:
    """Offset of the 8 footer-checksum digits inside the footer bytes, or -1."""
    pos = bytes(footer).rfind(_CRC_MARKER)
    return -1 if pos < 0 else pos + len(_CRC_MARKER)


def footer_self_crc(footer: bytes | memoryview, value_at: int) -> int:
    """CRC-32 of the footer region with its checksum digits read as ``00000000``."""
    crc = zlib.crc32(footer[:value_at])
    crc = zlib.crc32(CRC_PLACEHOLDER, crc)
    return zlib.crc32(footer[value_at + len(CRC_PLACEHOLDER) :], crc)


def check_footer(buf: memoryview, footer_start: int, name: str) -> int:
    """Check the footer's own checksum, found in the raw bytes before any parser sees them.

    Returns the plain CRC-32 of the footer region (the "footer" section's checksum).
    """
    footer = buf[footer_start:]
    at = crc_value_offset(footer)
    if at < 0:
        raise CorruptSuperfileError(name, f"footer lacks its {KEY_FOOTER_CRC} entry: damaged or not a superfile")
    try:
        expected = int(bytes(footer[at : at + len(CRC_PLACEHOLDER)]), 16)
    except ValueError:
        raise CorruptSuperfileError(name, "footer checksum entry is not hexadecimal") from None
    actual = footer_self_crc(footer, at)
    if actual != expected:
        raise CorruptSuperfileError(name, f"footer crc32 {actual:08x} != recorded {expected:08x}")
    return zlib.crc32(footer)


def parse_directory(
    kv: Mapping[bytes, bytes] | None, footer_start: int, name: str
) -> tuple[int, dict[str, Any], dict[str, Section]]:
    """(num_rows, directory, sections) from the footer's key/value metadata, after checking that the
    sections are contiguous and cover the file exactly up to the footer."""

    def corrupt(detail: str) -> CorruptSuperfileError:
        return CorruptSuperfileError(name, detail)

    if kv is None or kv.get(KEY_FORMAT.encode()) != FORMAT.encode():
        raise corrupt(f"footer lacks {KEY_FORMAT}={FORMAT!r}: not a superfile")
    version = kv.get(KEY_VERSION.encode(), b"")
    if version != str(VERSION).encode():
        raise corrupt(f"unsupported {KEY_VERSION} {version.decode(errors='replace')!r} (this reader: {VERSION})")
    try:
        directory = json.loads(kv[KEY_SECTIONS.encode()])
        num_rows = _nonneg(directory["num_rows"])
        data_end = _nonneg(directory["data_end"])
        blob_len = _nonneg(directory["blob_region_length"])
        sections: dict[str, Section] = {}
        for e in directory["sections"]:
            s = Section(
                str(e["name"]),
                str(e["kind"]),
                _nonneg(e["offset"]),
                _nonneg(e["length"]),
                _nonneg(e["crc32"]),
            )
            if s.name in sections or s.name == "footer":
                raise ValueError(f"duplicate or reserved section name {s.name!r}")
            sections[s.name] = s
    except (KeyError, TypeError, ValueError) as e:
        raise corrupt(f"bad section directory: {e!r}") from None
    if data_end + blob_len != footer_start:
        raise corrupt(f"directory puts the footer at {data_end + blob_len}, the file has it at {footer_start}")
    expect = 0
    for s in sections.values():
        if s.offset != expect:
            raise corrupt(f"section {s.name!r} at {s.offset}, expected {expect} (sections must be contiguous)")
        expect += s.length
    data = sections.get("data")
    if data is None or data.offset != 0 or data.length != data_end or expect != footer_start:
        raise corrupt("section directory does not cover the file up to the footer")
    return num_rows, directory, sections


def footer_bounds(buf: memoryview, name: str) -> int:
    """Start offset of the Parquet footer, after checking both magic numbers and the length word."""
    size = len(buf)
    if size < 12 + len(MAGIC):
        raise CorruptSuperfileError(name, f"file too short ({size} bytes) to be Parquet")
    if bytes(buf[:4]) != MAGIC:
        raise CorruptSuperfileError(name, "bad leading magic number (expected PAR1)")
    footer_len, tail = _TAIL.unpack_from(buf, size - _TAIL.size)
    if tail != MAGIC:
        raise CorruptSuperfileError(name, "bad trailing magic number (expected PAR1); truncated?")
    footer_start = size - _TAIL.size - footer_len
    if footer_start < len(MAGIC):
        raise CorruptSuperfileError(name, f"footer length {footer_len} exceeds the file size {size}")
    return footer_start


def _nonneg(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value
