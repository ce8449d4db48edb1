"""A search's hits in rank order, compiled: by score, ties by ``_id``.

numpy's ``lexsort`` and ``argsort`` let the interpreter lock go for the microseconds a few hundred hits take,
and with a second query thread waiting for the lock each release is a context switch each way. This kernel
keeps the lock (``compiled_held``) and gives the order ``np.lexsort((ids, keys))`` gives, NaN keys last.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from superfile.format.compiled import compiled_held

__all__ = ["rank_order"]


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
