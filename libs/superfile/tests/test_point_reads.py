"""Point reads: rows fetched by offset decode only the Parquet pages holding them, with results identical
to whole row groups (the path of superfiles without a page table)."""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import superfile
import superfile.commit.build as build
from superfile.errors import CorruptSuperfileError
from superfile.format import SuperfileReader, SuperfileSpec, build_superfile
from superfile.format.pages import PAGES_SECTION
from superfile.format.reader import PAGE_READS_ENV
from superfile.format.thrift import decode_struct, encode_struct

N = 20_000
# small pages and groups, so that a row group holds many pages and every kind of selection crosses them
SMALL = SuperfileSpec(row_group_size=4096, page_bytes=2048, dictionary_page_bytes=1024)


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    i = np.arange(n).tolist()
    ia = np.arange(n)
    some_null = (ia % 7 == 3).tolist()
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    text = [
        None if s else f"row {k} " + " ".join(words[rng.integers(0, 8, 6)]) for k, s in zip(i, some_null, strict=True)
    ]
    ts = np.datetime64("2024-01-01T00:00:00", "us") + (ia * 1_234_567).astype("timedelta64[us]")
    return pa.table(
        {
            "_id": pa.array(ia * 2 + 1, pa.uint64()),
            "n": pa.array(ia, pa.int64()),
            "f": pa.array(np.where(ia % 7 == 3, np.nan, ia / 3.0)),
            "flag": pa.array(ia % 3 == 0),
            "label": pa.array([f"c{k % 50}" for k in i]),  # dictionary-encoded throughout
            "text": pa.array(text, pa.string()),  # unique, with nulls: outgrows the dictionary
            "big": pa.array(text, pa.large_string()),
            "blob": pa.array(
                [None if s else bytes([k % 251]) * (k % 40) for k, s in zip(i, some_null, strict=True)], pa.binary()
            ),
            "ts": pa.array(ts, pa.timestamp("us")),
            "ts_tz": pa.array(ts.astype("datetime64[ms]"), pa.timestamp("ms", tz="Europe/Paris")),
            "day": pa.array((ia % 20000).astype("int32"), pa.int32()).cast(pa.date32()),
            "price": pa.array(
                [None if s else decimal.Decimal(k) / 100 for k, s in zip(i, some_null, strict=True)],
                pa.decimal128(12, 2),
            ),
            "wide": pa.array([decimal.Decimal(k) * 10**20 for k in i], pa.decimal128(38, 0)),
            "tags": pa.array([[int(k), int(k) + 1][: k % 3] if k % 5 else None for k in i], pa.list_(pa.int32())),
            "cat": pa.array([f"k{k % 9}" for k in i]).dictionary_encode(),
            "small": pa.array(ia % 120, pa.int8()),
            "nothing": pa.nulls(n, pa.string()),
            "pair": pa.array([{"a": int(k), "b": f"s{k}"} for k in i]),  # two leaves: whole row groups
        }
    )


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal tables, NaN equal to NaN (``Table.equals`` says NaN != NaN)."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        if pa.types.is_floating(x.type):
            if not pc.is_nan(x).equals(pc.is_nan(y)):
                return False
            x, y = pc.if_else(pc.is_nan(x), 0.0, x), pc.if_else(pc.is_nan(y), 0.0, y)
        if not x.equals(y):
            return False
    return True


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return _rows(N)


@pytest.fixture(scope="module", params=["zstd", "lz4"])
def files(request: pytest.FixtureRequest, table: pa.Table) -> dict[str, bytes]:
    spec = replace(SMALL, compression=request.param)
    return {
        "pages": build_superfile(table, spec).data,
        "old": build_superfile(table, replace(spec, page_index=False)).data,
    }


@pytest.fixture
def whole_groups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(PAGE_READS_ENV, "0")
    yield


