"""The compiled page decoder (format/page_decode.py): the few rows it decodes equal what pyarrow reads, for
every page kind it takes (v1 and v2 data pages, LZ4_RAW and uncompressed, PLAIN and DELTA_BINARY_PACKED, with
and without nulls); other pages fall back to pyarrow; damaged pages are a typed error, never a read out of
bounds."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from superfile.errors import CorruptSuperfileError
from superfile.format import SuperfileReader, SuperfileSpec, build_superfile
from superfile.format.page_decode import LZ4_DECOMPRESS
from superfile.format.pages import PageReads

ROWS = 12_000
DELTA = ["i64", "i32", "i16", "u64", "extreme", "at", "day"]


def _table(rows: int = ROWS, seed: int = 5) -> pa.Table:
    rng = np.random.default_rng(seed)
    nulls = rng.random(rows) < 0.15
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon"])
    text = [" ".join(rng.choice(words, int(rng.integers(0, 40)))) for _ in range(rows)]
    # the widest deltas there are: values at both ends of int64, so deltas need all 64 bits
    extreme = np.where(rng.random(rows) < 0.5, np.iinfo(np.int64).min, np.iinfo(np.int64).max)
    return pa.table(
        {
            "text": pa.array(text, mask=nulls),
            "large": pa.array(text, pa.large_string()),
            "raw": pa.array([t.encode() for t in text], pa.binary(), mask=~nulls),
            "i64": pa.array(rng.integers(-(10**15), 10**15, rows), mask=nulls),
            "i32": pa.array(rng.integers(-(10**6), 10**6, rows).astype(np.int32)),
            "i16": pa.array(rng.integers(-(2**15), 2**15, rows).astype(np.int16)),
            "u64": pa.array(rng.integers(0, 2**63, rows).astype(np.uint64) * 2 + 1),
            "extreme": pa.array(
                extreme + rng.integers(-3, 4, rows) * (extreme < 0) - rng.integers(0, 4, rows) * (extreme > 0)
            ),
            "sorted": pa.array(np.arange(rows) * 3),
            "f32": pa.array(rng.random(rows).astype(np.float32), mask=nulls),
            "f64": pa.array(rng.random(rows)),
            "at": pa.array(rng.integers(0, 2**50, rows), pa.timestamp("us", tz="UTC")),
            "day": pa.array(rng.integers(0, 20_000, rows).astype(np.int32), pa.date32()),
        }
    )


def _written(table: pa.Table, compression: str, version: str) -> pa.Buffer:
    """``table`` as a superfile's writer lays it out (no dictionary, delta-packed integers, 4 KiB pages, the
    page index), with data pages of ``version``."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression=compression,
        use_dictionary=False,
        column_encoding={c: "DELTA_BINARY_PACKED" for c in [*DELTA, "sorted"]},
        data_page_size=4096,
        data_page_version=version,
        row_group_size=5000,
        write_page_index=True,
    )
    return pa.py_buffer(sink.getvalue())


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return _table()


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_the_compiled_decoder_reads_what_pyarrow_reads(table: pa.Table, compression: str, version: str) -> None:
    assert LZ4_DECOMPRESS, "liblz4 is on every Debian: without it LZ4 pages would be left to pyarrow"
    buf = _written(table, compression, version)
    meta = pq.read_metadata(pa.BufferReader(buf))
    pages = PageReads(buf, meta, None)
    whole = pq.read_table(pa.BufferReader(buf))
    rng = np.random.default_rng(11)
    selections = [
        np.array([0]),
        np.array([ROWS - 1]),
        np.array([4999, 5000, 5001]),  # across a row group boundary
        np.array([17, 3, 3, 9000, 5, 17]),  # unordered, repeated
        np.sort(rng.choice(ROWS, 40, replace=False)),
        np.arange(0, ROWS, 97),  # one row in many pages
    ]
    for leaf, name in enumerate(table.column_names):
        column, column_pages = pages.column(leaf), pages.pages(leaf)
        assert column is not None and column_pages is not None, name
        for rows in selections:
            ordered = bool((rows[1:] >= rows[:-1]).all())
            got = pages._compiled(rows.astype(np.int64), ordered, column, column_pages)
            assert got is not None, (name, "the compiled decoder declined it")
            expected = whole.column(name).take(pa.array(rows)).combine_chunks()
            assert got.type == expected.type and got.equals(expected), (name, rows[:5])


