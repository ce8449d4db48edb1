"""A change is a value: every ``Change`` the engine builds round-trips through JSON exactly, holds no code,
and publishing the decoded copy (as a change sent elsewhere would be) does what publishing the original does.

The ``sent`` fixture makes every commit of the table handle go through JSON text; the scenarios cover each
kind of change the engine builds: append, delete, update, a keyed transaction (and its lost key race), a
compaction whose carry moves a racing delete, a transaction whose deletes rebase over a compaction, and a
builder-style transaction with fencing requirements.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyroaring
import pytest
import superfile
from maintenance_worker import SCHEMA, batch
from superfile.commit import publish as publish_module
from superfile.commit.change import Carry, Change, Deletion, Rebase, id_array, id_bytes
from superfile.commit.requirements import (
    AssertBefore,
    AssertPropertyAtMost,
    AssertPropertyEquals,
    AssertSchemaId,
    AssertTableUUID,
    AssertVersion,
    RequirementFailedError,
    requirement_from_json,
)
from superfile.evolution import schema_id
from superfile.table import Supertable
from superfile.table import evolve as evolve_module
from superfile.table import optimize as optimize_module


def _equal(a: Any, b: Any) -> bool:
    """Exact structural equality (numpy arrays by dtype and contents: a dataclass ``==`` cannot compare those)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def _no_code(value: Any, where: str = "change") -> None:
    """No field of the change, at any depth, is something to call."""
    assert not callable(value), f"{where} is callable: {value!r}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _no_code(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_code(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _no_code(v, f"{where}[{i}]")


def _round_trip(change: Change, table: Supertable) -> Change:
    schema = table.schema
    text = json.dumps(change.to_json(schema))  # plain JSON: no numpy scalars, bytes or bitmaps left in it
    again = Change.from_json(json.loads(text), schema)
    assert _equal(again, change)
    assert json.dumps(again.to_json(schema)) == text
    _no_code(change)
    return again


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Change]]:
    """Every change a table handle commits, as built; what is published is its copy decoded from JSON."""
    changes: list[Change] = []
    commit = Supertable.commit

    def through_json(self: Supertable, change: Change, **kwargs: Any) -> Any:
        changes.append(change)
        return commit(self, _round_trip(change, self), **kwargs)

    monkeypatch.setattr(Supertable, "commit", through_json)
    yield changes


def _table(name: str = "t", **options: Any) -> tuple[superfile.Connection, Supertable]:
    db = superfile.connect(f"memory://{uuid.uuid4().hex}")
    t = db.create_table(name, SCHEMA, fts_columns=["text"], vector_columns={"emb": {"dim": 8}}, **options)
    return db, t


def _kept(t: Supertable) -> set[tuple[int, int, int]]:
    rows = t.to_arrow(["worker", "seq", "i"]).to_pylist()
    return {(r["worker"], r["seq"], r["i"]) for r in rows}


def test_change_has_no_callable_fields() -> None:
    hints = {f.name: str(f.type) for f in dataclasses.fields(Change)}
    assert not [n for n, t in hints.items() if "Callable" in t], hints
    assert set(hints) == {
        "table_uuid",
        "operation",
        "added",
        "deletions",
        "properties",
        "removed",
        "requires",
        "record_keys",
        "carry",
        "rebase",
        "schema",
    }


def test_writes_and_keyed_transactions_round_trip(sent: list[Change]) -> None:
    db, t = _table()
    t.append(batch(0, 0, 10))
    t.delete("i < 2")
    t.update("i = 5", batch(1, 0, 1))
    with t.transaction() as tx:
        tx.append(batch(0, 1, 4), idempotency_key="k-1")
        tx.delete("seq = 0 AND i = 9", idempotency_key="k-2")
        tx.set_properties(source={"offsets": [1, 2, 3]})
    assert t.append(batch(0, 1, 4), idempotency_key="k-1") == tx.commit_version  # a repeat publishes nothing
    # two transactions racing with one key: the loser drops that append and publishes the rest
    a, b = db.open_table("t").transaction(), db.open_table("t").transaction()
    a.append(batch(2, 0, 3), idempotency_key="race")
    b.append(batch(3, 0, 3), idempotency_key="race")
    b.append(batch(3, 1, 2))
    a.commit()
    b.commit()
    kinds = [c.operation for c in sent]
    assert kinds == ["append", "delete", "update", "transaction", "append", "append", "append"]
    keyed = sent[3]
    assert keyed.record_keys == ("k-1", "k-2") and keyed.properties == {"source": {"offsets": [1, 2, 3]}}
    assert sent[-2].record_keys == ("race",)  # refused: `a` recorded the key first
    assert sent[-1].record_keys == () and sent[-1].deletions  # the retry: the keyed rows deleted from its superfile
    updated = sent[2]
    assert updated.rebase is not None and len(id_array(updated.rebase.replaced)) == 1
    assert next(iter(updated.deletions.values())).ids_of(pyroaring.BitMap([5])).tolist() == [5]
    expected = {(0, 0, i) for i in range(2, 9) if i != 5} | {(1, 0, 0)} | {(0, 1, i) for i in range(4)}
    assert _kept(t) == expected | {(2, 0, i) for i in range(3)} | {(3, 1, i) for i in range(2)}


