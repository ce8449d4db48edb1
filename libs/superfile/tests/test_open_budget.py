"""The open-superfile budget charges what a reader holds in memory (docs/storage.md, "Open superfiles"): a
mapped superfile costs a handle and its metadata, not its size, so a table larger than the bytes budget is
searched without reopening its superfiles; copies read into memory are charged whole and still evicted. A
warm (``Searcher.warm``) opens what the first searches would, unless the budget cannot keep it open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.table import Supertable
from superfile.table import evolve as evolve_module
from superfile.table.snapshot import open_readers, set_open_budget

DIM = 16
SUPERFILES = 4
ROWS = 3000  # a superfile of ~0.3 MB: mapped (past READ_WHOLE_BYTES) when local
WORDS = ["boundary", "layer", "supersonic", "flutter", "wing", "shock", "wave", "heat", "flow", "plate"]


@pytest.fixture(autouse=True)
def no_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evolve_module, "index_in_background", lambda table: None)


@pytest.fixture
def opens(opened_readers: list[str]) -> list[str]:
    return opened_readers


@pytest.fixture
def budget_of_one_superfile() -> Iterator[None]:
    """An open-bytes budget of about one superfile's size (the handle budget as it was)."""
    saved = open_readers().limits
    set_open_budget(400_000, saved[1])
    try:
        yield
    finally:
        set_open_budget(*saved)


def _table(uri: str) -> Supertable:
    rng = np.random.default_rng(3)
    db = superfile.connect(uri)
    schema = pa.schema(
        [pa.field("key", pa.int64()), pa.field("title", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))]
    )
    table = db.create_table("t", schema=schema, fts_columns=["title"], vector_columns={"vec": {"dim": DIM}})
    for part in range(SUPERFILES):
        keys = np.arange(part * ROWS, (part + 1) * ROWS)
        titles = [" ".join(rng.choice(WORDS, 6)) + f" doc{k}" for k in keys]
        vecs = rng.normal(size=(ROWS, DIM)).astype(np.float32)
        table.append(
            pa.table(
                {"key": keys, "title": titles, "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM)},
                schema=schema,
            )
        )
    return db.open_table("t")


def _searches(table: Supertable) -> list[pa.Table]:
    query = np.ones(DIM, np.float32)
    return [
        table.bm25_search("title", "supersonic flutter", 10, projection=["key"]),
        table.vector_search("vec", query, 10, projection=["key"]),
        table.to_arrow(["key", "title"], where="key % 1000 = 7"),
    ]


def test_mapped_superfiles_past_the_bytes_budget_stay_open(
    tmp_path: Path, opens: list[str], budget_of_one_superfile: None
) -> None:
    """A file:// table of four mapped superfiles, each near the whole bytes budget: the first searches open
    each once, the next ones open none, and each reader is charged its metadata and handles, not its size."""
    table = _table(f"file://{tmp_path}/db")
    sizes = [e.size for e in table._snapshot.entries()]
    assert len(sizes) == SUPERFILES and min(sizes) > 300_000  # each about the budget, together four times it
    first = _searches(table)
    assert sorted(set(opens)) == sorted(opens) and len(opens) >= SUPERFILES  # each superfile opened once
    opens.clear()
    for _ in range(3):
        again = _searches(table)
        assert [a.sort_by("key") for a in again] == [f.sort_by("key") for f in first]
    assert opens == []
    files = table._snapshot.files
    for entry in table._snapshot.entries():
        held_bytes, held_handles = files.open(entry).held()
        assert held_bytes < 100_000 and held_handles >= 1  # its metadata, and its mapping (plus tantivy's)


def test_copies_in_memory_are_charged_whole(opens: list[str], budget_of_one_superfile: None) -> None:
    """The same table on memory:// (each reader a copy in memory, charged its size): the budget holds about
    one of them, so repeated searches open the others again, and answer the same."""
    table = _table(f"memory://open-budget-{np.random.default_rng().integers(1 << 40)}")
    first = _searches(table)
    opens.clear()
    again = _searches(table)
    assert [a.sort_by("key") for a in again] == [f.sort_by("key") for f in first]
    assert len(opens) >= SUPERFILES - 1  # evicted by bytes, opened again
    assert open_readers().totals()[0] <= 400_000 + max(e.size for e in table._snapshot.entries()) + 100_000


def test_warm_opens_what_the_first_searches_would(tmp_path: Path, opens: list[str]) -> None:
    """``Searcher.warm`` opens every superfile of the snapshot and the indexes its searches use: the searches
    after it open nothing, and answer as a table searched cold."""
    from superfile.table.search import Searcher

    table = _table(f"file://{tmp_path}/db")
    cold = _searches(superfile.connect(f"file://{tmp_path}/db").open_table("t"))
    opens.clear()
    warm = superfile.connect(f"file://{tmp_path}/db").open_table("t")
    Searcher(warm._snapshot).warm()
    assert len(opens) == SUPERFILES
    opens.clear()
    assert [a.sort_by("key") for a in _searches(warm)] == [c.sort_by("key") for c in cold]
    assert opens == []
    assert table.count_rows() == SUPERFILES * ROWS


def test_warm_leaves_a_snapshot_that_does_not_stay_open(tmp_path: Path, opens: list[str]) -> None:
    """With room for fewer readers than the snapshot has superfiles, a warm would evict what it opened: it
    opens nothing."""
    from superfile.table.search import Searcher

    table = _table(f"file://{tmp_path}/db")
    saved = open_readers().limits
    set_open_budget(saved[0], 3)  # three handles: fewer than the four superfiles' mappings
    try:
        opens.clear()
        Searcher(table._snapshot).warm()
        assert opens == []
    finally:
        set_open_budget(*saved)
