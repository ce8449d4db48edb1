"""Rendezvous placement (superfile.search.placement), no processes: ``rank`` and ``assign`` agree, a hundred
nodes share a million superfiles of mixed sizes evenly, and a node joining or leaving moves about 1/N of them
(only those it owns)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from superfile.search.placement import assign, rank

NODES = 100
KEYS = 1_000_000


def _keys(n: int, seed: int) -> list[str]:
    """Superfile paths as a table writes them (``data/<uuid hex>.parquet``), seeded."""
    raw = np.random.default_rng(seed).integers(0, 2**63, size=(n, 2), dtype=np.int64)
    return [f"data/{a:016x}{b:016x}.parquet" for a, b in raw.tolist()]


def _nodes(n: int, start: int = 0) -> list[str]:
    return [f"http://cache-{i}.cache.supertable.svc:8100" for i in range(start, start + n)]


def _owner(owned: dict[str, list[str]]) -> dict[str, str]:
    return {k: node for node, keys in owned.items() for k in keys}


@pytest.fixture(scope="module")
def million() -> tuple[list[str], list[str], dict[str, list[str]]]:
    """A million superfiles over a hundred nodes (placed once for the tests that need it)."""
    keys, nodes = _keys(KEYS, seed=16), _nodes(NODES)
    return keys, nodes, assign(keys, nodes)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_rank_and_assign_agree(n: int) -> None:
    keys, nodes = _keys(3000, seed=n), _nodes(n)
    owned = assign(keys, nodes)
    assert sorted(owned) == sorted(nodes)  # every node present, perhaps with no keys
    assert sorted(k for ks in owned.values() for k in ks) == sorted(keys)  # each key exactly once
    owner = _owner(owned)
    for key in keys:
        order = rank(key, nodes)
        assert sorted(order) == sorted(nodes)
        assert order[0] == owner[key]
    shuffled = list(reversed(nodes))
    assert all(rank(k, shuffled) == rank(k, nodes) for k in keys[:200])  # the member list's order is irrelevant
    assert assign(keys, shuffled) == owned


def test_the_next_in_rank_takes_over() -> None:
    """When a key's owner leaves, the key goes to the second node of its rank (the retry target)."""
    keys, nodes = _keys(2000, seed=5), _nodes(5)
    for gone in nodes:
        rest = [n for n in nodes if n != gone]
        owner = _owner(assign(keys, rest))
        for key in keys:
            order = rank(key, nodes)
            assert owner[key] == (order[1] if order[0] == gone else order[0])


def test_edges() -> None:
    assert rank("data/a.parquet", []) == []
    assert assign(["data/a.parquet"], []) == {}
    assert assign([], _nodes(2)) == {n: [] for n in _nodes(2)}
    assert assign(["data/a.parquet", "data/b.parquet"], ["http://x:1"]) == {
        "http://x:1": ["data/a.parquet", "data/b.parquet"]
    }


def _bytes_per_node(keys: Sequence[str], sizes: np.ndarray, owned: dict[str, list[str]]) -> np.ndarray:
    index = {k: i for i, k in enumerate(keys)}
    return np.array([sizes[[index[k] for k in ks]].sum() for ks in owned.values()])


def test_a_million_superfiles_of_mixed_sizes_spread_evenly(
    million: tuple[list[str], list[str], dict[str, list[str]]],
) -> None:
    """Bytes per node: max/mean <= 1.15 with sizes lognormal around 64 MiB (sigma 1: the middle 95% span
    ~50x, small fresh superfiles beside compacted ones). Plain HRW places by count; with these seeds max/mean
    is 1.029 by count and 1.030 by bytes (1.086 at sigma 1.5, 1.30 at sigma 2: heavier tails would need
    size-aware placement)."""
    keys, nodes, owned = million
    counts = np.array([len(owned[n]) for n in nodes])
    assert counts.sum() == KEYS
    assert counts.max() / counts.mean() <= 1.05 and counts.min() / counts.mean() >= 0.95
    sizes = np.random.default_rng(17).lognormal(mean=np.log(64 << 20), sigma=1.0, size=KEYS)
    per_node = _bytes_per_node(keys, sizes, owned)
    assert per_node.sum() == pytest.approx(sizes.sum())
    ratio = per_node.max() / per_node.mean()
    assert ratio <= 1.15, f"max/mean bytes per node {ratio:.3f}"


def test_a_node_leaving_or_joining_moves_about_one_nth(
    million: tuple[list[str], list[str], dict[str, list[str]]],
) -> None:
    keys, nodes, owned = million
    before = _owner(owned)

    gone = nodes[37]
    after = _owner(assign(keys, [n for n in nodes if n != gone]))
    moved = {k for k in keys if after[k] != before[k]}
    assert moved == set(owned[gone])  # exactly the leaving node's superfiles, nothing else
    assert 0.8 / NODES <= len(moved) / KEYS <= 1.2 / NODES
    landed = np.array([sum(1 for k in moved if after[k] == n) for n in nodes if n != gone])
    assert landed.max() <= 3 * landed.mean()  # they scatter over the others, no single heir

    joining = _nodes(1, start=NODES)[0]
    grown = assign(keys, [*nodes, joining])
    moved = {k for k, node in _owner(grown).items() if node != before[k]}
    assert moved == set(grown[joining])  # only to the new node
    assert 0.8 / (NODES + 1) <= len(moved) / KEYS <= 1.2 / (NODES + 1)


@pytest.mark.parametrize("n", [3, 10])
def test_a_small_fleet_grows_by_a_fair_share(n: int) -> None:
    """n -> n + 1 nodes over 20,000 superfiles moves 1/(n + 1) of them, within 10% of that."""
    keys = _keys(20_000, seed=n)
    before = _owner(assign(keys, _nodes(n)))
    after = _owner(assign(keys, _nodes(n + 1)))
    moved = sum(1 for k in keys if after[k] != before[k]) / len(keys)
    assert moved == pytest.approx(1 / (n + 1), rel=0.1)
    assert all(after[k] == _nodes(1, start=n)[0] for k in keys if after[k] != before[k])
