"""One IVF search over many superfiles' vector indexes: exact when exhaustive, as good as per-file otherwise."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap
from superfile.format.vector_index import METRICS, VectorIndex, VectorIndexParams, build_vector_index
from superfile.format.vector_union import VectorUnion
from test_vector_index import clustered, exact, low_rank


def index(x: np.ndarray, metric: str, **params: int | str) -> VectorIndex:
    return VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(**params)))


def split(n: int, bounds: list[int], metric: str, seed: int) -> tuple[np.ndarray, list[VectorIndex], VectorUnion]:
    """``n`` clustered 32-d rows, an index of each slice between ``bounds``, and the union of those indexes."""
    data = clustered(n, 32, seed=seed)
    parts = [index(data[a:b], metric) for a, b in itertools.pairwise(bounds)]
    return data, parts, VectorUnion(parts)


def grouped(hits: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """A union's hits (each one's part, row and distance, by part) as (part, rows, distances) per part with hits."""
    part, rows, dist = hits
    assert len(part) == len(rows) == len(dist) and np.all(part[1:] >= part[:-1])
    return [(p, rows[part == p], dist[part == p]) for p in dict.fromkeys(part.tolist())]


def flat(hits: list[tuple[int, np.ndarray, np.ndarray]], base: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Hits per part as rows of the parts' concatenation, nearest first, and their distances."""
    rows = [base[p] + r for p, r, _ in hits]
    dist = [d for _, _, d in hits]
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    r, d = np.concatenate(rows), np.concatenate(dist)
    order = np.lexsort((r, d))
    return r[order], d[order]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    dim=st.integers(1, 9),
    metric=st.sampled_from(METRICS),
    k=st.integers(1, 12),
)
def test_exhaustive_union_is_exact(seed, sizes, dim, metric, k) -> None:
    """Probing every list of every part and reranking every row is exact search over all parts."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, dim)).astype(np.float32) for n in sizes]
    q = rng.standard_normal(dim).astype(np.float32)
    union = VectorUnion([index(x, metric, nlist=max(1, len(x) // 8)) for x in xs])
    hits = union.top(q, k, range(len(xs)), nprobe=60, rerank=sum(sizes))
    rows, dist = flat(grouped(hits), np.concatenate(([0], np.cumsum(sizes)))[:-1].tolist())
    _, want = exact(np.concatenate(xs), q, metric, k)
    assert len(rows) == min(k, sum(sizes))
    assert np.allclose(dist, want, atol=1e-4)
    _, own = exact(np.concatenate(xs), q, metric, k, rows)  # each hit carries its own exact distance
    assert np.allclose(np.sort(own), dist, atol=1e-4)


@pytest.mark.parametrize("metric", METRICS)
def test_default_knobs_rank_like_the_indexes_one_by_one(metric) -> None:
    """Parts of different sizes (so different default nprobe): recall against exact search is high and no
    worse than searching each index on its own and merging."""
    data = clustered(16_000, 32, seed=3)
    queries = clustered(40, 32, seed=4)
    bounds = [0, 6_000, 10_000, 13_000, 16_000]
    parts = [index(data[a:b], metric) for a, b in itertools.pairwise(bounds)]
    assert len({p.default_nprobe for p in parts}) > 1
    union = VectorUnion(parts)
    got_union = got_each = 0
    for q in queries:
        want = set(exact(data, q, metric, 10)[0].tolist())
        got_union += len(want & set(flat(grouped(union.top(q, 10, range(4))), bounds).__getitem__(0).tolist()))
        each = [(p, *parts[p].search(q, 10)) for p in range(4)]
        got_each += len(want & set(flat(each, bounds)[0][:10].tolist()))
    assert got_union / (10 * len(queries)) >= 0.95
    assert got_union >= got_each - 2


@pytest.mark.parametrize("metric", METRICS)
def test_parts_with_reduced_and_full_codes_rank_together(metric) -> None:
    """Parts whose codes are of their own principal components, beside a part with full codes: the first pass
    maps each part's dot products back onto q.x, so exhaustive search is exact and default search keeps
    recall."""
    data = low_rank(9_000, 128, 16, seed=5)
    queries = low_rank(30, 128, 16, seed=5)[:30] + 0.05
    bounds = [0, 4_000, 6_500, 9_000]
    parts = [index(data[a:b], metric, reduce=p != 1) for p, (a, b) in enumerate(itertools.pairwise(bounds))]
    assert [p.ivf_lists.proj is not None for p in parts] == [True, False, True]
    union = VectorUnion(parts)
    got = 0
    for q in queries:
        _, dist = flat(grouped(union.top(q, 10, range(3), nprobe=10**6, rerank=9_000)), bounds)
        want_rows, want = exact(data, q, metric, 10)
        assert np.allclose(dist, want, atol=1e-4)
        got += len(set(flat(grouped(union.top(q, 10, range(3))), bounds)[0].tolist()) & set(want_rows.tolist()))
    assert got / (10 * len(queries)) >= 0.95


@pytest.mark.parametrize("metric", METRICS)
def test_each_part_ranks_its_allowed_rows_as_its_own_search_does(metric) -> None:
    """``top_each``: a part's answer is what its own ``VectorIndex.search`` with the same rows allowed gives, bit
    for bit, whichever parts are searched with it: a few rows allowed (scanned one by one), many (probed), every
    row, none, and rows past the part's end (ignored)."""
    data, parts, union = split(12_000, [0, 5_000, 9_000, 12_000, 12_400], metric, seed=21)
    rng = np.random.default_rng(3)
    for q in clustered(8, 32, seed=22):
        allow = [
            (0, BitMap(rng.choice(5_000, 30, replace=False).tolist())),
            (1, None),
            (2, BitMap([*rng.choice(3_000, 1_500, replace=False).tolist(), 3_000, 9_999])),
            (3, BitMap()),
        ]
        for knobs in ({}, {"nprobe": 2, "rerank": 12}):
            together = {p: (rows, dist) for p, rows, dist in grouped(union.top_each(q, 10, allow, **knobs))}
            assert set(together) == {0, 1, 2}
            for p, rows_allowed in allow[:3]:
                rows, dist = parts[p].search(q, 10, allow=rows_allowed, **knobs)
                assert np.array_equal(together[p][0], rows) and np.array_equal(together[p][1], dist)
                if rows_allowed is not None:
                    assert set(rows.tolist()) <= set(rows_allowed)
            ((p, rows, dist),) = grouped(union.top_each(q, 10, allow[2:], **knobs))
            assert p == 2 and np.array_equal(rows, together[2][0]) and np.array_equal(dist, together[2][1])
            ((p, rows, dist),) = grouped(union.top_each(q, 10, allow[:1], **knobs))  # 30 rows: the lock kept
            assert p == 0 and np.array_equal(rows, together[0][0]) and np.array_equal(dist, together[0][1])
    with pytest.raises(ValueError, match="named twice"):
        union.top_each(data[0], 10, [(1, None), (1, None)])


