"""One IVF search over the vector indexes of many superfiles: kNN without a per-superfile round trip.

Searched one :class:`VectorIndex` at a time, 16 superfiles of 62,500 rows
cost ~3.8 ms a query at nprobe 8, of which the int8 scan is ~1.4 ms and the
rest is numpy bookkeeping repeated per superfile (routing, quantizing the
query, merging runs, reranking). A union numbers the IVF lists of every part
once (built per snapshot by the caller) and runs each step once for any
subset of its parts, as one IVF index whose lists are all the parts' lists.
It stacks only what is per list (offsets, sizes); centroids, codes and
norms stay views of each part's index, so a cached union costs bytes per
list, not per row. The steps that touch every probed part are compiled
(``ivf_scan.IvfParts``: each one call without the interpreter lock, the
same code ``VectorIndex.search`` runs for its one part):

1. **probe**: one call scores each part's list centroids into one buffer,
   and one ``argpartition`` picks each part's ``nprobe`` nearest lists
   (its own default when not given), widened for a part whose probed lists
   hold fewer than ``k`` rows: the lists ``VectorIndex.search`` probes;
2. **first pass**: the query coded for each part as its codes are (one
   projection call for the parts of principal-component codes, one
   quantization per kind of code), then one call scores every run of
   adjacent probed lists of every part and keeps the best ``rerank`` of
   them in a heap as it goes (the keys are never stored), on the caller's
   thread (concurrent searches use every core; splitting one search over two
   threads cut its latency but cost CPU that concurrent searches needed);
   the parts' codes have their own scales and bases, so the dot products are
   mapped back onto q.x and compare across parts;
3. **rerank**: exact float32 distances for the ``rerank`` best first-pass
   candidates of all the parts together (default: the largest of the parts'
   defaults). The first pass ranks across parts, so the budget is per search,
   as for one index, not per part: on the 1M-row bench, 40 over 16 parts gave
   the recall 40 per part gave (0.952 at nprobe 8, 0.994 at the default).

It takes no row filter: a part with deleted rows or a search with a filter
goes through ``VectorIndex.search``, which pushes the filter into its ranking.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from superfile.format.vector_index import IvfLists, VectorIndex, exact_distances, list_runs

__all__ = ["VectorUnion"]

_Floats = npt.NDArray[np.float32]
_Ints = npt.NDArray[np.int64]


class VectorUnion:
    """A search over the IVF indexes ``parts`` (one dimension and metric); hits map back to (part, row)."""

    def __init__(self, parts: Sequence[VectorIndex]) -> None:
        ivf = [p.ivf_lists for p in parts]
        if not parts or len({(p.dim, p.metric) for p in parts}) != 1:
            raise ValueError("a vector union needs indexes of one dimension and metric")
        self._lists: list[IvfLists] = [x for x in ivf if x is not None]
        if len(self._lists) != len(parts):
            raise ValueError("a vector union takes IVF indexes only")
        self._first_part = parts[0]
        self.metric = parts[0].metric
        from superfile.format.ivf_scan import IvfParts  # numba: ~0.2 s to import, paid by a first IVF search

        self._kernels = IvfParts(self._lists, self.metric)
        nlist = np.array([len(x.bias) for x in self._lists], np.int64)
        self._first = np.concatenate(([0], np.cumsum(nlist)))  # part p's lists: first[p] .. first[p + 1]
        self._part = np.repeat(np.arange(len(parts)), nlist)
        self._start = np.concatenate([x.offsets[:-1] for x in self._lists])
        self._size = np.concatenate([np.diff(x.offsets) for x in self._lists])
        self._rows = np.array([len(x.row_ids) for x in self._lists], np.int64)
        self._nprobe = np.minimum(np.array([x.nprobe for x in self._lists], np.int64), np.maximum(nlist, 1))
        self._rerank_default = np.array([x.rerank for x in self._lists], np.int64)
        self._nlist = nlist
        self._grid = np.full((len(parts), int(nlist.max(initial=0))), -1, np.int64)  # each part's lists, -1 pad
        for p, n in enumerate(nlist.tolist()):
            self._grid[p, :n] = np.arange(self._first[p], self._first[p] + n)

    def top(
        self,
        query: npt.ArrayLike,
        k: int,
        parts: Sequence[int],
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
    ) -> list[tuple[int, _Ints, _Floats]]:
        """The ``k`` nearest rows over ``parts``: (part, row offsets, distances) per part with hits.

        ``nprobe`` is per part, as for ``VectorIndex.search`` (None: each part's default); ``rerank`` is for
        the whole search (None: the largest of the parts' defaults). The query is checked like there.
        """
        q = self._first_part.prepare_query(query)
        chosen = np.unique(np.asarray(parts, np.int64))
        if k <= 0 or not len(chosen):
            return []
        probes = self._probes(q, chosen, k, nprobe)
        if not len(probes):  # parts without rows
            return []
        want = max(rerank or int(self._rerank_default[chosen].max()), k)
        runs = list_runs(self._part[probes], self._start[probes], self._size[probes])
        best = self._kernels.nearest(*self._kernels.query_codes(q, runs[:, 0]), runs, want)
        return self._rerank(q, *_locate(best, runs), k)  # ascending: in (part, position) order

    # -- steps ----------------------------------------------------------------------------------

    def _probes(self, q: _Floats, parts: _Ints, k: int, nprobe: int | None) -> _Ints:
        """The lists to scan, as ascending global list numbers (so each part's lists are adjacent)."""
        scores = self._kernels.route(q, parts)  # each part's own centroids, read in place
        grid = self._grid[parts]
        dist = np.where(grid >= 0, scores[grid], np.inf)
        count = np.minimum(nprobe, self._nlist[parts]) if nprobe is not None else self._nprobe[parts]
        top = max(int(count.max()), 1)
        if top < grid.shape[1]:
            pick = np.argpartition(dist, top - 1, axis=1)[:, :top]
        else:
            pick = np.broadcast_to(np.arange(grid.shape[1]), grid.shape)
        if np.any(count != top):  # parts with other defaults keep their own nearest `count`
            pick = np.take_along_axis(pick, np.argsort(np.take_along_axis(dist, pick, 1), axis=1, kind="stable"), 1)
        lists = np.take_along_axis(grid, pick, 1)
        keep = (np.arange(pick.shape[1]) < count[:, None]) & (lists >= 0)
        held = np.where(keep, self._size[lists], 0).sum(axis=1)
        short = np.flatnonzero(held < np.minimum(k, self._rows[parts]))
        keep[short] = False
        wider = [lists[keep]]
        for i in short.tolist():  # probe on until the lists hold k rows, as VectorIndex._ivf_search does
            order = np.argsort(dist[i], kind="stable")[: self._nlist[parts[i]]]
            seen = np.cumsum(self._size[grid[i, order]])
            wider.append(grid[i, order[: max(int(count[i]), int(np.searchsorted(seen, k)) + 1)]])
        return np.sort(np.concatenate(wider))

    def _rerank(self, q: _Floats, part: _Ints, pos: _Ints, k: int) -> list[tuple[int, _Ints, _Floats]]:
        """Exact distances of the candidates (gathered part by part), then the k nearest: by (distance, part,
        row)."""
        v = np.empty((len(pos), len(q)), np.float32)
        norms = np.empty(len(pos), np.float32)
        rows = np.empty(len(pos), np.int64)
        cut = np.flatnonzero(part[1:] != part[:-1]) + 1
        for a, b in zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [len(pos)])).tolist(), strict=True):
            x, at = self._lists[int(part[a])], pos[a:b]
            v[a:b] = x.vectors[at]  # fancy indexing: see VectorIndex._rerank on unaligned views
            norms[a:b] = x.norms[at]
            rows[a:b] = x.row_ids[at]
        dist = exact_distances(v, q, norms, self.metric)
        keep = np.lexsort((rows, part, dist))[:k]  # the rerank pool is small: sorting it whole is cheap
        keep = keep[np.argsort(part[keep], kind="stable")]  # by part, each part's nearest first
        owner = part[keep]
        bounds = [0, *(np.flatnonzero(owner[1:] != owner[:-1]) + 1).tolist(), len(keep)]
        return [(int(owner[a]), rows[keep[a:b]], dist[keep[a:b]]) for a, b in itertools.pairwise(bounds)]


def _locate(index: _Ints, runs: _Ints) -> tuple[_Ints, _Ints]:
    """(part, position) of rows by their index in run order, from the runs (part, first position, length)."""
    at = np.cumsum(runs[:, 2]) - runs[:, 2]
    r = np.searchsorted(at, index, side="right") - 1
    return runs[r, 0], runs[r, 1] + index - at[r]
