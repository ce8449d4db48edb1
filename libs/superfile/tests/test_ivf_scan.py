"""The compiled steps of an IVF search: what numpy computes, the same for a part alone or among others, bounds
checked, and the interpreter lock let go."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from superfile.format import ivf_scan
from superfile.format.ivf_scan import IvfParts
from superfile.format.vector_index import (
    METRICS,
    VectorIndex,
    VectorIndexParams,
    build_vector_index,
)
from superfile.format.vector_sections import IvfLists, exact_distances, query_length
from test_vector_index import clustered, low_rank


class Steps(IvfParts):
    """The kernels' steps one by one, as the fused calls (``first_pass``, ``first_pass_each``) run them inside:
    each checked here against numpy, and the fused calls against them."""

    def __init__(self, parts: list[IvfLists], metric: str) -> None:
        super().__init__(parts, metric)
        self.metric = metric

    def reranked(self, part: np.ndarray, pos: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact distances to ``q`` and the row offsets of positions ``pos`` of parts ``part``, each vector
        read where it lies (a copy of the pool, then its distances, read and wrote the vectors twice more)."""
        dist, rows = np.empty(len(pos), np.float32), np.empty(len(pos), np.int64)
        part, pos = np.ascontiguousarray(part, np.int64), np.ascontiguousarray(pos, np.int64)
        q, metric = ivf_scan._query(q, self._dim), ivf_scan._METRICS[self.metric]
        if not ivf_scan._rerank(
            self._vectors_at, self._part, self._row_ids_at, self._dim, part, pos, q, metric, dist, rows
        ):
            raise IndexError("a position out of its part's rows")
        return dist, rows

    def route(self, q: np.ndarray, parts: np.ndarray) -> np.ndarray:
        """``bias - 2 c.q`` of every list of ``parts`` (smaller is nearer), in one array numbering the lists of
        all the parts in order (part p's first at the sum of the earlier parts' list counts); other parts' 0."""
        out = np.zeros(self.lists, np.float32)
        parts = np.asarray(parts, np.int64)
        if len(parts) and (parts.min() < 0 or parts.max() >= len(self._parts)):
            raise IndexError(f"parts must be in [0, {len(self._parts)})")
        ivf_scan._route(
            self._cent_at, self._bias_at, self.nlist, self._dim, parts, self._first, ivf_scan._query(q, self._dim), out
        )
        return out

    def query_codes(self, q: np.ndarray, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The query coded for each of ``parts`` as its codes are: ``q8`` (one row per part, the widest code's
        columns, a part's first ``code dims`` used; other parts' rows 0), and per part the ``step`` and
        ``offset`` such that ``step * (q8 . code) + offset`` estimates q.x for any of its rows: the query (or its
        principal components in the part's basis) times the part's per-component scales, as int8 with a step
        per part. One call for all the parts."""
        parts = np.ascontiguousarray(parts, np.int64)  # (a part named twice is coded twice, the same)
        if len(parts) and (parts.min() < 0 or parts.max() >= len(self._parts)):
            raise IndexError(f"parts must be in [0, {len(self._parts)})")
        q8 = np.zeros((len(self._parts), self.width), np.int8)
        step, offset = np.zeros(len(self._parts), np.float64), np.zeros(len(self._parts), np.float64)
        for p in parts.tolist():
            ivf_scan._code(
                self._proj_at,
                self._mean_at,
                self._scale_at,
                self._dims,
                self._dim,
                p,
                ivf_scan._query(q, self._dim),
                q8,
                step,
                offset,
            )
        return q8, step, offset

    def probes(self, q: np.ndarray, parts: np.ndarray, nprobe: int, k: int) -> np.ndarray:
        """The lists :meth:`first_pass` probes in ``parts`` (ascending, distinct), as ascending list numbers."""
        parts = np.ascontiguousarray(parts, np.int64)
        scores = self.route(q, parts)
        count = np.minimum(nprobe, self.nlist[parts]) if nprobe else self.nprobe[parts]
        out = np.empty(self.lists, np.int64)
        return out[
            : ivf_scan._choose(scores, parts, count, k, self.nlist, self._first, self.size, self._part[:, 2], out)
        ]

    def nearest(
        self, q8: np.ndarray, step: np.ndarray, offset: np.ndarray, runs: np.ndarray, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``count`` rows of ``runs`` (rows of part, first position, length) of the smallest keys, each row
        by its index in run order, ties at the cut to the lower index, kept in a heap as the rows are scored: the
        indices ascending, and their keys."""
        self._check(q8, step, offset)
        heap_key, heap_at = np.empty(max(count, 0), np.float64), np.empty(max(count, 0), np.int64)
        size = ivf_scan._nearest_runs(self._part, q8, step, offset, self._l2, runs, heap_key, heap_at)
        order = np.argsort(heap_at[:size])
        return heap_at[:size][order], heap_key[:size][order]

    def nearest_each(
        self, q8: np.ndarray, step: np.ndarray, offset: np.ndarray, rows: np.ndarray, count: np.ndarray
    ) -> np.ndarray:
        """For each part p, the indices into ``rows`` of its ``count[p]`` rows of the smallest keys, ties at the
        cut to the lower index, ascending. ``rows`` ascend in the parts' joint numbering (part p's rows follow
        the earlier parts': :attr:`base`). A part's pool is picked from its keys: a heap per part, for pools of
        ~13% of the rows (a filter's), cost ~0.8 ms more over 25K rows, its sift-downs branching unpredictably.
        A part whose rows all fit its pool is not scored."""
        self._check(q8, step, offset)
        want = np.asarray(count, np.int64)
        if want.shape != (len(self._parts),) or np.any(want < 0):
            raise ValueError(f"a count for each of {len(self._parts)} parts was expected")
        keys, out = np.empty(len(rows), np.float64), np.empty(min(len(rows), int(want.sum())), np.int64)
        return out[: ivf_scan._nearest_each(self._part, q8, step, offset, self._l2, rows, self.base, want, keys, out)]

    def _check(self, q8: np.ndarray, step: np.ndarray, offset: np.ndarray) -> None:
        # the kernels check positions, not the query: a wrong shape would read past it
        parts = len(self._parts)
        if q8.shape != (parts, self.width) or step.shape != (parts,) or offset.shape != (parts,):
            raise ValueError(f"a query coded for {parts} parts of width {self.width} was expected")


def lowest(keys: np.ndarray, count: int) -> np.ndarray:
    """The indices of the ``count`` smallest keys, ties to the lower index, ascending: a full sort's answer."""
    return np.sort(np.lexsort((np.arange(len(keys)), keys))[: max(count, 0)])


def lists_of(x: np.ndarray, metric: str, reduce: bool) -> IvfLists:
    lists = VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(reduce=reduce))).ivf_lists
    assert lists is not None and (lists.proj is not None) == reduce
    return lists


