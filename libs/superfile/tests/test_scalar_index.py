"""Scalar indexes (``idx/<column>``): every operator against a brute-force pyarrow evaluation, limits, corruption."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from superfile.errors import (
    CorruptSuperfileError,
    InvalidOptionError,
    InvalidPredicateError,
    SchemaMismatchError,
    UnknownColumnError,
)
from superfile.format import (
    BITMAP_CARDINALITY_LIMIT,
    ScalarIndex,
    SuperfileReader,
    SuperfileSpec,
    VectorColumnSpec,
    build_superfile,
)
from superfile.format.scalar_index import prepare_scalar_index

CMP = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}
EPOCH = datetime.datetime(1970, 1, 1)


def rows_of(mask: Any) -> list[int]:
    return np.flatnonzero(np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), bool)).tolist()


def brute(arr: pa.Array, op: str, value: Any) -> list[int]:
    """SQL over the column with pyarrow compute: NULL rows never match; the literal in the column's type."""
    if op == "is_null":
        return rows_of(pc.is_null(arr))
    if op == "is_not_null":
        return rows_of(pc.is_valid(arr))
    if op == "in":  # x IN (a, b) = x = a OR x = b: NaN and NULL members match nothing
        return sorted(set().union(*[brute(arr, "=", v) for v in value if v is not None]))
    return rows_of(CMP[op](arr, pa.scalar(value, arr.type)))


def index_of(arr: pa.Array, kind: str, misalign: int = 0) -> ScalarIndex:
    blob = prepare_scalar_index(arr, kind, "c").encode(misalign)
    return ScalarIndex(memoryview(bytes(misalign) + blob)[misalign:])


def check_all_ops(arr: pa.Array, kind: str, literals: list[Any]) -> None:
    idx = index_of(arr, kind)
    for op in ("is_null", "is_not_null"):
        assert sorted(idx.lookup(op)) == brute(arr, op, None), op
    for v in literals:
        for op in CMP:
            assert sorted(idx.lookup(op, v)) == brute(arr, op, v), (op, v)
    assert sorted(idx.lookup("in", [*literals[:3], None])) == brute(arr, "in", literals[:3])
    for low in literals[:4]:  # one key range == the intersection of its two half-open lookups
        for high in literals[:4]:
            for lop, hop in ((">", "<"), (">=", "<="), (">", "<="), (">=", "<")):
                both = idx.lookup(lop, low) & idx.lookup(hop, high)
                assert idx.lookup_range((lop, low), (hop, high)) == both, (lop, low, hop, high)
        assert idx.lookup_range((">=", low), None) == idx.lookup(">=", low)
        assert idx.lookup_range(None, ("<", low)) == idx.lookup("<", low)


def literals_from(values: list[Any], extra: list[Any]) -> list[Any]:
    present = [v for v in values if v is not None]
    return (present[:4] + extra)[:8] or extra