def test_a_value_past_where_its_page_was_expected_to_hold_it_is_still_read() -> None:
    """A page is decompressed up to where its last wanted value would lie were values of equal size; here the
    first rows of every 60 are long, so a wanted row in the middle of a page lies well past that."""
    lengths = np.where(np.arange(6000) % 60 < 6, 400, 3)
    text = pa.array(["x" * int(n - 1) + str(i % 10) for i, n in enumerate(lengths)])
    buf = _written(pa.table({"text": text}), "lz4", "1.0")
    pages = PageReads(buf, pq.read_metadata(pa.BufferReader(buf)), None)
    column, column_pages = pages.column(0), pages.pages(0)
    assert column is not None and column_pages is not None
    for start in range(6, 60, 7):
        rows = np.arange(start, 6000, 60, dtype=np.int64)
        got = pages._compiled(rows, True, column, column_pages)
        assert got is not None and got.equals(text.take(pa.array(rows))), start


def test_other_pages_are_left_to_pyarrow(table: pa.Table) -> None:
    """A codec the decoder does not take (zstd), or a type (booleans): pyarrow decodes the pages."""
    flags = pa.table({"flag": pa.array(np.arange(ROWS) % 3 == 0), "f64": table.column("f64")})
    for data, compression in ((table, "zstd"), (flags, "lz4")):
        buf = _written(data, compression, "1.0")
        pages = PageReads(buf, pq.read_metadata(pa.BufferReader(buf)), None)
        rows = np.array([5, 700, 11_000], np.int64)
        leaf = 0
        column, column_pages = pages.column(leaf), pages.pages(leaf)
        assert column is not None and column_pages is not None
        assert pages._compiled(rows, True, column, column_pages) is None
        got = pages.read(rows, leaf, when_cheaper=False)
        assert got is not None and got.equals(data.column(0).take(pa.array(rows)).combine_chunks())


def test_damaged_pages_are_a_typed_error_or_values_never_a_crash(table: pa.Table) -> None:
    """Bytes flipped anywhere in the pages of a superfile opened without its checksums (a copy read by ranges):
    every read either fails with CorruptSuperfileError or gives rows of the right count and type (a flipped
    byte inside a value is not detectable without the checksum): the decoder never reads or writes out of
    bounds."""
    columns = table.select(["text", "i64", "f32", "sorted"])
    ids = pa.array(np.arange(ROWS), pa.uint64())
    built = build_superfile(columns.add_column(0, "_id", ids), SuperfileSpec()).data
    reader = SuperfileReader.open(built, name="t")
    rng = np.random.default_rng(2)
    rows = np.sort(rng.choice(ROWS, 25, replace=False))
    spans = []  # the bytes of the pages the read decodes: every flip lands in one
    for name in columns.column_names:
        pages = reader._pages.pages(reader._leaves[name][0])
        assert pages is not None
        chosen = np.unique(pages.page_of(rows))
        spans += zip(pages.offsets[chosen].tolist(), pages.sizes[chosen].tolist(), strict=True)
    failures = 0
    for _ in range(300):
        damaged = bytearray(built)
        for _ in range(int(rng.integers(1, 4))):
            start, size = spans[int(rng.integers(len(spans)))]
            damaged[start + int(rng.integers(size))] ^= int(rng.integers(1, 256))
        reader = SuperfileReader.open(bytes(damaged), name="t", verify=False)
        try:
            got = reader.read(["text", "i64", "f32", "sorted"], rows=rows, use_threads=False)
        except CorruptSuperfileError:
            failures += 1
            continue
        assert got.num_rows == len(rows)
        assert got.schema.types == [pa.string(), pa.int64(), pa.float32(), pa.int64()]
    assert failures > 0  # some flips hit headers or lengths, and were caught
