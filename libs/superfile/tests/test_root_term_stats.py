"""A query root's BM25 statistics across versions: each superfile's share is asked once and kept (it depends
only on the superfile and its deletion vector), so after a commit only what is new is asked, none once the
version's statistics were warmed, and every answer is still the embedded search's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import superfile
from superfile.search import root
from superfile.search.leaf import LeafRequest, run
from superfile.search.root import RootSearcher
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield"
QUERIES = ["shock waves on a cone", "boundary layer transition", "flutter of panels at supersonic speeds"]


class RecordingFleet:
    """Runs every leaf call in this process, as one node holding every superfile, and records them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def run(self, snap: Snapshot, paths: list[str], op: str, args: dict[str, Any]) -> list[Any]:
        self.calls.append((op, sorted(paths)))
        return [run(snap, LeafRequest("docs", snap.path, tuple(paths), op, args))] if paths else []

    def stats_calls(self) -> list[list[str]]:
        return [paths for op, paths in self.calls if op == "bm25_stats"]


@pytest.fixture
def table() -> Any:
    docs = pq.read_table(CRANFIELD / "docs.parquet").select(["id", "title", "text"])
    db = superfile.connect(f"memory://root-terms-{os.urandom(6).hex()}")
    t = db.create_table("docs", docs.schema, fts_columns=["text"])
    for start in range(0, 800, 100):
        t.append(docs.slice(start, 100))
    t.docs = docs
    return t


def _searched_alike(snap: Snapshot, fleet: RecordingFleet) -> None:
    """Every query through the root equals the embedded search of the same version (ids, order, scores)."""
    for q in QUERIES:
        want = Searcher(snap).bm25_search("text", q, 10, "any", ["id"])
        got = RootSearcher(snap, fleet).bm25_search("text", q, 10, "any", ["id"])
        assert got["id"].to_pylist() == want["id"].to_pylist(), q
        assert got["score"].to_pylist() == pytest.approx(want["score"].to_pylist(), rel=1e-6), q


def _new(before: Snapshot, after: Snapshot) -> set[str]:
    old = {(e.path, e.deletes) for e in before.entries()}
    return {e.path for e in after.entries() if (e.path, e.deletes) not in old}


def test_after_a_commit_only_the_new_superfiles_are_asked(table: Any) -> None:
    fleet = RecordingFleet()
    first = table.snapshot()
    _searched_alike(first, fleet)
    assert fleet.stats_calls(), "the first version's statistics come from the leaves"
    asked_first = {p for paths in fleet.stats_calls() for p in paths}

    table.append(table.docs.slice(0, 100))  # the same texts again: every query's terms are in the new superfile
    second = table.snapshot()
    fleet.calls.clear()
    _searched_alike(second, fleet)
    asked = {p for paths in fleet.stats_calls() for p in paths}
    assert asked == _new(first, second), "only the new superfile's share is asked"
    assert asked and not asked & asked_first

    table.delete("id > 700 AND id <= 740")  # a deletion vector on one superfile (its rows are not copied)
    third = table.snapshot()
    fleet.calls.clear()
    _searched_alike(third, fleet)
    asked = {p for paths in fleet.stats_calls() for p in paths}
    assert asked == _new(second, third) and len(asked) == 1, "only the superfile whose deletes changed"

    fleet.calls.clear()
    _searched_alike(third, fleet)  # the same version again: its own cache answers
    assert fleet.stats_calls() == []


def test_warmed_statistics_leave_no_round_for_the_next_search(table: Any) -> None:
    fleet = RecordingFleet()
    _searched_alike(table.snapshot(), fleet)
    before = table.snapshot()
    table.append(table.docs.slice(100, 100))
    after = table.snapshot()
    fleet.calls.clear()
    RootSearcher(after, fleet).warm_term_stats()
    assert {p for paths in fleet.stats_calls() for p in paths} == _new(before, after)
    fleet.calls.clear()
    _searched_alike(after, fleet)
    assert fleet.stats_calls() == [], "the searched terms' statistics were gathered on the commit"


def test_a_leaf_reports_each_superfiles_share(table: Any) -> None:
    table.delete("id > 150 AND id < 170")
    snap = table.snapshot()
    paths = [e.path for e in snap.entries()]
    terms = ["shock", "wave", "laminar"]
    answer = run(snap, LeafRequest("docs", snap.path, tuple(paths), "bm25_stats", {"column": "text", "terms": terms}))
    each = answer["superfiles"]
    assert {path for path, _, _ in each} <= set(paths)
    assert [sum(df[i] for _, df, _ in each) for i in range(len(terms))] == answer["df"]
    assert sum(length for _, _, length in each) == answer["deleted_tokens"] > 0
    assert (answer["df"], answer["deleted_tokens"]) == tuple(Searcher(snap).term_stats("text", terms))
    assert pa.types.is_integer(pa.array(answer["df"]).type)


def test_a_table_past_the_cache_is_asked_whole(table: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the shares one search may keep, every holder is asked each time (a cache that small for the table
    would only churn) and the warmer leaves the table alone; the answers stay the embedded ones."""
    monkeypatch.setattr(root, "_SHARES_PER_SEARCH", 3)
    fleet = RecordingFleet()
    before = table.snapshot()
    _searched_alike(before, fleet)
    table.append(table.docs.slice(0, 100))
    after = table.snapshot()
    fleet.calls.clear()
    RootSearcher(after, fleet).warm_term_stats()
    assert fleet.calls == []
    _searched_alike(after, fleet)
    asked = {p for paths in fleet.stats_calls() for p in paths}
    assert asked > _new(before, after), "the superfiles seen before are asked again"