ints = st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=120)
floats = st.lists(
    st.one_of(st.none(), st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf]), st.floats(-1e3, 1e3, width=32)),
    max_size=120,
)
texts = st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "é", "日本", "Z", "a\x00"])), max_size=120)
any_text = st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=80)
bools = st.lists(st.one_of(st.none(), st.booleans()), max_size=60)
seconds = st.lists(st.one_of(st.none(), st.integers(-(10**6), 10**6)), max_size=80)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@pytest.mark.parametrize("t", [pa.int64(), pa.int8(), pa.uint64(), pa.int32()])
@SETTINGS
@given(values=ints, extra=st.lists(st.integers(-60, 60), min_size=1, max_size=4))
def test_integers(kind: str, t: pa.DataType, values: list[int | None], extra: list[int]) -> None:
    if pa.types.is_unsigned_integer(t):
        values = [None if v is None else abs(v) for v in values]
        extra = [abs(v) for v in extra]
    check_all_ops(pa.array(values, t), kind, literals_from(values, extra))


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@pytest.mark.parametrize("t", [pa.float64(), pa.float32()])
@SETTINGS
@given(values=floats, extra=st.lists(st.sampled_from([math.nan, 0.0, -0.0, 1.5, -1e9, math.inf]), min_size=1))
def test_floats_with_nan(kind: str, t: pa.DataType, values: list[float | None], extra: list[float]) -> None:
    check_all_ops(pa.array(values, t), kind, literals_from(values, extra))


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@pytest.mark.parametrize("t", [pa.string(), pa.large_string(), pa.string_view()])
@SETTINGS
@given(values=st.one_of(texts, any_text), extra=st.lists(st.text(max_size=3), min_size=1, max_size=3))
def test_strings(kind: str, t: pa.DataType, values: list[str | None], extra: list[str]) -> None:
    arr = pa.array(values, t)
    # brute force over plain strings: pyarrow compute lacks some kernels for string_view
    idx = index_of(arr, kind)
    plain = arr.cast(pa.string())
    for op in ("is_null", "is_not_null"):
        assert sorted(idx.lookup(op)) == brute(plain, op, None)
    lits = literals_from(values, extra)
    for v in lits:
        for op in CMP:
            assert sorted(idx.lookup(op, v)) == brute(plain, op, v), (op, v)
    assert sorted(idx.lookup("in", lits)) == brute(plain, "in", lits)


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@pytest.mark.parametrize("t", [pa.binary(), pa.large_binary(), pa.binary_view()])
@SETTINGS
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=4)), max_size=80), extra=st.lists(st.binary(max_size=3)))
def test_binaries(kind: str, t: pa.DataType, values: list[bytes | None], extra: list[bytes]) -> None:
    arr = pa.array(values, t)
    idx = index_of(arr, kind)
    plain = arr.cast(pa.binary())
    assert sorted(idx.lookup("is_null")) == brute(plain, "is_null", None)
    for v in literals_from(values, [*extra, b"\xff"]):
        for op in CMP:
            assert sorted(idx.lookup(op, v)) == brute(plain, op, v), (op, v)


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@SETTINGS
@given(values=bools)
def test_bools(kind: str, values: list[bool | None]) -> None:
    check_all_ops(pa.array(values, pa.bool_()), kind, [True, False])


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@pytest.mark.parametrize("t", [pa.timestamp("s"), pa.timestamp("us"), pa.timestamp("ms", tz="UTC"), pa.date32()])
@SETTINGS
@given(values=seconds, extra=st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=3))
def test_temporals(kind: str, t: pa.DataType, values: list[int | None], extra: list[int]) -> None:
    if pa.types.is_date(t):
        to: Any = lambda s: datetime.date(1970, 1, 1) + datetime.timedelta(days=s // 100)  # noqa: E731
    else:
        tz = datetime.UTC if getattr(t, "tz", None) else None
        to = lambda s: (EPOCH + datetime.timedelta(seconds=s)).replace(tzinfo=tz)  # noqa: E731
    py = [None if v is None else to(v) for v in values]
    check_all_ops(pa.array(py, t), kind, literals_from(py, [to(v) for v in extra]))


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
@SETTINGS
@given(values=st.lists(st.one_of(st.none(), st.sampled_from(["cat", "dog", "bird", "fish"])), max_size=200))
def test_categorical_strings(kind: str, values: list[str | None]) -> None:
    arr = pa.array(values, pa.string())
    check_all_ops(arr, kind, ["cat", "dog", "bird", "fish", "cow"])
    idx = index_of(arr, kind)
    assert sorted(idx.lookup("in", ["cat", "dog"])) == brute(arr, "in", ["cat", "dog"])


@pytest.mark.parametrize("kind", ["bitmap", "sorted"])
def test_dictionary_column_is_rejected(kind: str) -> None:
    with pytest.raises(SchemaMismatchError):
        prepare_scalar_index(pa.array(["a", "b"]).dictionary_encode(), kind, "c")


def test_literals_compare_exactly_in_the_column_type() -> None:
    ints = index_of(pa.array([1, 2, 3, None, 127], pa.int8()), "sorted")
    assert sorted(ints.lookup("<", 2.5)) == [0, 1]
    assert sorted(ints.lookup("=", 2.0)) == [1]
    assert sorted(ints.lookup("=", 2.5)) == []
    assert sorted(ints.lookup("<", 1000)) == [0, 1, 2, 4]  # out of int8's range, still compared exactly
    assert sorted(ints.lookup(">", -1000)) == [0, 1, 2, 4]
    assert sorted(ints.lookup("!=", 1000)) == [0, 1, 2, 4]
    assert sorted(ints.lookup("<", math.inf)) == [0, 1, 2, 4]
    assert sorted(ints.lookup("!=", math.nan)) == [0, 1, 2, 4]  # IEEE: NaN equals nothing
    assert sorted(ints.lookup("<", math.nan)) == []
    assert sorted(ints.lookup("=", None)) == []
    big = index_of(pa.array([2**64 - 1, 0, 2**63], pa.uint64()), "bitmap")
    assert sorted(big.lookup(">=", 2**63)) == [0, 2]
    assert sorted(big.lookup("=", 2**64 - 1)) == [0]
    secs = index_of(pa.array([datetime.datetime(2020, 1, 1, 0, 0, 1)], pa.timestamp("s")), "sorted")
    assert list(secs.lookup(">", datetime.datetime(2020, 1, 1, 0, 0, 0, 999999))) == [0]  # microseconds kept
    assert list(secs.lookup("<", datetime.datetime(2020, 1, 1, 0, 0, 1, 1))) == [0]
    assert list(secs.lookup("=", "2020-01-01T00:00:01")) == [0]
    assert list(secs.lookup(">", datetime.date(2020, 1, 1))) == [0]
    far = index_of(pa.array([datetime.datetime(3000, 1, 1)], pa.timestamp("us")), "sorted")
    assert list(far.lookup("=", datetime.datetime(3000, 1, 1))) == [0]  # beyond the ns range
    floats = index_of(pa.array([0.1, -0.0, math.nan, None], pa.float32()), "sorted")
    assert sorted(floats.lookup("=", 0.1)) == [0]  # the literal is rounded to float32 like the column
    assert sorted(floats.lookup("=", 0.0)) == [1]
    assert sorted(floats.lookup("!=", 0.0)) == [0, 2]
    with pytest.raises(InvalidPredicateError):
        ints.lookup("=", "3")
    with pytest.raises(InvalidPredicateError):
        index_of(pa.array(["a"]), "sorted").lookup("=", 3)
    with pytest.raises(InvalidPredicateError):
        ints.lookup("like", 3)
    with pytest.raises(InvalidPredicateError):
        ints.lookup("in", 3)


def test_empty_and_all_null_columns() -> None:
    for kind in ("bitmap", "sorted"):
        for arr in (pa.array([], pa.int64()), pa.array([None, None], pa.string()), pa.array([None], pa.float64())):
            idx = index_of(arr, kind)
            assert sorted(idx.lookup("is_null")) == list(range(len(arr)))
            assert len(idx.lookup("is_not_null")) == 0
            assert len(idx.lookup("!=", 1 if arr.type != pa.string() else "x")) == 0


def test_misaligned_blob_still_works() -> None:
    arr = pa.array(np.arange(1000) % 7, pa.int64())
    for pad in (0, 1, 3):
        idx = index_of(arr, "sorted", misalign=pad)
        assert sorted(idx.lookup("=", 3)) == brute(arr, "=", 3)
    moved = prepare_scalar_index(arr, "sorted", "c").encode(0)
    idx = ScalarIndex(memoryview(b"x" + moved)[1:])  # not where it was laid out for: arrays are copied once
    assert sorted(idx.lookup(">", 4)) == brute(arr, ">", 4)


def test_cardinality_limit() -> None:
    at_limit = pa.array(np.arange(BITMAP_CARDINALITY_LIMIT, dtype=np.int64))
    assert index_of(at_limit, "bitmap").count == BITMAP_CARDINALITY_LIMIT
    over = pa.array(np.arange(BITMAP_CARDINALITY_LIMIT + 1, dtype=np.int64))
    with pytest.raises(InvalidOptionError, match=r"'label'.*65537 distinct"):
        prepare_scalar_index(over, "bitmap", "label")
    table = pa.table({"_id": pa.array(np.arange(len(over), dtype=np.uint64)), "label": over})
    with pytest.raises(InvalidOptionError, match="label"):
        build_superfile(table, SuperfileSpec(scalar_indexes={"label": "bitmap"}))
    assert index_of(over, "sorted").count == len(over)


def test_spec_validation() -> None:
    table = pa.table({"_id": pa.array([1, 2], pa.uint64()), "x": [1, 2]})
    with pytest.raises(InvalidOptionError):
        build_superfile(table, SuperfileSpec(scalar_indexes={"x": "btree"}))
    with pytest.raises(UnknownColumnError):
        build_superfile(table, SuperfileSpec(scalar_indexes={"nope": "sorted"}))
    with pytest.raises(SchemaMismatchError):
        build_superfile(
            pa.table({"_id": pa.array([1], pa.uint64()), "l": [[1]]}), SuperfileSpec(scalar_indexes={"l": "sorted"})
        )


def sample_table(n: int = 3000) -> pa.Table:
    rng = np.random.default_rng(7)
    labels = np.array(["cat", "dog", "bird", "日本"], dtype=object)[rng.integers(0, 4, n)]
    score = rng.normal(size=n)
    score[::97] = np.nan
    return pa.table(
        {
            "_id": pa.array(np.arange(n, dtype=np.uint64) * 5),
            "text": pa.array([f"doc {i} about {labels[i]}" for i in range(n)]),
            "label": pa.array(labels.tolist(), mask=rng.random(n) < 0.05),
            "score": pa.array(score, mask=rng.random(n) < 0.05),
            "flag": pa.array(rng.random(n) < 0.3),
            "ts": pa.array(rng.integers(0, 10**9, n) * 10**6, pa.timestamp("us")),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=n * 4).astype(np.float32)), 4),
        }
    )


