"""Input through the Arrow PyCapsule stream interface: any ``__arrow_c_stream__`` exporter, readers, iterators.

The engine imports none of polars, DuckDB or pandas; it reads what they export, chunk by chunk, so a large
stream is staged in bounded memory and an input that fails midway commits nothing.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
import superfile
import superfile.table.writer as writer_module
from superfile.errors import InvalidInputError, SchemaMismatchError, SuperfileError
from superfile.schema import to_arrow_table

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score_f", pa.float64())])


class StreamOnly:
    """Speaks only the Arrow PyCapsule stream protocol: no pyarrow type, no ``to_arrow``, no iteration."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self.exports = 0

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        self.exports += 1
        return self._table.__arrow_c_stream__(requested_schema)


def rows(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids], "score_f": [i / 2 for i in ids]}, schema=SCHEMA)


def contents(t: superfile.Supertable) -> list[tuple[int, str, float]]:
    got = t.to_arrow(columns=["id", "name", "score_f"]).sort_by("id")
    return list(zip(*(got.column(c).to_pylist() for c in ("id", "name", "score_f")), strict=True))


def expected(n: int, start: int = 0) -> list[tuple[int, str, float]]:
    return [(i, f"n{i}", i / 2) for i in range(start, start + n)]


@pytest.fixture
def db() -> superfile.Connection:
    return superfile.connect(f"memory://{uuid.uuid4().hex}")


@pytest.fixture
def table(db: superfile.Connection) -> superfile.Supertable:
    return db.create_table("t", SCHEMA)


def sources() -> dict[str, Any]:
    """Each kind of input the issue names, holding rows 0..9."""
    data = rows(10)
    return {
        "polars": lambda: pl.from_arrow(data),
        "duckdb": lambda: duckdb.sql("SELECT range AS id, 'n' || range AS name, range / 2 AS score_f FROM range(10)"),
        "pandas": lambda: data.to_pandas(),
        "reader": lambda: data.to_reader(max_chunksize=3),
        "batch-iterator": lambda: iter(data.to_batches(max_chunksize=4)),
        "batch-generator": lambda: (b for b in data.to_batches(max_chunksize=4)),
        "batch-list": lambda: data.to_batches(max_chunksize=4),
        "stream-only": lambda: StreamOnly(data),
        "pyarrow-table": lambda: data,
        "pyarrow-batch": lambda: data.to_batches()[0],
    }


SOURCES = sources()


# -- the defect: a polars DataFrame crashed append (pandas was detected by class name) ---------------------------


def test_polars_dataframe_appends(table: superfile.Supertable) -> None:
    assert table.append(pl.DataFrame({"id": [1, 2], "name": ["a", "b"], "score_f": [0.5, 1.0]})) == 2
    assert contents(table) == [(1, "a", 0.5), (2, "b", 1.0)]


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_append_accepts_every_arrow_source(table: superfile.Supertable, kind: str) -> None:
    table.append(SOURCES[kind]())
    assert contents(table) == expected(10)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_update_accepts_every_arrow_source(table: superfile.Supertable, kind: str) -> None:
    table.append(rows(10, start=100))
    table.update("id >= 100", SOURCES[kind]())
    assert contents(table) == expected(10)


@pytest.mark.parametrize("kind", ["polars", "duckdb", "pandas", "stream-only", "pyarrow-table", "batch-list"])
def test_create_table_from_arrow_source(db: superfile.Connection, kind: str) -> None:
    t = db.create_table("c", data=SOURCES[kind]())
    assert contents(t) == expected(10)
    name = t.schema.field("name").type
    assert t.schema.field("id").type == pa.int64() and (pa.types.is_string(name) or pa.types.is_large_string(name))


@pytest.mark.parametrize("kind", ["reader", "batch-generator"])
def test_create_table_from_one_shot_stream(db: superfile.Connection, kind: str) -> None:
    t = db.create_table("c", data=SOURCES[kind]())
    assert contents(t) == expected(10)