def test_optimize_carry_round_trips_and_moves_a_racing_delete(sent: list[Change], monkeypatch: Any) -> None:
    db, t = _table(max_rows_per_superfile=100)
    for seq in range(6):
        t.append(batch(0, seq, 10))
    t.delete("seq = 0 AND i < 3")
    other = db.open_table("t")
    build = optimize_module._Rewrite.add
    landed: list[int] = []

    def add_then_delete(self: Any, shards: Any) -> None:
        build(self, shards)
        if not landed:  # outputs built, not yet published: a concurrent delete commits now
            landed.append(other.delete("seq IN (0, 5) AND i >= 5"))

    monkeypatch.setattr(optimize_module._Rewrite, "add", add_then_delete)
    result = t.optimize()
    assert result["deletes_carried"] == 10
    optimize = sent[-1]
    assert optimize.operation == "optimize" and optimize.carry is not None and len(optimize.removed) == 6
    assert [len(id_array(optimize.carry.ids[e.path])) for e in optimize.added] == [e.rows for e in optimize.added]
    everything = {(0, s, i) for s in range(6) for i in range(10)}
    assert _kept(t) == everything - {(0, 0, i) for i in range(3)} - {(0, s, i) for s in (0, 5) for i in range(5, 10)}


def test_rebased_deletes_and_updates_round_trip(sent: list[Change], monkeypatch: Any) -> None:
    followed: list[tuple[Change, list[Deletion]]] = []
    real_follow = publish_module.follow

    def recording(current: Any, store: Any, change: Change, lost: Any) -> list[Deletion]:
        found = real_follow(current, store, change, lost)
        followed.append((change, found))
        return found

    monkeypatch.setattr(publish_module, "follow", recording)
    db, t = _table(max_rows_per_superfile=100)
    for seq in range(4):
        t.append(batch(0, seq, 5))
    deleting = db.open_table("t").transaction()
    deleting.delete("seq = 1")
    updating = db.open_table("t").transaction()
    updating.update("seq = 2 AND i = 0", batch(9, 2, 1))
    orphan = db.open_table("t").transaction()
    orphan.update("seq = 3 AND i = 4", batch(8, 3, 1))
    db.open_table("t").optimize()  # moves every row the transactions staged deletes of
    db.open_table("t").delete("seq = 3 AND i = 4")  # and removes the row `orphan` replaces
    deleting.commit()
    updating.commit()
    orphan.commit()  # the update of a row deleted meanwhile adds nothing
    assert [c.operation for c in sent[-5:]] == ["optimize", "delete", "delete", "update", "update"]
    everything = {(0, s, i) for s in range(4) for i in range(5)}
    assert _kept(t) == (everything - {(0, 1, i) for i in range(5)} - {(0, 2, 0), (0, 3, 4)}) | {(9, 2, 0)}
    assert all(c.rebase is not None for c in sent if c.operation in {"delete", "update"})
    # each transaction's deletes were followed onto the compaction's output; the orphan's onto its own row
    assert [len(found) for _, found in followed] == [1, 1, 1]
    (change, (own,)) = followed[-1]
    assert own.entry.path in {e.path for e in change.added} and len(own.rows) == 1