SCALAR = {"label": "bitmap", "score": "sorted", "flag": "bitmap", "ts": "sorted", "text": "sorted", "_id": "sorted"}


@pytest.mark.parametrize("with_other_indexes", [False, True])
def test_round_trip_through_a_superfile(tmp_path: Path, with_other_indexes: bool) -> None:
    data = sample_table()
    spec = SuperfileSpec(
        fts_columns={"text": "simple"} if with_other_indexes else {},
        vector_columns={"emb": VectorColumnSpec(4, "l2")} if with_other_indexes else {},
        scalar_indexes=SCALAR,
        row_group_size=1024,
    )
    if not with_other_indexes:
        data = data.drop_columns(["emb"])
    built = build_superfile(data, spec)
    for column, kind in SCALAR.items():
        s = built.sections[f"idx/{column}"]
        assert s.kind == kind
        entry = next(e for e in built.directory["sections"] if e["name"] == s.name)
        assert entry["column"] == column and entry["type"] == str(data.schema.field(column).type)
    path = tmp_path / "f.parquet"
    path.write_bytes(built.data)
    reader = SuperfileReader.open(path, name="f", cache_dir=str(tmp_path / "cache"))
    assert reader.read().num_rows == data.num_rows
    for column, kind in SCALAR.items():
        idx = reader.scalar_index(column)
        assert idx is reader.scalar_index(column) and idx.kind == kind and idx.num_rows == data.num_rows
        keys = idx._keys if idx._keys is not None else idx._offsets
        assert not keys.flags.owndata  # a view of the memory-mapped file, not a copy
        arr = data.column(column).combine_chunks()
        lits = [v for v in arr.to_pylist() if v is not None][:3]
        for v in lits:
            for op in CMP:
                assert sorted(idx.lookup(op, v)) == brute(arr, op, v), (column, op, v)
    if with_other_indexes:
        assert reader.fulltext("text").match(["cat"])  # the fts metadata is not shadowed by idx/text
        assert reader.vector_index("emb").num_rows == data.num_rows
    with pytest.raises(UnknownColumnError):
        reader.scalar_index("emb" if with_other_indexes else "nope")


def test_corrupt_section_is_detected(tmp_path: Path) -> None:
    data = sample_table(500).drop_columns(["emb"])
    built = build_superfile(data, SuperfileSpec(scalar_indexes={"label": "bitmap", "score": "sorted"}))
    for name in ("idx/label", "idx/score"):
        s = built.sections[name]
        for pos in (s.offset, s.offset + s.length // 2, s.offset + s.length - 1):
            bad = bytearray(built.data)
            bad[pos] ^= 0x40
            with pytest.raises(CorruptSuperfileError, match="crc32"):
                SuperfileReader.open(bytes(bad), name="bad", cache_dir=str(tmp_path))
    # without verify, a damaged header still fails as corruption, not as a random exception
    s = built.sections["idx/label"]
    bad = bytearray(built.data)
    bad[s.offset + 14] = ord("{")
    reader = SuperfileReader.open(bytes(bad), name="bad", verify=False, cache_dir=str(tmp_path))
    with pytest.raises(CorruptSuperfileError):
        reader.scalar_index("label")
    with pytest.raises(CorruptSuperfileError):
        ScalarIndex(b"not an index at all")