@pytest.mark.parametrize("kind", ["reader", "batch-generator", "polars", "stream-only"])
def test_schema_and_data_reads_a_one_shot_stream_once(kind: str) -> None:
    """What create_table needs: the schema, and data that still holds every row."""
    from superfile.arrow_input import schema_and_data

    source = SOURCES[kind]()
    schema, data = schema_and_data(source)
    assert schema.names == ["id", "name", "score_f"]
    assert to_arrow_table(data).num_rows == 10


def test_pandas_index_is_not_a_column(table: superfile.Supertable) -> None:
    frame = rows(10).to_pandas().iloc[[9, 3, 5]]  # an index that is no RangeIndex
    table.append(frame)
    table.append(pa.Table.from_pandas(rows(10, start=20).to_pandas().iloc[[1, 0]]))  # __index_level_0__ column
    assert contents(table) == [(3, "n3", 1.5), (5, "n5", 2.5), (9, "n9", 4.5), (20, "n20", 10.0), (21, "n21", 10.5)]


def test_polars_view_types_are_stored_as_plain_types(db: superfile.Connection) -> None:
    frame = pl.DataFrame({"id": [1], "name": ["a"], "blob": [b"x"]})  # exported as string_view, binary_view
    t = db.create_table("v", data=frame)
    assert t.schema.field("name").type == pa.string() and t.schema.field("blob").type == pa.binary()
    t.append(frame)
    assert t.to_arrow(columns=["name", "blob"]).to_pylist() == [{"name": "a", "blob": b"x"}] * 2


def test_stream_with_casts_and_missing_nullable_columns(table: superfile.Supertable) -> None:
    narrow = pl.DataFrame({"id": pl.Series([7, 8], dtype=pl.Int32), "name": ["x", None]})  # score_f missing
    table.append(narrow)
    got = table.to_arrow(columns=["id", "name", "score_f"]).sort_by("id").to_pylist()
    assert got == [{"id": 7, "name": "x", "score_f": None}, {"id": 8, "name": None, "score_f": None}]


# -- typed errors -------------------------------------------------------------------------------------------------


def test_schema_mismatch_in_a_stream_is_typed(table: superfile.Supertable) -> None:
    with pytest.raises(SchemaMismatchError, match="unknown columns"):
        table.append(pl.DataFrame({"id": [1], "nope": [2]}))
    with pytest.raises(SchemaMismatchError, match="'id'"):
        table.append(duckdb.sql("SELECT 'text' AS id"))
    assert table.version == 1 and table.count_rows() == 0


def test_a_batch_that_disagrees_midway_commits_nothing(table: superfile.Supertable) -> None:
    def batches() -> Iterator[pa.RecordBatch]:
        yield from rows(10).to_batches(max_chunksize=5)
        yield pa.record_batch({"id": ["not a number"]})

    with pytest.raises(SchemaMismatchError):
        table.append(batches())
    assert table.version == 1 and table.count_rows() == 0


def test_unsupported_input_names_the_protocol(table: superfile.Supertable) -> None:
    for bad in (42, "text", object(), iter([1, 2])):
        with pytest.raises(InvalidInputError, match="__arrow_c_stream__"):
            table.append(bad)
    with pytest.raises(InvalidInputError):
        table.append(pa.chunked_array([[1, 2]]))  # an array stream, not a stream of record batches
    assert table.version == 1


def test_empty_stream_appends_nothing_but_is_checked(table: superfile.Supertable) -> None:
    assert table.append(pa.RecordBatchReader.from_batches(SCHEMA, iter([]))) == 1
    with pytest.raises(SchemaMismatchError):
        table.append(pa.RecordBatchReader.from_batches(pa.schema([("bad", pa.int64())]), iter([])))
    assert table.append(iter([])) == 1  # an empty iterator: no rows, no commit
    assert table.version == 1


# -- streaming: bounded memory and atomicity ----------------------------------------------------------------------

BATCHES, BATCH_ROWS = 200, 1000


