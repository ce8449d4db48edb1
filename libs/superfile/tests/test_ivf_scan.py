"""The compiled IVF first pass: the keys numpy computes, bounds checked, and the interpreter lock let go."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from superfile.format.ivf_scan import CodeScan
from superfile.format.vector_index import METRICS, IvfLists, VectorIndex, VectorIndexParams, build_vector_index
from test_vector_index import clustered, low_rank


def lists_of(x: np.ndarray, metric: str, reduce: bool) -> IvfLists:
    lists = VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(reduce=reduce))).ivf_lists
    assert lists is not None and (lists.proj is not None) == reduce
    return lists


def expected_keys(lists: IvfLists, q: np.ndarray, pos: np.ndarray, metric: str) -> np.ndarray:
    """The key of each row as numpy computes it: exact integer dots, then float64 in the documented order."""
    q8, step, offset = lists.query_codes(q)
    dots = lists.codes[pos].astype(np.int64) @ q8[0].astype(np.int64)
    if metric == "l2":
        norms = lists.norms[pos]
        return (norms * norms).astype(np.float64) - 2.0 * (dots * step + offset)
    return -step * dots.astype(np.float64) - offset


@pytest.mark.parametrize("metric", METRICS)
def test_keys_are_numpys_bit_for_bit_over_runs_of_several_parts_and_over_positions(metric: str) -> None:
    parts = [lists_of(low_rank(3_000, 128, 16, seed=s), metric, reduce=s != 1) for s in range(3)]
    scan = CodeScan([(p.codes, p.norms) for p in parts], metric)
    assert scan.width == 128  # part 1 keeps full codes; the others are of fewer components
    rng = np.random.default_rng(0)
    for q in low_rank(4, 128, 16, seed=9):
        coded = [p.query_codes(q) for p in parts]
        q8 = np.zeros((3, scan.width), np.int8)
        for i, (codes, _, _) in enumerate(coded):
            q8[i, : codes.shape[1]] = codes[0]
        step = np.array([c[1] for c in coded])
        offset = np.array([c[2] for c in coded])
        runs = np.array([[2, 100, 700], [0, 0, 1], [1, 2_500, 500], [0, 2_999, 1], [2, 0, 0]], np.int64)
        want = np.concatenate([expected_keys(parts[p], q, np.arange(a, a + n), metric) for p, a, n in runs])
        assert np.array_equal(scan.runs(q8, step, offset, runs), want)
        pos = rng.permutation(3_000)[:400]
        assert np.array_equal(scan.positions(2, q8, step, offset, pos), expected_keys(parts[2], q, pos, metric))


def test_rows_outside_a_part_and_a_query_of_the_wrong_shape_are_refused() -> None:
    part = lists_of(clustered(1_000, 8), "l2", reduce=False)
    scan = CodeScan([(part.codes, part.norms)], "l2")
    q8, step, offset = np.zeros((1, 8), np.int8), np.ones(1), np.zeros(1)
    for runs in ([[0, 990, 11]], [[0, -1, 2]], [[1, 0, 5]]):
        with pytest.raises(IndexError):
            scan.runs(q8, step, offset, np.array(runs, np.int64))
    for pos in ([1_000], [-1]):
        with pytest.raises(IndexError):
            scan.positions(0, q8, step, offset, np.array(pos, np.int64))
    with pytest.raises(IndexError):
        scan.positions(1, q8, step, offset, np.array([0], np.int64))
    with pytest.raises(ValueError, match="coded for 1 parts"):
        scan.runs(np.zeros((1, 4), np.int8), step, offset, np.array([[0, 0, 1]], np.int64))
    assert len(scan.runs(q8, step, offset, np.array([[0, 0, 1_000]], np.int64))) == 1_000


def test_a_scan_lets_other_threads_run() -> None:
    """The whole first pass is one call without the interpreter lock: a thread running Python meanwhile is
    never held up for long (were the call to hold the lock, that thread would stop for the whole call)."""
    part = lists_of(clustered(20_000, 192, centers=20), "cosine", reduce=False)
    scan = CodeScan([(part.codes, part.norms)], "cosine")
    q8, step, offset = part.query_codes(part.vectors[0])
    scan.runs(q8, np.array([step]), np.array([offset]), np.array([[0, 0, 1]]))  # compiled (or loaded) first
    runs = np.array([[0, 0, 20_000]] * 2_000, np.int64)  # 40M rows: ~0.4 s
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
    scan.runs(q8, np.array([step]), np.array([offset]), runs)
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
q8, step, offset = lists.query_codes(x[3])
scan = ivf_scan.CodeScan([(lists.codes, lists.norms)], "l2")
keys = scan.runs(q8, np.array([step]), np.array([offset]), np.array([[0, 0, 500]]))
print(type(ivf_scan._scan_runs._cache).__name__, keys.tobytes().hex())
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    cache, keys = out.stdout.split()
    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    lists = lists_of(x, "l2", reduce=False)
    assert cache == "NullCache"
    assert keys == expected_keys(lists, x[3], np.arange(500), "l2").tobytes().hex()