@pytest.mark.parametrize("metric", METRICS)
def test_a_few_allowed_rows_are_each_scored(metric) -> None:
    """A part allowing fewer rows than its probing would scan has every allowed row scored, wherever its lists
    lie (none are routed), so with a rerank pool that holds them all its answer is the exact nearest: a few rows
    of a large part, or every row of a small one."""
    bounds = [0, 5_000, 9_000, 12_000, 12_060]
    data, _, union = split(12_060, bounds, metric, seed=23)
    rng = np.random.default_rng(5)
    for q in clustered(4, 32, seed=24):
        allow: list[tuple[int, BitMap | None]] = [
            (p, BitMap(rng.choice(bounds[p + 1] - bounds[p], 40, replace=False).tolist())) for p in range(3)
        ]
        allow.append((3, None))
        for knobs in ({"rerank": 64}, {"nprobe": 1, "rerank": 64}):
            found = grouped(union.top_each(q, 10, allow, **knobs))
            assert [p for p, _, _ in found] == [0, 1, 2, 3]
            for p, rows, dist in found:
                bitmap = allow[p][1]
                allowed = np.arange(60) if bitmap is None else np.array(list(bitmap))
                want_rows, want_dist = exact(data[bounds[p] : bounds[p + 1]], q, metric, 10, allowed)
                assert np.array_equal(rows, want_rows)
                np.testing.assert_allclose(dist, want_dist, rtol=1e-5, atol=1e-5)


def test_a_frozen_bitmaps_positions_are_kept_for_that_bitmap_only() -> None:
    """``top_each`` keeps the allowed rows' positions of a frozen bitmap it was given: asked again with it, and
    with a new bitmap of other rows (which may take the id of a freed one), each answer is the part's own search
    of those rows; a mutable bitmap is never kept (its rows may change)."""
    data = clustered(6_000, 16, seed=5)
    parts = [index(data[:4_000], "l2"), index(data[4_000:], "l2")]
    union = VectorUnion(parts)
    rng = np.random.default_rng(8)
    q = data[17]
    for _ in range(6):
        rows0 = rng.choice(4_000, int(rng.integers(1, 3_000)), replace=False).tolist()
        allowed = FrozenBitMap(rows0)
        want = parts[0].search(q, 10, allow=BitMap(rows0))
        for _ in range(2):
            (p, rows, dist), *_ = grouped(union.top_each(q, 10, [(0, allowed), (1, None)]))
            assert p == 0 and np.array_equal(rows, want[0]) and np.array_equal(dist, want[1])
        del allowed  # its id may now name the next bitmap
    mutable = BitMap(range(0, 4_000, 2))
    union.top_each(q, 10, [(0, mutable)])
    mutable.clear()
    mutable.update(range(1, 4_000, 2))
    ((_, rows, _),) = grouped(union.top_each(q, 10, [(0, mutable)]))
    assert all(r % 2 == 1 for r in rows.tolist())


