"""What the two IVF searches share (``vector_index`` over one index, ``vector_union`` over many): an index's
sections as views, and exact distances computed the same way wherever a row is reranked."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["IvfLists", "exact_distances", "query_length"]

_Floats = npt.NDArray[np.float32]
_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class IvfLists:
    """Views of an IVF index's sections: list centroids with their scoring bias (``bias - 2 c.q`` orders lists
    by distance to q), list ``offsets`` into the list-ordered ``codes`` (int8, per-component ``scale``),
    ``vectors`` and ``norms``, the row offset of each position (``row_ids``) and the position of each row
    offset (``row_pos``), and the search defaults. Codes
    are of the vectors themselves, or (``proj`` not None) of their principal components: ``x - mean``
    projected on ``proj``'s columns, each scaled by its ``scale``."""

    centroids: _Floats
    bias: _Floats
    offsets: _Ints
    scale: _Floats
    codes: npt.NDArray[np.int8]
    vectors: _Floats
    norms: _Floats
    row_ids: npt.NDArray[np.uint32]
    row_pos: npt.NDArray[np.uint32]
    nprobe: int
    rerank: int
    mean: _Floats | None
    proj: _Floats | None


def exact_distances(v: _Floats, q: _Floats, norms: _Floats, metric: str) -> _Floats:
    """Distances under ``metric`` from q to the rows ``v`` of norms ``norms``.

    Each row's distance is computed the same way wherever the row sits in ``v`` and however many rows there
    are (one compiled loop, not a BLAS matrix-vector product, whose rounding depends on the row's position in
    its block), so the index's rerank, the union's and the exact kernel's (``table/exact.py``) agree bit for
    bit."""
    from superfile.format.distances import distances  # numba: ~0.2 s to import, paid by a first vector search

    return distances(v, q, norms, metric)


def query_length(q: _Floats) -> float:
    """``q``'s length, as every search takes it to make a cosine query of unit length."""
    from superfile.format.distances import length  # numba: ~0.2 s to import, paid by a first vector search

    return length(q)
