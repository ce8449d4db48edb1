"""Exact distances as every rerank computes them: a row's distance is one float whatever batch it is in."""

from __future__ import annotations

import numpy as np
import pytest
from superfile.format.distances import distances, length
from superfile.format.vector_index import METRICS


def reference(v: np.ndarray, q: np.ndarray, norms: np.ndarray, metric: str) -> np.ndarray:
    v, q = v.astype(np.float64), q.astype(np.float64)
    if metric == "l2":
        return ((v - q) ** 2).sum(axis=1)
    dots = v @ q
    return 1 - (dots / norms if metric == "cosine" else dots)


@pytest.mark.parametrize("metric", METRICS)
def test_a_rows_distance_does_not_depend_on_its_batch(metric: str) -> None:
    """Small batches keep the interpreter lock and large ones let it go: the same rows get the same floats,
    in any order and at any position, and the floats are the distances."""
    rng = np.random.default_rng(7)
    v = rng.standard_normal((300, 384)).astype(np.float32)
    q = rng.standard_normal(384).astype(np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", v, v))
    small = distances(v, q, norms, metric)
    large = distances(np.tile(v, (600, 1)), q, np.tile(norms, 600), metric)  # 69M components: without the lock
    assert np.array_equal(large[:300], small) and np.array_equal(large[-300:], small)
    order = rng.permutation(300)
    assert np.array_equal(distances(v[order], q, norms[order], metric), small[order])
    assert np.array_equal(distances(v[1::2], q, norms[1::2], metric), small[1::2])  # a strided view
    np.testing.assert_allclose(small, reference(v, q, norms, metric), rtol=1e-5, atol=1e-4)


def test_a_query_length_is_its_euclidean_norm() -> None:
    q = np.random.default_rng(8).standard_normal(384).astype(np.float32)
    assert length(q) == pytest.approx(float(np.linalg.norm(q.astype(np.float64))), rel=1e-6)
    assert length(np.zeros(3, np.float32)) == 0.0


def test_rows_of_another_length_are_refused() -> None:
    with pytest.raises(ValueError, match="query's length"):
        distances(np.zeros((2, 3), np.float32), np.zeros(4, np.float32), np.ones(2, np.float32), "l2")
    with pytest.raises(ValueError, match="a norm each"):
        distances(np.zeros((2, 3), np.float32), np.zeros(3, np.float32), np.ones(3, np.float32), "cosine")