def coded(lists: IvfLists, q: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The query coded for one index as its own search codes it: (q8 row, step, offset)."""
    q8, step, offset = Steps([lists], "cosine").query_codes(q, np.zeros(1, np.int64))
    return q8[0], float(step[0]), float(offset[0])


def expected_keys(lists: IvfLists, q: np.ndarray, pos: np.ndarray, metric: str) -> np.ndarray:
    """The key of each row as numpy computes it: exact integer dots, then float64 in the documented order."""
    q8, step, offset = coded(lists, q)
    dots = lists.codes[pos].astype(np.int64) @ q8.astype(np.int64)
    if metric == "l2":
        norms = lists.norms[pos]
        return (norms * norms).astype(np.float64) - 2.0 * (dots * step + offset)
    return -step * dots.astype(np.float64) - offset


@pytest.fixture(scope="module", params=METRICS)
def mixed(request: pytest.FixtureRequest) -> tuple[str, list[IvfLists]]:
    """Three parts of one metric: two of principal-component codes (of their own bases), one of full codes."""
    metric = request.param
    return metric, [lists_of(low_rank(3_000, 128, 16, seed=s), metric, reduce=s != 1) for s in range(3)]


def keys_of(scan: IvfParts, coded_q: tuple[np.ndarray, np.ndarray, np.ndarray], runs: np.ndarray) -> np.ndarray:
    """Every row's key, in run order: the nearest of all the rows, with their keys."""
    index, keys = scan.nearest(*coded_q, runs, int(runs[:, 2].sum()))
    assert np.array_equal(index, np.arange(runs[:, 2].sum()))
    return keys


def test_keys_are_numpys_bit_for_bit_over_runs_of_several_parts_and_over_single_rows(
    mixed: tuple[str, list[IvfLists]],
) -> None:
    metric, parts = mixed
    scan = Steps(parts, metric)
    assert scan.width == 128  # part 1 keeps full codes; the others are of fewer components
    rng = np.random.default_rng(0)
    for q in low_rank(4, 128, 16, seed=9):
        coded_q = scan.query_codes(q, np.arange(3))
        runs = np.array([[2, 100, 700], [0, 0, 1], [1, 2_500, 500], [0, 2_999, 1], [2, 0, 0]], np.int64)
        want = np.concatenate([expected_keys(parts[p], q, np.arange(a, a + n), metric) for p, a, n in runs])
        assert np.array_equal(keys_of(scan, coded_q, runs), want)
        pos = np.sort(rng.permutation(3_000)[:400])  # a filter's rows: runs of one row
        single = np.stack((np.full(400, 2), pos, np.ones(400, np.int64)), 1)
        assert np.array_equal(keys_of(scan, coded_q, single), expected_keys(parts[2], q, pos, metric))


@pytest.mark.parametrize("count", [0, 1, 40, 200, 5_000])
def test_the_nearest_are_the_smallest_keys_ties_to_the_lower_index(
    mixed: tuple[str, list[IvfLists]], count: int
) -> None:
    """The heap kept while scoring holds what a full sort of the keys would pick, also where many
    keys tie: a part searched twice in one call gives every row two equal keys."""
    metric, parts = mixed
    scan = Steps(parts, metric)
    runs = np.array([[0, 0, 3_000], [2, 500, 1_000], [0, 0, 3_000], [1, 10, 7]], np.int64)
    for q in low_rank(3, 128, 16, seed=13):
        coded_q = scan.query_codes(q, np.arange(3))
        keys = keys_of(scan, coded_q, runs)
        index, found = scan.nearest(*coded_q, runs, count)
        assert np.array_equal(index, lowest(keys, count)) and np.array_equal(found, keys[index])


@pytest.mark.parametrize("count", [0, 1, 40, 5_000])
def test_a_pool_per_part_holds_each_parts_own_nearest(mixed: tuple[str, list[IvfLists]], count: int) -> None:
    """``nearest_each``: each part's rows are chosen among themselves (ties to the lower index), as if each part
    were searched alone; a part whose rows all fit its pool is taken whole; rows must ascend."""
    metric, parts = mixed
    scan = Steps(parts, metric)
    assert scan.base.tolist() == [0, 3_000, 6_000, 9_000]
    rng = np.random.default_rng(19)
    rows = np.sort(rng.choice(9_000, 4_000, replace=False))
    counts = np.array([count, 3, count], np.int64)
    for q in low_rank(3, 128, 16, seed=17):
        coded_q = scan.query_codes(q, np.arange(3))
        part = np.searchsorted(scan.base, rows, side="right") - 1
        keys = keys_of(scan, coded_q, np.stack((part, rows - scan.base[part], np.ones(len(rows), np.int64)), 1))
        bounds = np.searchsorted(rows, scan.base)
        want = np.concatenate(
            [a + lowest(keys[a:b], int(counts[p])) for p, (a, b) in enumerate(itertools.pairwise(bounds))]
        )
        assert np.array_equal(scan.nearest_each(*coded_q, rows, counts), want)
    with pytest.raises(IndexError, match="ascend"):
        scan.nearest_each(*coded_q, rows[::-1].copy(), counts)
    with pytest.raises(IndexError, match="ascend"):
        scan.nearest_each(*coded_q, np.array([5, 9_000]), counts)
    with pytest.raises(ValueError, match="a count for each"):
        scan.nearest_each(*coded_q, rows, counts[:2])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_pool_is_the_lowest_keys_ties_to_the_lower_index(dtype: type) -> None:
    """A part's pool is picked from its keys through a sampled bound where they are many: the same indices a full
    sort gives, for keys of every shape (many ties at the cut, the smallest last, all equal)."""
    rng = np.random.default_rng(7)
    makers: list[Callable[[int], np.ndarray]] = [
        lambda n: rng.standard_normal(n),
        lambda n: rng.integers(0, 20, n).astype(float),  # many ties at the cut
        lambda n: np.sort(rng.standard_normal(n))[::-1].copy(),  # the smallest keys last
        lambda n: np.zeros(n),
    ]
    for trial in range(400):
        n, count = int(rng.integers(0, 6000)), int(rng.integers(0, 80))
        keys = makers[trial % len(makers)](n).astype(dtype).astype(np.float64)
        a = int(rng.integers(0, 5))  # a part's keys start anywhere in the buffer
        buffer = np.concatenate((rng.standard_normal(a), keys))
        out = np.empty(n, np.int64)
        found = out[: ivf_scan._smallest(buffer, a, a + n, count, out, 0)] - a
        assert np.array_equal(found, lowest(keys, count)), (n, count, trial % len(makers))


def test_the_rows_to_score_are_the_allowed_rows_of_the_probed_lists() -> None:
    """Every row of a list marked whole, the allowed rows of the others, ascending; lists not probed (and empty
    lists) give nothing."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        size = rng.integers(0, 6, int(rng.integers(1, 12))).astype(np.int64)
        first = np.concatenate(([0], np.cumsum(size)[:-1])).astype(np.int64)
        total = int(size.sum())
        rows = np.flatnonzero(rng.random(total) < rng.random())
        lists = np.flatnonzero(rng.random(len(size)) < 0.7)
        whole = rng.random(len(size)) < 0.3
        out = np.empty(len(rows) + int(size.sum()), np.int64)
        got = out[: ivf_scan._list_rows(rows, first, first + size, lists, whole, out)]
        allowed = set(rows.tolist())
        want = [r for lst in lists for r in range(first[lst], first[lst] + size[lst]) if whole[lst] or r in allowed]
        assert got.tolist() == want


def test_a_part_is_routed_and_coded_among_others_as_alone_and_as_numpy_would(
    mixed: tuple[str, list[IvfLists]],
) -> None:
    """Bit for bit the same scores and codes whichever parts a query goes to (so a union probes the lists and
    scores the rows a part's own search does); within float32 rounding of numpy's products."""
    metric, parts = mixed
    union = Steps(parts, metric)
    first = np.concatenate(([0], np.cumsum([len(p.bias) for p in parts])))
    for q in low_rank(4, 128, 16, seed=11):
        scores = union.route(q, np.array([2, 0]))
        assert not scores[first[1] : first[2]].any()  # part 1 not asked for
        q8, step, offset = union.query_codes(q, np.array([0, 2, 2]))
        assert step[1] == 0.0 and not q8[1].any()
        for p in (0, 2):
            lists = parts[p]
            alone = Steps([lists], metric)
            own = alone.route(q, np.zeros(1, np.int64))
            assert np.array_equal(scores[first[p] : first[p + 1]], own)
            np.testing.assert_allclose(own, lists.bias - 2.0 * (lists.centroids @ q), rtol=1e-5, atol=1e-5)
            own_q8, own_step, own_offset = coded(lists, q)
            width = lists.codes.shape[1]
            assert (step[p], offset[p]) == (own_step, own_offset)
            assert np.array_equal(q8[p, :width], own_q8) and not q8[p, width:].any()
            # numpy's coding: the projection (or q), scaled, over the step, rounded
            x = q if lists.proj is None else q @ lists.proj
            np.testing.assert_allclose(offset[p], 0.0 if lists.mean is None else float(q @ lists.mean), atol=1e-5)
            np.testing.assert_allclose(step[p], np.abs(x * lists.scale).max() / 127.0, rtol=1e-5)
            assert np.abs(own_q8.astype(int) - np.rint(x * lists.scale / step[p])).max() <= 1


def test_rows_outside_a_part_and_a_query_of_the_wrong_shape_are_refused() -> None:
    part = lists_of(clustered(1_000, 8), "l2", reduce=False)
    scan = Steps([part], "l2")
    q8, step, offset = np.zeros((1, 8), np.int8), np.ones(1), np.zeros(1)
    for runs in ([[0, 990, 11]], [[0, -1, 2]], [[1, 0, 5]], [[-1, 0, 1]], [[0, 1_000, 1]]):
        with pytest.raises(IndexError):
            scan.nearest(q8, step, offset, np.array(runs, np.int64), 10)
    with pytest.raises(ValueError, match="coded for 1 parts"):
        scan.nearest(np.zeros((1, 4), np.int8), step, offset, np.array([[0, 0, 1]], np.int64), 10)
    assert len(scan.nearest(q8, step, offset, np.array([[0, 0, 1_000]], np.int64), 1_000)[0]) == 1_000


def test_a_scan_lets_other_threads_run() -> None:
    """The whole first pass is one call without the interpreter lock: a thread running Python meanwhile is
    never held up for long (were the call to hold the lock, that thread would stop for the whole call)."""
    part = lists_of(clustered(20_000, 192, centers=20), "cosine", reduce=False)
    scan = Steps([part], "cosine")
    q8, step, offset = scan.query_codes(part.vectors[0], np.zeros(1, np.int64))
    scan.nearest(q8, step, offset, np.array([[0, 0, 1]]), 10)  # compiled (or loaded) first
    runs = np.array([[0, 0, 20_000]] * 1_500, np.int64)  # 30M rows: ~0.2 s since the dots are summed in float32
    running, stop, longest = threading.Event(), threading.Event(), [0.0]

    def other() -> None:
        last = time.perf_counter()
        running.set()
        while not stop.is_set():
            now = time.perf_counter()
            longest[0], last = max(longest[0], now - last), now

    thread = threading.Thread(target=other)
    thread.start()
    running.wait(10)
    start = time.perf_counter()
    scan.nearest(q8, step, offset, runs, 10)
    took = time.perf_counter() - start
    stop.set()
    thread.join(10)
    assert took > 0.1  # long enough for a held lock to show
    assert longest[0] < took / 4


def test_where_no_directory_can_keep_the_compiled_code_each_process_compiles_it() -> None:
    """A read-only image without a home gives numba nowhere to cache: the scan still imports and scores."""
    program = """
import numba.core.caching, numpy as np
numba.core.caching.CacheImpl._locator_classes = []  # no writable place, as on a read-only root filesystem
from superfile.format import ivf_scan
from superfile.format.vector_index import VectorIndex, build_vector_index
x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
lists = VectorIndex.from_buffer(build_vector_index(x, "l2")).ivf_lists
part, dist, rows = ivf_scan.IvfParts([lists], "l2").first_pass(x[3], np.zeros(1, np.int64), 0, 10, 500)
print(type(ivf_scan._first_pass._cache).__name__, rows.tobytes().hex())
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    cache, rows = out.stdout.split()
    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    lists = lists_of(x, "l2", reduce=False)
    assert cache == "NullCache"
    assert rows == IvfParts([lists], "l2").first_pass(x[3], np.zeros(1, np.int64), 0, 10, 500)[2].tobytes().hex()
    assert len(rows) == 500 * 16  # every row (500 fit the pool), as int64


def test_a_rerank_gives_each_rows_exact_distance_as_every_rerank_does(mixed: tuple[str, list[IvfLists]]) -> None:
    """Each row's distance read where it lies is, bit for bit, what ``exact_distances`` gives for a copy of it
    (the index's, the union's and the exact kernel's reranks agree), and its row offset is the part's."""
    metric, parts = mixed
    scan = Steps(parts, metric)
    rng = np.random.default_rng(4)
    part = np.sort(rng.integers(0, len(parts), 500))
    pos = np.array([rng.integers(0, len(parts[p].row_ids)) for p in part.tolist()], np.int64)
    q = scan._parts[0].vectors[7] + np.float32(0.5)
    if metric == "cosine":
        q = q / np.float32(query_length(q))
    dist, rows = scan.reranked(part, pos, q)
    v = np.stack([parts[p].vectors[i] for p, i in zip(part, pos, strict=True)])
    norms = np.array([parts[p].norms[i] for p, i in zip(part, pos, strict=True)])
    assert np.array_equal(dist, exact_distances(v, q, norms, metric))
    assert np.array_equal(rows, np.array([parts[p].row_ids[i] for p, i in zip(part, pos, strict=True)]))
    assert scan.reranked(part[:0], pos[:0], q)[0].shape == (0,)
    for bad_part, bad_pos in ((0, len(parts[0].row_ids)), (0, -1), (len(parts), 0)):
        with pytest.raises(IndexError):
            scan.reranked(np.array([bad_part]), np.array([bad_pos]), q)


def test_allowed_positions_are_each_parts_row_positions_ascending(mixed: tuple[str, list[IvfLists]]) -> None:
    """Per part, the allowed row offsets (past its rows dropped) mapped to positions, sorted, numbered after the
    earlier parts; a part allowing every row or none is counted, not listed."""
    metric, parts = mixed
    scan = Steps(parts, metric)
    rng = np.random.default_rng(5)
    n = [len(x.row_ids) for x in parts]
    allowed = [
        np.sort(rng.choice(n[0] + 50, 300, replace=False)).astype(np.uint32),  # many (marked); some past the end
        np.arange(n[1], dtype=np.uint32),  # every row
        np.sort(rng.choice(n[2], 20, replace=False)).astype(np.uint32),  # few (sorted)
    ]
    for order in ([2, 0, 1], [0, 2]):
        ids = np.concatenate([allowed[p] for p in order])
        ends = np.cumsum([len(allowed[p]) for p in order])
        counts, rows = scan.positions(np.array(order), ids, ends)
        kept = [allowed[p][allowed[p] < n[p]] for p in order]
        assert counts.tolist() == [len(k) for k in kept]
        listed = [
            np.sort(parts[p].row_pos[k]).astype(np.int64) + scan.base[p]
            for p, k in zip(order, kept, strict=True)
            if len(k) < n[p]
        ]
        assert np.array_equal(rows, np.concatenate(listed))
    assert scan.positions(np.array([1]), np.zeros(0, np.uint32), np.array([0]))[0].tolist() == [0]  # none
    with pytest.raises(IndexError):
        scan.positions(np.array([len(parts)]), ids[:1], np.array([1]))


def nearest_lists(scores: np.ndarray, sizes: np.ndarray, count: int, k: int, rows: int) -> list[int]:
    """A part's lists to probe as numpy picks them: its ``count`` nearest (ties to the lower list), then more
    while they hold fewer than ``min(k, rows)`` rows."""
    order = np.lexsort((np.arange(len(scores)), scores))
    take = min(count, len(order))
    if sizes[order[:take]].sum() < min(k, rows):
        take = max(take, int(np.searchsorted(np.cumsum(sizes[order]), k)) + 1)
    return order[:take].tolist()


def test_probes_are_each_parts_nearest_lists_widened_to_hold_k_rows(mixed: tuple[str, list[IvfLists]]) -> None:
    metric, parts = mixed
    scan = Steps(parts, metric)
    first = np.concatenate(([0], np.cumsum([len(p.bias) for p in parts])))
    for q in low_rank(3, 128, 16, seed=12):
        scores = scan.route(q, np.arange(len(parts)))
        for nprobe, k in ((1, 10), (3, 10), (0, 10), (1, 2_000), (10_000, 10)):
            chosen = np.array([0, 2])
            got = scan.probes(q, chosen, nprobe, k)
            want = []
            for p in chosen.tolist():
                count = nprobe or int(scan.nprobe[p])
                own = scores[first[p] : first[p + 1]]
                want += [
                    first[p] + i for i in nearest_lists(own, np.diff(parts[p].offsets), count, k, len(parts[p].row_ids))
                ]
            assert got.tolist() == sorted(want)
            if k == 2_000 and nprobe == 1:  # widened past nprobe: the lists hold k rows
                assert scan.size[got[got < first[1]]].sum() >= 2_000


def test_a_first_pass_is_the_probed_rows_best_keys_reranked(mixed: tuple[str, list[IvfLists]]) -> None:
    """One call gives what the steps give one by one: the probed lists' runs, the query coded, the heap's best
    rows (ties to the lower index) located in their parts and reranked."""
    metric, parts = mixed
    scan = Steps(parts, metric)
    for q in low_rank(3, 128, 16, seed=13):
        for chosen, nprobe, want in (([0, 1, 2], 2, 40), ([1], 0, 7), ([0, 2], 50, 5_000)):
            lists = scan.probes(q, np.array(chosen), nprobe, 10)
            runs = np.stack((scan.list_part[lists], scan.start[lists], scan.size[lists]), 1)
            coded_q = scan.query_codes(q, runs[:, 0])
            index, _ = scan.nearest(*coded_q, runs, want)
            at = np.cumsum(runs[:, 2]) - runs[:, 2]
            r = np.searchsorted(at, index, side="right") - 1
            part, pos = runs[r, 0], runs[r, 1] + index - at[r]
            dist, rows = scan.reranked(part, pos, q)
            got = scan.first_pass(q, np.array(chosen), nprobe, 10, want)
            for a, b in zip(got, (part, dist, rows), strict=True):
                assert np.array_equal(a, b)
    with pytest.raises(IndexError):
        scan.first_pass(q, np.array([2, 0]), 1, 10, 10)  # not ascending
    with pytest.raises(IndexError):
        scan.query_codes(q, np.array([0, len(parts)]))


def test_the_ranked_pool_is_lexsorts_top_k_by_part() -> None:
    rng = np.random.default_rng(6)
    for n, k in ((0, 10), (5, 10), (200, 10), (200, 1), (300, 300), (200, 100), (250, 60), (3200, 10)):
        dist = rng.integers(0, 20, n).astype(np.float32)  # many ties: broken by part, then row
        part = rng.integers(0, 4, n)
        rows = rng.permutation(n).astype(np.int64)
        keep = np.lexsort((rows, part, dist))[:k]
        keep = keep[np.argsort(part[keep], kind="stable")]
        assert Steps.ranked(dist, part, rows, k).tolist() == keep.tolist()
        grouped = np.argsort(part, kind="stable")  # each=True: a part's candidates adjacent, parts ascending
        dist, part, rows = dist[grouped], part[grouped], rows[grouped]
        keep = np.lexsort((rows, dist, part))
        keep = keep[np.arange(len(keep)) - np.searchsorted(part[keep], part[keep]) < k]  # each part's first k
        assert Steps.ranked(dist, part, rows, k, each=True).tolist() == keep.tolist()
    with pytest.raises(ValueError, match="must not descend"):
        Steps.ranked(np.zeros(2, np.float32), np.array([1, 0]), np.zeros(2, np.int64), 1, each=True)
    with pytest.raises(ValueError, match="a part and a row"):
        Steps.ranked(np.zeros(2, np.float32), np.zeros(1, np.int64), np.zeros(2, np.int64), 1)


def test_the_nearest_lists_at_a_tied_cut_are_the_lower_ones() -> None:
    """A part's lists are picked by a partition: of lists scored equal at the cut, the lower ones, as a stable
    sort would pick; widened to hold k rows in nearest order."""
    scores = np.array([3, 1, 2, 2, 2, 0, 5, 2], np.float32)
    one, first, out = np.array([0]), np.array([0, 8]), np.empty(8, np.int64)

    def chosen(count: int, k: int, size: np.ndarray) -> list[int]:
        n = ivf_scan._choose(scores, one, np.array([count]), k, np.array([8]), first, size, np.array([size.sum()]), out)
        return out[:n].tolist()

    tens = np.full(8, 10, np.int64)
    for count, want in ((1, [5]), (3, [1, 2, 5]), (4, [1, 2, 3, 5]), (6, [1, 2, 3, 4, 5, 7]), (8, list(range(8)))):
        assert chosen(count, 1, tens) == want
    assert chosen(1, 3, np.ones(8, np.int64)) == [1, 2, 5]  # widened: nearest first until 3 rows


@pytest.mark.parametrize("dims", [ivf_scan._EXACT_DIMS, ivf_scan._EXACT_DIMS + 8])
def test_keys_of_the_widest_codes_at_the_int8_extremes_are_exact(dims: int) -> None:
    """A run's dot products are summed in float32, exact while every partial sum is an integer below 2**24 (codes
    up to ``_EXACT_DIMS`` wide); wider codes are summed in integers. Row 0's sum is odd and, past the bound,
    above 2**24: a float32 sum would round it."""
    rng = np.random.default_rng(dims)
    codes = rng.choice(np.array([-128, -1, 0, 1, 127], np.int8), (64, dims))
    codes[0] = -128
    codes[0, -1] = 127
    q8 = np.full((1, dims), -127, np.int8)
    norms = rng.random(64).astype(np.float32)
    part = np.array([[codes.ctypes.data, norms.ctypes.data, 64, dims]], np.int64)  # read in place, by address
    step, offset = np.array([0.5]), np.array([0.25])
    dot = codes.astype(np.int64) @ q8[0].astype(np.int64)
    assert dot[0] % 2 == 1 and (dot[0] > 2**24) == (dims > ivf_scan._EXACT_DIMS)
    for l2 in (False, True):
        heap_key, heap_at = np.empty(64), np.empty(64, np.int64)
        size = ivf_scan._nearest_runs(part, q8, step, offset, l2, np.array([[0, 0, 64]]), heap_key, heap_at)
        got = np.empty(64)
        got[heap_at[:size]] = heap_key[:size]
        want = (norms * norms).astype(np.float64) - 2.0 * (dot * 0.5 + 0.25) if l2 else -0.5 * dot - 0.25
        assert size == 64 and np.array_equal(got, want)
