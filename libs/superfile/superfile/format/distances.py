"""Exact distances and a query's length, compiled: the same arithmetic whether or not a call keeps the
interpreter lock.

numpy's ``einsum`` and ``dot`` let the lock go at any size. With a second query thread waiting for it, each
release is a context switch each way, tens of microseconds of CPU on these VMs: more than a rerank pool of a
few hundred rows or a query's length costs to compute. So a small batch runs keeping the lock and a large one
without it. Both are the same compiled loop (:func:`distance`, which the IVF rerank runs on the rows where they
lie), so a row's distance is the same float wherever it is computed: the index's rerank, the union's and the
exact kernel's (``table/exact.py``) agree bit for bit. numba keeps ``ivf_scan``'s compiled kernels, which
take :func:`distance` in, by ``ivf_scan.py``'s own file: a change here must touch that file too.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from superfile.format.compiled import compiled, compiled_fast, compiled_held

__all__ = ["METRICS", "distance", "distances", "dot", "length"]

_Floats = npt.NDArray[np.float32]
METRICS: Final = {"l2": 0, "cosine": 1, "dot": 2}  # as the compiled kernels take a metric
_HELD_MAX: Final = 1 << 17  # components read (a 512 KiB batch, ~30 us) that are computed keeping the lock


@compiled_fast
def dot(a: Any, b: Any) -> Any:
    """``a . b``, summed in float32, vectorised: routing's and the rerank's dot products."""
    total = np.float32(0.0)
    for j in range(len(a)):
        total += a[j] * b[j]
    return total


@compiled_fast
def distance(row: Any, q: Any, norm: Any, metric: int) -> Any:
    """One row's distance (``metric``: 0 l2, 1 cosine, 2 dot), its float32 sum over the components vectorised in
    one order fixed by the length (reassociation is allowed, but the loop is the same for every row)."""
    if metric == 0:
        total = np.float32(0.0)
        for j in range(len(q)):
            d = row[j] - q[j]
            total += d * d
        return total
    total = dot(row, q)
    return np.float32(1.0) - (total / norm if metric == 1 else total)


@compiled_fast
def _fill(v: Any, q: Any, norms: Any, metric: int, out: Any) -> None:
    for i in range(v.shape[0]):
        out[i] = distance(v[i], q, norms[i], metric)


@compiled_held
def _held(v: Any, q: Any, norms: Any, metric: int, out: Any) -> None:
    _fill(v, q, norms, metric, out)


@compiled
def _free(v: Any, q: Any, norms: Any, metric: int, out: Any) -> None:
    _fill(v, q, norms, metric, out)


@compiled_held
def _length(q: Any) -> float:
    total = np.float32(0.0)
    for j in range(len(q)):
        total += q[j] * q[j]
    return np.sqrt(total)


def distances(v: _Floats, q: _Floats, norms: _Floats, metric: str) -> _Floats:
    """Distances under ``metric`` from ``q`` to the rows ``v`` of norms ``norms``: the squared l2 distance, or
    one minus the dot product (over the row's norm under cosine; ``q`` is then of unit length)."""
    v, q = np.ascontiguousarray(v, np.float32), np.ascontiguousarray(q, np.float32)
    norms = np.ascontiguousarray(norms, np.float32)
    if v.ndim != 2 or v.shape[1] != len(q) or len(norms) != len(v):
        raise ValueError("rows of the query's length, a norm each, were expected")
    out = np.empty(len(v), np.float32)
    (_held if v.size <= _HELD_MAX else _free)(v, q, norms, METRICS[metric], out)
    return out


def length(q: _Floats) -> float:
    """``q``'s euclidean length, summed in float32 (a few hundred components, so keeping the lock)."""
    return float(_length(np.ascontiguousarray(q, np.float32)))
