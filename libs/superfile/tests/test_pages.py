"""Point reads by page (format/pages.py): the rows a few-row read decodes come from only the pages holding them,
equal to what pyarrow reads from the whole row groups, for every type the writer makes page-readable."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import datafusion
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from superfile.errors import CorruptSuperfileError
from superfile.format import SuperfileReader, SuperfileSpec, build_superfile
from superfile.format.pages import PageReads

ROWS = 20_000


def _table(rows: int = ROWS, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"])
    text = [" ".join(rng.choice(words, int(rng.integers(0, 120)))) for _ in range(rows)]
    nulls = rng.random(rows) < 0.1
    return pa.table(
        {
            "_id": pa.array(np.arange(rows) * 2 + 1, pa.uint64()),
            "i64": pa.array(rng.integers(-(10**12), 10**12, rows)),
            "i32": pa.array(rng.integers(-(10**6), 10**6, rows).astype(np.int32)),
            "i16": pa.array(rng.integers(-(2**15), 2**15, rows).astype(np.int16)),
            "u32": pa.array(rng.integers(0, 2**32 - 1, rows).astype(np.uint32)),
            "u64": pa.array(rng.integers(0, 2**63, rows).astype(np.uint64)),
            "f32": pa.array(rng.random(rows).astype(np.float32)),
            "f64": pa.array(np.where(nulls, np.nan, rng.random(rows)), pa.float64(), mask=nulls),
            "flag": pa.array(rng.random(rows) < 0.5, mask=rng.random(rows) < 0.05),
            "text": pa.array(text, mask=nulls),
            "large": pa.array(text, pa.large_string()),
            "raw": pa.array([t.encode() for t in text], pa.binary()),
            "at": pa.array(rng.integers(0, 2**40, rows), pa.timestamp("us", tz="UTC")),
            "at_ns": pa.array(rng.integers(0, 2**50, rows), pa.timestamp("ns")),
            "day": pa.array(rng.integers(0, 20_000, rows).astype(np.int32), pa.date32()),
            "paris": pa.array(rng.integers(0, 2**40, rows), pa.timestamp("ms", tz="Europe/Paris")),
            "wait": pa.array(rng.integers(0, 10**9, rows), pa.duration("ms")),
            "clock": pa.array(rng.integers(0, 86_400_000, rows).astype(np.int32), pa.time32("ms")),
            "price": pa.array([Decimal(int(v)) / 1000 for v in rng.integers(0, 10**9, rows)], pa.decimal128(12, 3)),
            "key": pa.array([int(v).to_bytes(8, "little") for v in rng.integers(0, 2**62, rows)], pa.binary(8)),
            "label": pa.array([f"c{i % 10}" for i in range(rows)]),  # few values: dictionary-encoded, read whole
        }
    )


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return _table()


@pytest.fixture(scope="module", params=["lz4", "zstd", "snappy", "none"])
def built(request: pytest.FixtureRequest, table: pa.Table) -> bytes:
    return build_superfile(table, SuperfileSpec(compression=request.param, row_group_size=4096)).data


def _whole(reader: SuperfileReader, columns: list[str], rows: np.ndarray) -> pa.Table:
    """The same rows decoded from whole row groups by pyarrow (the path pages replace)."""
    return pq.read_table(pa.BufferReader(reader._buf), columns=columns).take(pa.array(rows))


def test_page_reads_equal_whole_row_group_reads(built: bytes, table: pa.Table) -> None:
    reader = SuperfileReader.open(built, name="t")
    columns = [c for c in table.column_names if c != "_id"]
    rng = np.random.default_rng(7)
    selections = [
        np.array([0]),
        np.array([ROWS - 1]),
        np.array([4095, 4096, 4097]),  # across a row group boundary
        np.array([17, 3, 3, 12_000, 5]),  # unordered, repeated
        *(rng.choice(ROWS, n, replace=False) for n in (2, 9, 30)),
    ]
    nothing = reader._pages.read(np.array([], np.int64), reader._leaves["text"][0], when_cheaper=False)
    assert nothing is not None and nothing.to_pylist() == []
    for rows in selections:
        got = reader.read(columns, rows=rows, use_threads=False)
        expected = _whole(reader, columns, rows)
        assert got.schema == expected.schema
        for name in columns:
            assert got.column(name).equals(expected.column(name)), (name, rows)


def test_only_the_pages_holding_the_rows_are_read(table: pa.Table) -> None:
    built = build_superfile(table, SuperfileSpec())
    data = built.data
    read: list[tuple[int, int]] = []
    reader = SuperfileReader.open(data, name="t", verify=False, ensure=lambda start, n: read.append((start, n)))
    meta = pq.read_metadata(pa.BufferReader(data))
    leaf = meta.schema.to_arrow_schema().get_field_index("text")
    chunk = meta.row_group(0).column(leaf)
    assert not chunk.has_dictionary_page  # a column of mostly distinct values keeps no dictionary
    opened = len(read)
    got = reader.read(["text"], rows=np.array([150, 100]))  # rows of one page (cut every 512 rows at most)
    assert got.column("text").to_pylist() == table.column("text").take([150, 100]).to_pylist()
    index = built.sections["pageindex"]
    ranges = [(s, n) for s, n in read[opened:] if s < index.offset]  # the offset index and footer aside
    assert ranges, "a page read makes the ranges it reads present"
    assert all(chunk.data_page_offset <= s < chunk.data_page_offset + chunk.total_compressed_size for s, _ in ranges)
    assert sum(n for _, n in ranges) < chunk.total_compressed_size / 3
    # the dictionary-encoded column is read whole, as before
    label = reader.read(["label"], rows=np.array([100, 2001]))
    assert label.column("label").to_pylist() == ["c0", "c1"]


def test_many_rows_read_whole_row_groups(table: pa.Table) -> None:
    data = build_superfile(table, SuperfileSpec()).data
    read: list[tuple[int, int]] = []
    reader = SuperfileReader.open(data, name="t", verify=False, ensure=lambda start, n: read.append((start, n)))
    meta = pq.read_metadata(pa.BufferReader(data))
    leaf = meta.schema.to_arrow_schema().get_field_index("text")
    rows = np.arange(0, meta.row_group(0).num_rows, 7)  # every page of the group holds one: pages save nothing
    opened = len(read)
    got = reader.read(["text"], rows=rows)
    assert got.column("text").equals(table.column("text").take(pa.array(rows)))
    chunk = meta.row_group(0).column(leaf)
    assert (chunk.data_page_offset, chunk.total_compressed_size) in read[opened:]


def test_page_index_offsets_are_right_for_any_reader(table: pa.Table, tmp_path: Path) -> None:
    """pyarrow records the page index's offsets by the bytes it was given: the blobs written before it must go
    through its stream, or every offset is short by the blob region (a page-index reader then reads garbage)."""
    built = build_superfile(table, SuperfileSpec())
    assert built.sections["pageindex"].offset > built.sections["data"].length  # after the blobs
    path = tmp_path / "t.parquet"
    path.write_bytes(built.data)
    ctx = datafusion.SessionContext()
    ctx.sql("SET datafusion.execution.parquet.pushdown_filters = true").collect()
    ctx.register_parquet("t", str(path))
    wanted = int(table.column("i64")[12_345].as_py())
    got = ctx.sql(f"SELECT _id, text FROM t WHERE i64 = {wanted}").to_arrow_table()
    assert got.column("_id").to_pylist() == [12_345 * 2 + 1]
    assert got.column("text").to_pylist() == [table.column("text")[12_345].as_py()]


def test_a_flipped_byte_in_the_page_index_is_detected(table: pa.Table) -> None:
    built = build_superfile(table.slice(0, 3000), SuperfileSpec())
    section = built.sections["pageindex"]
    data = bytearray(built.data)
    data[section.offset + section.length // 2] ^= 0x01
    with pytest.raises(CorruptSuperfileError, match="pageindex"):
        SuperfileReader.open(bytes(data), name="t")


def test_every_page_readable_type_decodes_as_pyarrow_reads_it(built: bytes, table: pa.Table) -> None:
    """The decoder itself, column by column (a read takes pages only where they save decoding, which narrow
    columns rarely do: their pages hold a whole row group)."""
    meta = pq.read_metadata(pa.BufferReader(built))
    pages = PageReads(pa.py_buffer(built), meta, None)
    rows = np.random.default_rng(3).choice(ROWS, 40, replace=False)
    whole = pq.read_table(pa.BufferReader(built)).take(pa.array(rows))
    readable = []
    for leaf, name in enumerate(meta.schema.to_arrow_schema().names):
        got = pages.read(rows, leaf, when_cheaper=False)
        if got is not None:
            readable.append(name)
            assert got.equals(whole.column(name).combine_chunks()), name
    assert sorted(readable) == sorted(c for c in table.column_names if c != "label")


def test_columns_without_a_distinct_count_keep_pyarrow_s_default() -> None:
    """The writer judges cardinality with Arrow's count_distinct, which has no kernel for some types."""
    data = pa.table({"_id": pa.array([1, 2, 3], pa.uint64()), "nothing": pa.nulls(3), "s": ["a", "b", "c"]})
    reader = SuperfileReader.open(build_superfile(data, SuperfileSpec()).data, name="t")
    got = reader.read(["nothing", "s"], rows=np.array([2, 0]))
    assert got.column("nothing").null_count == 2
    assert got.column("s").to_pylist() == ["c", "a"]


