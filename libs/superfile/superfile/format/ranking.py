"""A search's hits in rank order, and reciprocal-rank fusion's scores, compiled.

numpy's ``lexsort`` and ``argsort`` let the interpreter lock go for the microseconds a few hundred hits take,
and with a second query thread waiting for the lock each release is a context switch each way. These kernels
keep the lock (``compiled_held``): :func:`rank_order` gives the order ``np.lexsort((ids, keys))`` gives, NaN
keys last; :func:`rrf_scores` sums a hybrid search's two hundred reciprocal ranks, which a dict of Python
floats took ~20 us to.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from superfile.format.compiled import compiled_held

__all__ = ["rank_order", "rrf_scores"]


@compiled_held
def _order(ids: npt.NDArray[np.uint64], keys: npt.NDArray[np.floating], by_key: bool) -> npt.NDArray[np.intp]:
    order = np.argsort(ids, kind="mergesort")
    if by_key:
        order = order[np.argsort(keys[order], kind="mergesort")]
    return order


def rank_order(ids: npt.NDArray[np.uint64], keys: npt.NDArray[np.floating] | None) -> npt.NDArray[np.intp]:
    """The hits' order by ascending ``keys`` (None: by ``_id`` alone), ties by ascending ``_id``."""
    ids = np.ascontiguousarray(ids, np.uint64)
    if keys is None:
        return _order(ids, np.zeros(0, np.float32), False)
    return _order(ids, np.ascontiguousarray(keys), True)


@compiled_held
def _fused(
    ids: npt.NDArray[np.uint64], ends: npt.NDArray[np.int64], rrf_k: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
    rank = np.empty(len(ids), np.int64)
    start = 0
    for end in ends:
        for i in range(start, end):
            rank[i] = i - start + 1
        start = end
    order = np.argsort(ids, kind="mergesort")  # stable: an id's contributions stay in the lists' order
    out_ids = np.empty(len(ids), np.uint64)
    out = np.empty(len(ids), np.float64)
    n, i = 0, 0
    while i < len(order):
        at, total = ids[order[i]], 0.0
        while i < len(order) and ids[order[i]] == at:
            total += 1.0 / (rrf_k + rank[order[i]])
            i += 1
        out_ids[n], out[n] = at, total
        n += 1
    return out_ids[:n], out[:n]


def rrf_scores(
    rankings: list[npt.NDArray[np.uint64]], rrf_k: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
    """Each id of the ranked ``rankings`` (best first) once, ascending, with the sum over the lists holding it
    of ``1 / (rrf_k + its rank)``, ranks from 1, added in the lists' order (as a running Python sum adds them)."""
    ends = np.cumsum([len(r) for r in rankings], dtype=np.int64)
    ids = np.concatenate(rankings).astype(np.uint64, copy=False) if rankings else np.zeros(0, np.uint64)
    return _fused(ids, ends, rrf_k)