def test_builder_style_requirements_round_trip(sent: list[Change]) -> None:
    _, t = _table()
    topic = "superfile.t"

    def fenced(start: int, fence: int) -> list[Any]:
        deadline = int(time.time() * 1000) + 60_000
        return [
            AssertPropertyEquals(("log_offsets", topic), start, default=0),
            AssertPropertyAtMost(("log_fences", topic), fence, default=0),
            AssertBefore(deadline),
        ]

    with t.transaction(requires=fenced(0, 3)) as tx:
        tx.append(batch(0, 0, 2))
        tx.set_properties(log_offsets={topic: 5}, log_fences={topic: 3})
    assert [type(r) for r in sent[-1].requires] == [AssertPropertyEquals, AssertPropertyAtMost, AssertBefore]
    stale = t.transaction(requires=fenced(0, 3))  # the table has applied up to offset 5 since
    stale.append(batch(0, 1, 2))
    with pytest.raises(RequirementFailedError, match="log_offsets") as failed:
        stale.commit()
    assert failed.value.actual == 5
    older = t.transaction(requires=fenced(5, 2))  # a newer fence committed
    older.append(batch(0, 1, 2))
    with pytest.raises(RequirementFailedError) as failed:
        older.commit()
    assert isinstance(failed.value.requirement, AssertPropertyAtMost) and failed.value.actual == 3
    late = t.transaction(requires=[AssertBefore(int(time.time() * 1000) - 1)])  # a lease that ran out
    late.append(batch(0, 1, 2))
    with pytest.raises(RequirementFailedError):
        late.commit()
    assert t.count_rows() == 2


def test_schema_changes_round_trip(sent: list[Change], monkeypatch: Any) -> None:
    """Every schema evolution is a change carrying the next schema (field ids, schema id, the earlier
    schemas' names, defaults in metadata) and options, requiring the schema it was planned on; its JSON
    gives it back byte for byte, and an append staged before it publishes after it."""
    monkeypatch.setattr(evolve_module, "index_in_background", lambda table: None)  # no commit of another thread
    db, t = _table()
    t.append(batch(0, 0, 4))
    staged = db.open_table("t").transaction()
    staged.append(batch(1, 0, 2))
    t.add_columns([pa.field("note", pa.string()), pa.field("n", pa.int64(), nullable=False)], defaults={"n": 3})
    t.rename_column("text", "body")
    t.alter_column_type("i", pa.int64())
    t.drop_columns("note")
    t.drop_index("emb")
    t.create_fts_index("body", tokenizer="simple")
    staged.commit()  # staged under the first schema: its superfile keeps its names, its entry is re-keyed
    changes = [c for c in sent if c.schema is not None]
    assert [c.operation for c in changes] == [
        "add_columns",
        "rename_column",
        "alter_column_type",
        "drop_columns",
        "drop_index",
        "create_index",
    ]
    for n, change in enumerate(changes):
        assert change.requires == (AssertSchemaId(n),) and not change.added and not change.deletions
        assert change.schema is not None and schema_id(change.schema.schema) == n + 1
    assert changes[-1].schema is not None and dict(changes[-1].schema.options.fts_columns) == {"body": "simple"}
    rows = t.to_arrow(["worker", "i", "body", "n"]).sort_by([("worker", "ascending"), ("i", "ascending")])
    assert rows.schema.field("i").type == pa.int64()
    assert rows.column("n").to_pylist() == [3] * 6 and rows.column("worker").to_pylist() == [0] * 4 + [1] * 2
    assert sorted(t.token_match("body", "w1s0", projection=["i"]).column("i").to_pylist()) == [0, 1]


@pytest.mark.parametrize(
    "requirement",
    [
        AssertTableUUID("0f" * 16),
        AssertVersion(7),
        AssertPropertyEquals(("a", "b"), {"x": [1, "2"]}, default=None),
        AssertPropertyAtMost(("log_fences", "t"), 4),
        AssertBefore(1_700_000_000_000),
        AssertSchemaId(3),
    ],
)
def test_each_requirement_round_trips(requirement: Any) -> None:
    assert requirement_from_json(json.loads(json.dumps(requirement.to_json()))) == requirement


def test_values_refuse_what_they_cannot_describe() -> None:
    with pytest.raises(ValueError, match="unknown requirement"):
        requirement_from_json({"type": "call-this"})
    with pytest.raises(ValueError):
        AssertPropertyEquals((), 1)
    entry = _table()[1]
    entry.append(batch(0, 0, 3))
    e = entry.snapshot().entries()[0]
    with pytest.raises(ValueError):
        Deletion(e, pyroaring.FrozenBitMap([1, 2]), id_bytes(np.array([7], np.uint64)))
    d = Deletion.of(e, np.array([2, 0, 2]), np.array([12, 10, 12]))
    assert list(d.rows) == [0, 2] and d.ids_of(pyroaring.BitMap([2])).tolist() == [12]
    with pytest.raises(ValueError):
        d.ids_of(pyroaring.BitMap([1]))
    assert Carry.from_json(Carry({e.path: d.ids}).to_json()) == Carry({e.path: d.ids})
    assert Rebase.from_json(Rebase(d.ids).to_json()) == Rebase(d.ids)
