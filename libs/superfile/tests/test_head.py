"""``superfile.table.head``: the first rows of a scan, reading only the superfiles that hold them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import superfile
from superfile.errors import InvalidInputError, InvalidPredicateError, UnknownColumnError
from superfile.manifest.model import SuperfileEntry
from superfile.table import Supertable
from superfile.table.head import head
from superfile.table.snapshot import Snapshot


@pytest.fixture
def table(tmp_path: Path) -> Supertable:
    """Keys 0..49 in five appends of ten (five superfiles), keys 12 and 13 deleted."""
    db = superfile.Connection(f"file://{tmp_path}")
    t = db.create_table("t", pa.schema({"key": pa.int64(), "text": pa.string()}), fts_columns=["text"])
    for start in range(0, 50, 10):
        t.append(
            {
                "key": list(range(start, start + 10)),
                "text": [f"row {k} {'even' if k % 2 == 0 else 'odd'}" for k in range(start, start + 10)],
            }
        )
    t.delete("key IN (12, 13)")
    return t


@pytest.mark.parametrize("limit", [1, 9, 10, 11, 25, 48, 49, 1000])
@pytest.mark.parametrize("where", [None, "key >= 17", "key % 2 = 0", "key > 100"])
def test_head_is_the_start_of_the_scan(table: Supertable, limit: int, where: str | None) -> None:
    full = table.to_arrow(columns=["_id", "key"], where=where)
    got = head(table.snapshot(), limit, ["_id", "key"], where)
    assert got.equals(full.slice(0, limit)), (limit, where)
    assert got.schema == full.schema


def test_head_reads_only_the_superfiles_it_needs(table: Supertable, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = table.snapshot()
    read: list[str] = []
    original = Snapshot.read_matching

    def counted(self: Snapshot, entry: SuperfileEntry, *args: Any, **kwargs: Any) -> pa.Table:
        read.append(entry.path)
        return original(self, entry, *args, **kwargs)

    monkeypatch.setattr(Snapshot, "read_matching", counted)
    assert head(snap, 10).column("key").to_pylist() == list(range(10))
    assert len(read) == 1  # the first superfile holds them
    read.clear()
    assert head(snap, 11).column("key").to_pylist() == list(range(11))
    assert len(read) == 3  # the first, then a wave of two (the second superfile has 8 live rows)
    read.clear()
    assert head(snap, 3, ["key"], "key >= 30").column("key").to_pylist() == [30, 31, 32]
    assert len(read) == 1  # the statistics rule out the first three superfiles
    read.clear()
    assert head(snap, 45).num_rows == 45
    assert len(read) == 5
    read.clear()
    assert table.to_arrow().slice(0, 10).equals(head(snap, 10))
    assert len(read) == 6  # the whole scan reads every superfile for the same first ten rows; head one


def test_head_defaults_and_errors(table: Supertable, tmp_path: Path) -> None:
    snap = table.snapshot()
    assert head(snap, 2).column_names == table.schema.names  # every column, _id first
    assert head(table.checkout(2).snapshot(), 100).num_rows == 10  # a past version
    empty = superfile.Connection(f"file://{tmp_path / 'empty'}").create_table(
        "e", pa.schema([pa.field("key", pa.int64())])
    )
    assert head(empty.snapshot(), 5).num_rows == 0 and head(empty.snapshot(), 5).column_names == ["_id", "key"]
    with pytest.raises(UnknownColumnError, match="nope"):
        head(snap, 1, ["nope"])
    with pytest.raises(InvalidPredicateError):
        head(snap, 1, None, "key ==== 1")
    for bad in (0, -1, True):
        with pytest.raises(InvalidInputError, match="positive integer"):
            head(snap, bad)
