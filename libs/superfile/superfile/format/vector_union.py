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
   and one sort orders each part's lists by distance; each part probes its
   ``nprobe`` nearest (its own default when not given), more while they hold
   fewer than ``k`` rows: the lists a search of the part alone probes;
2. **first pass**: the query coded for each part as its codes are (one
   projection call for the parts of principal-component codes, one
   quantization per kind of code), then one call scores the probed rows of
   every part and keeps the best of them, on the caller's thread (concurrent
   searches use every core); the
   parts' codes have their own scales and bases, so the dot products are
   mapped back onto q.x and compare across parts;
3. **rerank**: exact float32 distances for the best first-pass candidates.

Unfiltered, steps 1, 2 and 3 are one compiled call, and the final pick another
(``IvfParts.first_pass``, ``IvfParts.ranked``).

:meth:`VectorUnion.top` ranks all its parts together with one rerank pool
(default: the largest of the parts' defaults): the first pass ranks across
parts, so the budget is per search, as for one index, not per part; on the
1M-row bench, 40 over 16 parts gave the recall 40 per part gave (0.952 at
nprobe 8, 0.994 at the default). That is the search of superfiles without
deleted rows, unfiltered.

:meth:`VectorUnion.top_each` takes allowed rows per part (a filter, the live
rows of a superfile with deletes) and gives each part a pool of its own,
picked from its own rows: each part's answer is then the one its own
``VectorIndex.search`` gives (which is this, over a union of one), and does
not depend on the parts searched with it, so a fleet's cache nodes, each
searching its share, answer as one process does. Filtered, a part with few
allowed rows (no more than its default probing scans) has each of them
scored (exact at the first pass: small tables stay exact), and one whose
allowed rows all fit its pool skips the first pass; a part with more probes
its lists that hold allowed rows, nearest first, and scores only those rows.
Measured against one superfile at a time: ``BENCHMARKS.md``, "Per-query cost",
"Filtered searches through the union".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt
from pyroaring import AbstractBitMap, FrozenBitMap

from superfile.errors import InvalidOptionError
from superfile.format.vector_sections import IvfLists

__all__ = ["Hits", "IndexPart", "VectorUnion"]

_Floats = npt.NDArray[np.float32]
_Ints = npt.NDArray[np.int64]
Hits = tuple[_Ints, _Ints, _Floats]  # each hit's part, row offset and distance, by part, each part's nearest first

_BRUTE_FACTOR: Final = 1.0  # scan a part's allowed rows directly when fewer than this x its default probe scans
_FILTER_EXPONENT: Final = 0.75  # a filter keeping a fraction s of a part's rows: scan s**0.75 of what probing scans
_SEEN_ROWS: Final = 1 << 20  # allowed-row positions a union keeps for its filters' bitmaps (8 MB)
_SEEN_BITMAPS: Final = 1024  # and bitmaps (one allowing all or none of a part's rows has no positions)
_SEEN_WHOLE: Final = 64  # and whole filters, each the positions of all its parts joined (up to _SEEN_ROWS in all)


class IndexPart(Protocol):
    """What a union takes of each part (a ``vector_index.VectorIndex``, which searches as a union of itself)."""

    @property
    def dim(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def ivf_lists(self) -> IvfLists | None: ...
    def prepare_query(self, query: npt.ArrayLike) -> _Floats: ...


class VectorUnion:
    """A search over the IVF indexes ``parts`` (one dimension and metric); hits map back to (part, row)."""

    def __init__(self, parts: Sequence[IndexPart]) -> None:
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
        self._rows = np.diff(self._kernels.base)  # how many rows each part has
        # (part, id of a frozen bitmap) -> the bitmap, how many rows it allows, their positions (see _allowed)
        self._seen: dict[tuple[int, int], tuple[FrozenBitMap, int, _Ints]] = {}
        self._seen_rows = 0
        # ((part, id of its bitmap or None) for each part searched) -> the bitmaps, what _allowed gave for them
        self._whole: dict[
            tuple[tuple[int, int], ...], tuple[tuple[AbstractBitMap | None, ...], tuple[_Ints, _Ints, _Ints]]
        ] = {}
        self._whole_rows = 0

    def top(
        self,
        query: npt.ArrayLike,
        k: int,
        parts: Sequence[int],
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
    ) -> Hits:
        """The ``k`` nearest rows over ``parts``: each hit's part, row offset and distance, by part (ascending),
        each part's nearest first.

        ``nprobe`` is per part, as for ``VectorIndex.search`` (None: each part's default); ``rerank`` is for
        the whole search (None: the largest of the parts' defaults). The query is checked like there.
        """
        q = self._first_part.prepare_query(query)
        chosen = np.array(sorted(set(parts)), np.int64)  # (np.unique lets the interpreter lock go)
        if k <= 0 or not len(chosen):
            return _no_hits()
        want = max(rerank or int(self._kernels.rerank[chosen].max()), k)
        part, dist, rows = self._kernels.first_pass(q, chosen, nprobe or 0, k, want)
        keep = self._kernels.ranked(dist, part, rows, k)
        return part[keep], rows[keep], dist[keep]

    def top_each(
        self,
        query: npt.ArrayLike,
        k: int,
        allow: Sequence[tuple[int, AbstractBitMap | None]],
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
    ) -> Hits:
        """For each (part, allowed row offsets or None for all) of ``allow``, the ``k`` nearest of those rows,
        ranked with a rerank pool of the part's own: what ``VectorIndex.search(query, k, allow=...)`` of the
        part alone gives, so the answer over some parts does not depend on how they are split (a fleet's shares).

        The parts' steps still run together: one routing, one choice of lists, one first pass (each part's pool
        picked from its own keys) and one rerank. A part whose allowed rows are few is scanned row by row;
        otherwise its lists with allowed rows are probed, nearest first, until the allowed rows seen reach what
        its probing would scan times ``s**0.75`` (``s`` the fraction allowed: a uniform filter puts the k nearest
        allowed rows among the ~k/s nearest), and at least ``nprobe`` of them (a filter correlated with the
        geometry leaves whole regions empty); only the allowed rows of those lists are scored. ``rerank`` is per
        part (None: its default).
        """
        q = self._first_part.prepare_query(query)
        parts, allowed, rows = self._allowed(allow)
        if k <= 0 or not len(parts):
            return _no_hits()
        part, dist, rows = self._kernels.first_pass_each(
            q, parts, allowed, rows, nprobe or 0, rerank or 0, k, _BRUTE_FACTOR, _FILTER_EXPONENT
        )
        keep = self._kernels.ranked(dist, part, rows, k, each=True)
        return part[keep], rows[keep], dist[keep]

    # -- steps ----------------------------------------------------------------------------------

    def _allowed(self, allow: Sequence[tuple[int, AbstractBitMap | None]]) -> tuple[_Ints, _Ints, _Ints]:
        """The parts with rows to search (ascending), how many rows each allows, and the allowed rows of the
        filtered ones as positions in the union's numbering (ascending); a part allowing every row is not
        filtered. Where every bitmap is frozen (or None), the whole answer is kept (:attr:`_whole`): a
        repeated filter gives the same bitmaps, and joining the parts' positions again took ~25 us of a 0.1%
        search and ~0.6 ms of a 50% one (125,000 positions)."""
        key = tuple((p, id(bitmap)) for p, bitmap in allow)
        kept = self._whole.get(key)
        if kept is not None:  # the entry holds the bitmaps, so their ids name no others
            return kept[1]
        found = self._allowed_each(allow)
        if all(bitmap is None or isinstance(bitmap, FrozenBitMap) for _, bitmap in allow):
            if self._whole_rows + len(found[2]) > _SEEN_ROWS or len(self._whole) >= _SEEN_WHOLE:
                self._whole, self._whole_rows = {}, 0
            self._whole[key] = (tuple(bitmap for _, bitmap in allow), found)
            self._whole_rows += len(found[2])
        return found

    def _allowed_each(self, allow: Sequence[tuple[int, AbstractBitMap | None]]) -> tuple[_Ints, _Ints, _Ints]:
        """:meth:`_allowed`, part by part. A frozen bitmap's positions are kept (:attr:`_seen`): a filter's
        bitmaps are the same objects search after search (the caller keeps them per snapshot), and finding the
        positions again was a third of a selective filtered search's Python."""
        found: dict[int, int] = {}
        positions: dict[int, _Ints] = {}
        todo: list[tuple[int, AbstractBitMap]] = []
        seen = self._seen
        for p, bitmap in sorted(allow, key=lambda pair: pair[0]):
            if not 0 <= p < len(self._lists) or p in found:
                raise ValueError(f"part {p} is not a part of the union or is named twice")
            found[p] = int(self._rows[p])
            if bitmap is None:
                continue
            if not isinstance(bitmap, AbstractBitMap):
                raise InvalidOptionError(f"allow must be a pyroaring (Frozen)BitMap, got {type(bitmap).__name__}")
            known = seen.get((p, id(bitmap)))
            if known is not None and known[0] is bitmap:  # held by the entry, so its id names no other bitmap
                found[p], positions[p] = known[1], known[2]
            else:
                todo.append((p, bitmap))
        if todo:
            ids = [np.frombuffer(bitmap.to_array(), dtype=np.uint32) for _, bitmap in todo]
            ends = np.array(list(itertools.accumulate(len(i) for i in ids)), np.int64)
            filtered = np.array([p for p, _ in todo], np.int64)
            counts, rows = self._kernels.positions(filtered, np.concatenate(ids), ends)
            cuts = np.zeros(len(todo) + 1, np.int64)
            cuts[1:] = np.cumsum(np.where((counts > 0) & (counts < self._rows[filtered]), counts, 0))
            for (p, bitmap), count, a, b in zip(
                todo, counts.tolist(), cuts[:-1].tolist(), cuts[1:].tolist(), strict=True
            ):
                found[p], positions[p] = count, rows[a:b]
                if isinstance(bitmap, FrozenBitMap):
                    self._keep(p, bitmap, count, rows[a:b])
        parts = np.array([p for p, m in found.items() if m > 0], np.int64)
        allowed = np.array([m for m in found.values() if m > 0], np.int64)
        pieces = [positions[p] for p in parts.tolist() if p in positions]
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        return parts, allowed, rows

    def _keep(self, part: int, bitmap: FrozenBitMap, count: int, positions: _Ints) -> None:
        """Remember ``bitmap``'s positions in ``part``; past :data:`_SEEN_ROWS` positions or :data:`_SEEN_BITMAPS`
        bitmaps in all, start over."""
        if self._seen_rows + len(positions) > _SEEN_ROWS or len(self._seen) >= _SEEN_BITMAPS:
            self._seen, self._seen_rows = {}, 0
        self._seen[(part, id(bitmap))] = (bitmap, count, positions.copy())
        self._seen_rows += len(positions)


def _no_hits() -> Hits:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