class Counted:
    """A generator of record batches that records how far it has been read."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.produced = 0
        self.fail_at = fail_at
        self.peak_arrow_bytes = 0
        self._base = pa.total_allocated_bytes()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for i in range(BATCHES):
            if i == self.fail_at:
                raise OSError("the source broke")
            self.peak_arrow_bytes = max(self.peak_arrow_bytes, pa.total_allocated_bytes() - self._base)
            self.produced += 1
            yield rows(BATCH_ROWS, start=i * BATCH_ROWS).to_batches()[0]


def test_large_stream_is_staged_batch_by_batch(db: superfile.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    t = db.create_table("big", SCHEMA, write_buffer_bytes=64 * 1024)
    source = Counted()
    at_flush: list[int] = []
    build = writer_module.build_shards

    def recording(*args: Any, **kw: Any) -> Any:
        at_flush.append(source.produced)
        return build(*args, **kw)

    monkeypatch.setattr(writer_module, "build_shards", recording)
    total_bytes = rows(BATCH_ROWS).nbytes * BATCHES
    t.append(iter(source))
    assert t.count_rows() == BATCHES * BATCH_ROWS and t.version == 2
    assert source.produced == BATCHES
    # the first flush came long before the input ended, and flushes kept pace with it
    assert at_flush[0] <= 5, at_flush
    assert len(at_flush) >= BATCHES // 5
    # never more than a few buffers' worth of the input held at once (Arrow's allocator counts exactly)
    assert source.peak_arrow_bytes < total_bytes / 8, (source.peak_arrow_bytes, total_bytes)


def test_stream_that_raises_midway_commits_nothing(db: superfile.Connection) -> None:
    t = db.create_table("big", SCHEMA, write_buffer_bytes=64 * 1024)
    t.append(rows(3))
    source = Counted(fail_at=120)
    with pytest.raises(OSError, match="the source broke"):
        t.append(iter(source))
    assert source.produced == 120  # superfiles were flushed before it broke
    assert t.version == 2 and contents(t) == expected(3)
    assert contents(superfile.connect(db.uri).open_table("big")) == expected(3)


def test_failed_stream_aborts_its_transaction(db: superfile.Connection) -> None:
    t = db.create_table("big", SCHEMA, write_buffer_bytes=64 * 1024)
    tx = t.transaction()
    tx.append(rows(2))
    with pytest.raises(OSError):
        tx.append(iter(Counted(fail_at=50)))
    with pytest.raises(SuperfileError, match="aborted"):  # part of it was staged: the transaction cannot commit
        tx.commit()
    assert t.version == 1 and t.count_rows() == 0
    # an input rejected before anything was staged leaves the transaction usable, as before
    with t.transaction() as tx2:
        tx2.append(rows(2))
        with pytest.raises(SchemaMismatchError):
            tx2.append(pl.DataFrame({"nope": [1]}))
    assert contents(t) == expected(2)


def test_keyed_stream_in_many_chunks_is_dropped_whole_on_a_key_race(db: superfile.Connection) -> None:
    t = db.create_table("big", SCHEMA, write_buffer_bytes=16 * 1024)
    one, two = t.transaction(), db.open_table("big").transaction()
    one.append(rows(1000).to_reader(max_chunksize=100), idempotency_key="k")
    two.append(rows(1000, start=5000).to_reader(max_chunksize=100), idempotency_key="k")  # many chunks, many spans
    two.append(rows(5, start=9000))
    assert one.commit() == 2
    assert two.commit() == 3
    assert contents(t) == expected(1000) + expected(5, start=9000)
    assert t.append(rows(1000).to_reader(), idempotency_key="k") == 2


# -- no third-party imports -----------------------------------------------------------------------------------------


def test_the_engine_needs_none_of_the_producers(tmp_path: Any) -> None:
    """With polars, DuckDB and pandas made unimportable, exporters and iterators are still read."""
    code = f"""
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("polars", "duckdb", "pandas"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import pyarrow as pa, superfile
class S:
    def __init__(self, t): self.t = t
    def __arrow_c_stream__(self, requested_schema=None): return self.t.__arrow_c_stream__(requested_schema)
t = superfile.connect("file://{tmp_path}").create_table("t", data=S(pa.table({{"a": [1, 2]}})))
t.append(S(pa.table({{"a": [3]}})))
t.append(iter(pa.table({{"a": [4]}}).to_batches()))
print(t.count_rows(), [m for m in ("polars", "duckdb", "pandas") if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "4 []", out.stdout + out.stderr