def test_a_damaged_page_is_a_typed_error(table: pa.Table) -> None:
    """Opened without the data checksums (a copy read by ranges), a damaged page header fails the read with
    CorruptSuperfileError naming the column, as a damaged footer or index does, not with a parser's error."""
    data = bytearray(build_superfile(table, SuperfileSpec()).data)
    reader = SuperfileReader.open(bytes(data), name="t")
    leaf = reader._leaves["text"][0]
    pages = reader._pages.pages(leaf)
    assert pages is not None
    data[int(pages.offsets[0])] = 0xFF  # the page header's first field header: no Thrift type
    damaged = SuperfileReader.open(bytes(data), name="t", verify=False)
    with pytest.raises(CorruptSuperfileError, match="'text'"):
        damaged.read(["text"], rows=np.array([3]))


def test_rows_scattered_over_every_row_group_read_only_their_pages(table: pa.Table) -> None:
    """One row in 500, in every row group: each sits in its own small page, so the read gathers those pages
    from all the groups and leaves the rest of the chunks unread (with large pages it decoded the groups)."""
    built = build_superfile(table, SuperfileSpec(row_group_size=4096))
    read: list[tuple[int, int]] = []
    reader = SuperfileReader.open(built.data, name="t", verify=False, ensure=lambda start, n: read.append((start, n)))
    meta = pq.read_metadata(pa.BufferReader(built.data))
    leaf = meta.schema.to_arrow_schema().get_field_index("text")
    chunks = [meta.row_group(g).column(leaf) for g in range(meta.num_row_groups)]
    rows = np.arange(250, ROWS, 500)
    opened = len(read)
    got = reader.read(["text"], rows=rows)
    assert got.column("text").equals(table.column("text").take(pa.array(rows)))
    in_chunks = [
        (s, n)
        for s, n in read[opened:]
        if any(c.data_page_offset <= s < c.data_page_offset + c.total_compressed_size for c in chunks)
    ]
    assert len(in_chunks) == len(rows)  # one page a row, in every row group
    assert sum(n for _, n in in_chunks) < sum(c.total_compressed_size for c in chunks) / 4  # pages of 64 rows