def test_a_repeated_filter_is_answered_from_the_kept_positions_and_they_stay_bounded() -> None:
    """The same frozen bitmaps give the same allowed rows without joining them again, a new one its own rows,
    and however many filters come, at most 64 joined answers are kept."""
    data = clustered(6_000, 16, seed=6)
    parts = [index(data[:4_000], "l2"), index(data[4_000:], "l2")]
    union = VectorUnion(parts)
    rng = np.random.default_rng(9)
    q = data[5]
    first = FrozenBitMap(rng.choice(4_000, 500, replace=False).tolist())
    found = union._allowed([(0, first), (1, None)])
    assert union._allowed([(0, first), (1, None)]) is found
    for _ in range(100):
        other = FrozenBitMap(rng.choice(4_000, int(rng.integers(1, 3_000)), replace=False).tolist())
        (p, rows, _), *_ = grouped(union.top_each(q, 10, [(0, other), (1, None)]))
        assert p == 0 and set(rows.tolist()) <= set(other)
        assert len(union._whole) <= 64
    parts_, allowed, positions = union._allowed([(0, first), (1, None)])
    assert parts_.tolist() == [0, 1] and allowed.tolist() == [500, 2_000] and len(positions) == 500


def test_only_the_named_parts_are_searched() -> None:
    xs = [clustered(500, 8, seed=s) for s in range(3)]
    union = VectorUnion([index(x, "l2") for x in xs])
    q = xs[1][7]
    hits = grouped(union.top(q, 5, [0, 2]))
    assert {p for p, _, _ in hits} <= {0, 2}
    assert sum(len(r) for _, r, _ in hits) == 5
    assert grouped(union.top(q, 5, [])) == []
    (p, rows, dist), *_ = grouped(union.top(q, 1, [1]))
    assert (p, rows.tolist(), float(dist[0])) == (1, [7], 0.0)


def test_short_lists_widen_the_probe() -> None:
    """k beyond the rows of the nprobe nearest lists: probing goes on until k rows were seen."""
    x = clustered(400, 8, seed=9)
    union = VectorUnion([index(x, "cosine", nlist=50), index(x[:30], "cosine", nlist=10)])
    hits = grouped(union.top(x[0], 80, [0, 1], nprobe=1))
    assert sum(len(r) for p, r, _ in hits if p == 0) + sum(len(r) for p, r, _ in hits if p == 1) == 80


def test_rejects_what_it_cannot_search() -> None:
    x = clustered(300, 8)
    with pytest.raises(ValueError, match="IVF"):
        VectorUnion([index(x, "l2"), index(x, "l2", kind="hnsw")])
    with pytest.raises(ValueError, match="one dimension and metric"):
        VectorUnion([index(x, "l2"), index(x, "cosine")])
    with pytest.raises(ValueError):
        VectorUnion([])


@pytest.mark.parametrize("metric", METRICS)
def test_a_union_keeps_views_of_its_parts_not_copies(metric) -> None:
    """A union is cached per snapshot for the table's life: what it allocates must scale with the parts' lists,
    not their centroids' or rows' floats (a stacked copy grew a serving process with every row the table took)."""
    parts = [index(clustered(8_000, 96, seed=s), metric) for s in range(4)]
    centroid_bytes = sum(p.ivf_lists.centroids.nbytes for p in parts)
    tracemalloc.start()
    try:
        union = VectorUnion(parts)
        union.top(clustered(1, 96, seed=9)[0], 10, range(len(parts)))
        allocated = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert allocated < centroid_bytes / 4, f"{allocated} bytes held against {centroid_bytes} of centroids"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.sampled_from([2, 8, 64]), st.sampled_from(METRICS))
def test_superfile_bounds_rule_out_no_member(seed: int, files: int, dim: int, metric: str) -> None:
    """Routing (``superfile_bounds``, one compiled call) orders superfiles by a distance that none of their
    vectors beats: from the manifest's summary (centroid and covering radius) to the query, under the metric;
    by descending centroid dot product under dot, which has no bound."""
    from superfile.format.ivf_scan import superfile_bounds
    from superfile.manifest.summary import vector_summary

    rng = np.random.default_rng(seed)
    members = [
        rng.normal(rng.normal(0, 3, dim), rng.uniform(0.1, 2), (int(rng.integers(1, 40)), dim)) for _ in range(files)
    ]
    members = [m.astype(np.float32) for m in members]
    summaries = [vector_summary(m, metric) for m in members]
    centroids = np.stack([s.centroid for s in summaries])
    radii = np.array([s.radius for s in summaries])
    q = rng.normal(0, 3, dim).astype(np.float32)
    at = rng.permutation(files)
    order, bound = superfile_bounds(centroids, radii, at, q, metric)
    assert sorted(order.tolist()) == list(range(files))
    if metric == "dot":
        dots = (centroids[at] @ q)[order]
        assert np.all(dots[:-1] >= dots[1:] - 1e-4 * np.abs(dots[:-1])) and not bound.any()
        return
    assert np.all(bound[:-1] <= bound[1:])
    for i, b in zip(order.tolist(), bound.tolist(), strict=True):
        v = members[at[i]].astype(np.float64)
        if metric == "cosine":
            nearest = float(np.min(1 - (v @ q) / (np.linalg.norm(v, axis=1) * np.linalg.norm(q))))
        else:
            nearest = float(np.min(((v - q) ** 2).sum(axis=1)))
        assert b <= nearest + 1e-9