SELECTIONS = {
    "scattered": np.arange(11, N, 997),  # one row in ~every 1000: a page each
    "clustered": np.arange(8000, 8300),
    "first": np.array([0]),
    "last": np.array([N - 1]),
    "edges": np.array([0, 4095, 4096, 8191, 8192, N - 1]),  # both sides of row group boundaries
    "unsorted, repeated": np.array([19_000, 3, 19_000, 7_777, 3, 12_345]),
    "dense": np.arange(0, N, 2),  # more than half of every page: whole row groups
}


@pytest.mark.parametrize("selection", list(SELECTIONS))
def test_rows_by_pages_equal_whole_row_groups(
    files: dict[str, bytes], table: pa.Table, selection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = SELECTIONS[selection]
    columns = [c for c in table.column_names if c != "_id"]
    expected = pq.read_table(pa.BufferReader(files["old"]), columns=columns).take(pa.array(offsets))
    for kind in ("pages", "old"):
        reader = SuperfileReader.open(files[kind], name=kind)
        got = reader.read(columns, rows=offsets)
        assert got.schema == expected.schema
        assert same(got, expected), (kind, selection)
        monkeypatch.setenv(PAGE_READS_ENV, "0")
        assert same(reader.read(columns, rows=offsets), expected), (kind, selection, "row groups")
        monkeypatch.delenv(PAGE_READS_ENV)
    assert expected.column("tags").to_pylist() == table.column("tags").take(pa.array(offsets)).to_pylist()
    assert expected.column("ts_tz").type == pa.timestamp("ms", tz="Europe/Paris")


def test_scattered_reads_go_by_pages(files: dict[str, bytes]) -> None:
    """The point of it: a sparse selection of a column is read from its pages, a dense one from its groups."""
    reader = SuperfileReader.open(files["pages"], name="pages")
    pager = reader._page_reader()
    assert pager is not None
    sparse, dense = SELECTIONS["scattered"], SELECTIONS["dense"]
    few = SELECTIONS["unsorted, repeated"]
    for column in ("n", "text", "big", "blob", "ts", "ts_tz", "price", "wide", "tags"):
        leaf = reader._leaves[column][0]
        _, picked, cost, whole = pager.plan(leaf, few)
        assert len(picked) == 4 and cost < whole / 2, column  # 4 distinct rows in 3 row groups
        if column in ("text", "big"):  # ~4 rows in each 4096-row group: 4 of its ~60 pages
            assert pager.plan(leaf, sparse)[2] < whole * 0.2
        _, _, cost, whole = pager.plan(leaf, dense)
        assert cost > whole / 2, column
    assert not pager.supports("pair", reader._leaves["pair"])  # a struct: two leaves
    assert SuperfileReader.open(files["old"], name="old")._page_reader() is None


def test_fewer_bytes_for_a_scattered_fetch(files: dict[str, bytes], table: pa.Table) -> None:
    """0.1% of the rows, spread over every row group: the byte ranges the reader asks for (what a remote
    read fetches) are a fraction of those of the row groups holding the rows."""
    offsets = np.arange(5, N, 1000)  # 0.1%, in every row group
    columns = ["n", "text", "ts", "price", "tags"]

    def asked(kind: str, pages: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, pa.Table]:
        sizes: list[int] = []
        reader = SuperfileReader.open(files[kind], name=kind, verify=False, ensure=lambda o, n: sizes.append(n))
        sizes.clear()  # the footer
        monkeypatch.setenv(PAGE_READS_ENV, "1" if pages else "0")
        got = reader.read(columns, rows=offsets)
        return sum(sizes), got

    with pytest.MonkeyPatch.context() as mp:
        by_pages, a = asked("pages", True, mp)
        by_groups, b = asked("pages", False, mp)
        old, c = asked("old", True, mp)
    assert same(a, b) and same(a, c)
    assert by_pages * 2.5 < by_groups, (by_pages, by_groups)
    assert by_pages * 2.5 < old, (by_pages, old)


def test_old_readers_and_other_engines_read_the_new_files(
    files: dict[str, bytes], table: pa.Table, tmp_path: Path
) -> None:
    path = tmp_path / "new.parquet"
    path.write_bytes(files["pages"])
    columns = ["n", "text", "price", "ts_tz", "tags"]
    assert same(pq.read_table(path, columns=columns), table.select(columns))
    md = pq.read_metadata(path)
    assert md.row_group(0).column(1).has_offset_index and md.row_group(0).column(1).has_column_index
    count = duckdb.execute(f"SELECT count(*), sum(n) FROM read_parquet('{path}') WHERE label = 'c7'").fetchall()[0]
    assert count == (N // 50, sum(k for k in range(N) if k % 50 == 7))


def test_damaged_page_table_is_corruption(files: dict[str, bytes]) -> None:
    reader = SuperfileReader.open(files["pages"], name="p")
    s = reader.sections[PAGES_SECTION]
    damaged = bytearray(files["pages"])
    damaged[s.offset] ^= 0xFF  # its magic number
    with pytest.raises(CorruptSuperfileError):
        SuperfileReader.open(bytes(damaged), name="p")  # verify: the section checksum
    unchecked = SuperfileReader.open(bytes(damaged), name="p", verify=False)
    with pytest.raises(CorruptSuperfileError, match="page table"):
        unchecked.read(["n"], rows=np.array([1, 2]))


def test_footer_thrift_round_trip(files: dict[str, bytes]) -> None:
    data = files["old"]
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[len(data) - 8 - length : -8]
    decoded, end = decode_struct(footer)
    assert end == len(footer) and encode_struct(decoded) == footer
    head, _ = decode_struct(footer, until=2)
    assert set(head) == {1, 2} and head[2] == decoded[2]


def test_page_sizes_follow_the_spec(table: pa.Table) -> None:
    """Pages end near ``page_bytes`` even for narrow values (pyarrow checks the size every batch of rows)."""
    small = SuperfileReader.open(build_superfile(table, SMALL).data, name="s")._page_reader()
    default = SuperfileReader.open(build_superfile(table, replace(SMALL, page_bytes=1 << 20)).data, name="d")
    assert small is not None and default._page_reader() is not None
    leaf = 1  # "n": int64, 2 KiB pages hold ~256 of them
    counts = small._leaf(leaf).counts
    assert 128 <= np.median(counts) <= 512


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    original = build.superfile_spec
    monkeypatch.setattr(
        build, "superfile_spec", lambda options: replace(original(options), page_bytes=2048, dictionary_page_bytes=1024)
    )


def test_table_fetches_with_deletes_equal_whole_row_groups(
    small_pages: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = superfile.connect(f"file://{tmp_path}")
    rows = _rows(N).drop_columns(["_id", "pair", "tags", "cat"])  # the types a table stores
    t = db.create_table("t", rows.schema, max_rows_per_superfile=8000)
    t.append(rows)
    t.delete("n % 1000 = 17 OR (n >= 5000 AND n < 5100)")
    wheres = ["label = 'c17'", "label = 'c3'", "n IN (3, 17017, 9999, 5050, 19999)", "small = 5"]
    columns = ["n", "text", "big", "blob", "ts", "ts_tz", "day", "price", "wide", "f", "flag", "nothing"]
    for where in wheres:
        by_pages = t.to_arrow(columns=columns, where=where)
        sql = db.sql(f"SELECT {', '.join(columns)} FROM t WHERE {where} ORDER BY n")
        monkeypatch.setenv(PAGE_READS_ENV, "0")
        by_groups = t.to_arrow(columns=columns, where=where)
        monkeypatch.delenv(PAGE_READS_ENV)
        assert by_pages.num_rows > 0
        assert same(by_pages, by_groups), where
        assert same(sql, by_pages.sort_by("n")), where
        assert 17 not in by_pages.column("n").to_pylist() and 5050 not in by_pages.column("n").to_pylist()