def test_other_readers_read_every_column_as_pyarrow_does(table: pa.Table, tmp_path: Path) -> None:
    """LZ4 pages and delta-packed integers are standard Parquet: DuckDB and DataFusion read the superfile's
    columns back equal to pyarrow's read."""
    built = build_superfile(table, SuperfileSpec())
    meta = pq.read_metadata(pa.BufferReader(built.data))
    chunk = meta.row_group(0).column(meta.schema.to_arrow_schema().get_field_index("i64"))
    assert chunk.compression == "LZ4" and "DELTA_BINARY_PACKED" in chunk.encodings
    path = tmp_path / "t.parquet"
    path.write_bytes(built.data)
    names = ["_id", "i64", "i32", "u64", "f64", "text", "raw", "at", "day", "clock", "price", "label"]
    expected = pq.read_table(path, columns=names)
    ctx = datafusion.SessionContext()
    ctx.register_parquet("t", str(path))
    listed = ", ".join(f'"{n}"' for n in names)
    from_datafusion = ctx.sql(f"SELECT {listed} FROM t ORDER BY _id").to_arrow_table()
    from_duckdb = duckdb.sql(f"SELECT {listed} FROM read_parquet('{path}') ORDER BY _id").to_arrow_table()
    for name in names:
        want = expected.column(name).to_pylist()
        assert from_datafusion.column(name).to_pylist() == want, name
        assert from_duckdb.column(name).to_pylist() == want, name
