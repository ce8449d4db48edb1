"""The steps of an IVF search that touch every probed superfile, compiled: each one call without the interpreter lock.

Run by a numkong kernel call per run of adjacent probed lists, a 16-superfile query at nprobe 24 made ~160
calls and as many numpy passes to turn dots into keys; each released the interpreter lock for microseconds,
so a second thread searching handed the lock over ~300 times a query and two client threads answered fewer
queries a second than one (0.66x, ``bench/core_scaling.py``). These loops score every run of every part in
one call, the lock released throughout: the two threads then answered 1.76x what one did, and one thread
1.24x what it did before, on the same 250K-row table. Routing (each part's centroids against the query) and
the projection of the query into each part's principal components were a BLAS call per part and per step,
with Python around each; they are one call each too. The first pass keeps the best rows of the whole search
in a heap as it scores them, or picks each part's best from its keys (:meth:`IvfParts.nearest`).

A row's key is ``-(step * (q8 . code) + offset)``, or ``|x|^2 - 2 (step * (q8 . code) + offset)`` under l2:
an estimate of its distance to the query, up to a term the same for every row, that compares across parts
(each has its own code scales and basis: :meth:`IvfParts.query_codes`). The dot product is exact in
integers, the rest is float64 in this order. Every part is routed, coded and scored by the same code
whichever parts it is searched with, so a row gets the same key from a union of superfiles as from its own
index, and a query probes the same lists.

The kernels read each part's sections where they lie (a mapped superfile), by address: numba's typed lists
would also serve, but building one costs ~0.5 s of compilation in every process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numba
import numpy as np
import numpy.typing as npt
from numba.core import types

from superfile.format.compiled import compiled as _compiled
from superfile.format.compiled import compiled_fast as _compiled_fast
from superfile.format.compiled import pointer_to as _pointer_to

__all__ = ["IvfParts", "IvfSections", "list_rows"]

_Keys = npt.NDArray[np.float64]
_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float32]


class IvfSections(Protocol):
    """What the kernels read of one IVF index (``vector_sections.IvfLists``): list centroids (nlist, dim) with their
    scoring bias, the int8 codes (rows, code dims) with per-component scales, the rows' vectors (rows, dim),
    norms and row offsets, each row offset's position, and for codes of principal components the mean and the
    axes (dim, code dims). All C-contiguous."""

    @property
    def centroids(self) -> _Floats: ...
    @property
    def bias(self) -> _Floats: ...
    @property
    def codes(self) -> npt.NDArray[np.int8]: ...
    @property
    def scale(self) -> _Floats: ...
    @property
    def vectors(self) -> _Floats: ...
    @property
    def norms(self) -> _Floats: ...
    @property
    def row_ids(self) -> npt.NDArray[np.uint32]: ...
    @property
    def row_pos(self) -> npt.NDArray[np.uint32]: ...
    @property
    def mean(self) -> _Floats | None: ...
    @property
    def proj(self) -> _Floats | None: ...


# _smallest: a sample of every want-th key; its 8th smallest value has rank ~8x want, and is below want only if
# 8 samples fell among the want smallest keys, where 1 is expected (p ~ 1e-5: then all keys are used)
_SAMPLE_RANK = 7
_int8_at = _pointer_to(types.int8)
_float32_at = _pointer_to(types.float32)
_uint32_at = _pointer_to(types.uint32)
_MARK_SHARE = 32  # a part's allowed rows are sorted by marking its positions when at least 1/32 of its rows


@_compiled_fast
def _dot(a: Any, b: Any) -> Any:
    total = np.float32(0.0)
    for j in range(len(a)):
        total += a[j] * b[j]
    return total


@_compiled
def _route(cent_at: Any, bias_at: Any, nlist: Any, dim: int, parts: Any, first: Any, q: Any, out: Any) -> None:
    for i in range(len(parts)):
        p = parts[i]
        centroids = numba.carray(_float32_at(cent_at[p]), (nlist[p], dim))
        bias = numba.carray(_float32_at(bias_at[p]), (nlist[p],))
        at = first[p]
        for lst in range(nlist[p]):
            out[at + lst] = bias[lst] - np.float32(2.0) * _dot(centroids[lst], q)


@_compiled
def _project(proj_at: Any, mean_at: Any, dims: Any, dim: int, parts: Any, q: Any, x: Any, offset: Any) -> None:
    for i in range(len(parts)):
        p = parts[i]
        axes = numba.carray(_float32_at(proj_at[p]), (dim, dims[p]))
        row = x[i]
        row[:] = 0.0
        for j in range(dim):  # row += q[j] * axes[j]: each component summed in order of j, across the row at once
            qj = q[j]
            axis = axes[j]
            for c in range(dims[p]):
                row[c] += qj * axis[c]
        offset[p] = _dot(q, numba.carray(_float32_at(mean_at[p]), (dim,)))


@_compiled
def _key(codes: Any, norms: Any, i: int, q8: Any, step: float, offset: float, l2: bool) -> float:
    row = codes[i]
    dot: Any = 0  # an integer: numba widens the int8 products
    for j in range(len(row)):
        dot += np.int32(row[j]) * np.int32(q8[j])
    if l2:
        norm = norms[i]
        return np.float64(norm * norm) - 2.0 * (dot * step + offset)
    return -step * np.float64(dot) - offset


@_compiled
def _view(part: Any, p: int) -> Any:
    """Part ``p``'s codes and norms, from its row of ``part`` (code address, norm address, rows, code dims)."""
    codes = numba.carray(_int8_at(part[p, 0]), (part[p, 2], part[p, 3]))
    return codes, numba.carray(_float32_at(part[p, 1]), (part[p, 2],))


@_compiled
def _run(part: Any, runs: Any, r: int) -> Any:
    """Run ``r``'s part, first position and length, and that part's codes and norms."""
    p, lo, n = runs[r, 0], runs[r, 1], runs[r, 2]
    if p < 0 or p >= len(part) or lo < 0 or n < 0 or lo + n > part[p, 2]:
        raise IndexError("a run of rows past its part's codes")
    codes, norms = _view(part, p)
    return p, lo, n, codes, norms


@_compiled
def _nearest_runs(part: Any, q8: Any, step: Any, offset: Any, l2: bool, runs: Any, heap_key: Any, heap_at: Any) -> int:
    """The ``len(heap_key)`` smallest (key, index) of the rows of ``runs`` (index: the row's place in run order),
    kept in a max-heap as they are scored: no key array, no second pass. Returns how many it holds."""
    want, size, at = len(heap_key), 0, 0
    for r in range(runs.shape[0]):
        p, lo, n, codes, norms = _run(part, runs, r)
        q = q8[p, : part[p, 3]]
        for i in range(n):
            key = _key(codes, norms, lo + i, q, step[p], offset[p], l2)
            index = at + i  # larger than any held: of equal keys the held one stays
            if size < want:  # push, sifting up past smaller parents
                j = size
                size += 1
                while j > 0 and heap_key[(j - 1) // 2] <= key:
                    heap_key[j], heap_at[j] = heap_key[(j - 1) // 2], heap_at[(j - 1) // 2]
                    j = (j - 1) // 2
                heap_key[j], heap_at[j] = key, index
            elif size and key < heap_key[0]:  # replace the largest, sifting down past larger children
                j = 0
                while 2 * j + 1 < size:
                    c = 2 * j + 1
                    if c + 1 < size and (
                        heap_key[c + 1] > heap_key[c]
                        or (heap_key[c + 1] == heap_key[c] and heap_at[c + 1] > heap_at[c])
                    ):
                        c += 1
                    if heap_key[c] <= key:  # of equal keys the held one is the lower index: it stays
                        break
                    heap_key[j], heap_at[j] = heap_key[c], heap_at[c]
                    j = c
                heap_key[j], heap_at[j] = key, index
        at += n
    return size


@_compiled
def _smallest(keys: Any, a: int, b: int, want: int, out: Any, at: int) -> int:
    """Write to ``out[at:]`` the indices of the ``want`` smallest of ``keys[a:b]``, ascending, ties at the cut to
    the lower index; returns the next free place. Where the keys are many for ``want`` (a part of 62,500 rows
    probed ~10%, a pool of 200), a strided sample's few smallest bound the answer, and only the keys at or below
    that bound (~8x ``want``) are partitioned."""
    if want <= 0:
        return at
    if b - a <= want:
        for i in range(a, b):
            out[at] = i
            at += 1
        return at
    bound = np.inf
    if want >= 2 and b - a >= 4 * (_SAMPLE_RANK + 1) * want:
        bound = np.partition(keys[a:b:want].copy(), _SAMPLE_RANK)[_SAMPLE_RANK]
    held = np.empty(b - a, np.int64)  # the indices of the keys at or below the bound, ascending
    count = 0
    for i in range(a, b):
        if keys[i] <= bound:
            held[count] = i
            count += 1
    if count < want:  # an unlucky sample (p ~ 1e-5): every key
        count = b - a
        held = np.arange(a, b)
    held = held[:count]
    cut = np.partition(keys[held], want - 1)[want - 1]
    ties = want  # how many keys equal to the cut make the count
    for j in held:
        if keys[j] < cut:
            ties -= 1
    for j in held:
        if keys[j] < cut or (keys[j] == cut and ties > 0):
            if keys[j] == cut:
                ties -= 1
            out[at] = j
            at += 1
    return at


@_compiled
def _nearest_each(
    part: Any, q8: Any, step: Any, offset: Any, l2: bool, rows: Any, base: Any, want: Any, keys: Any, out: Any
) -> int:
    """For each part, score its ``rows`` (ascending, numbered across parts: part p's from ``base[p]``) into
    ``keys`` and write to ``out`` the indices of its ``want[p]`` smallest (:func:`_smallest`); a part whose rows
    all fit is taken whole, unscored. Returns how many indices it wrote. A row at a time in a loop of
    independent iterations: as runs of ~2 rows (a filter's), whose lengths the branches mispredict, the same
    rows cost ~15% more."""
    for j in range(len(rows)):
        if rows[j] < 0 or rows[j] >= base[len(part)] or (j and rows[j] <= rows[j - 1]):
            raise IndexError("rows must ascend, each a row of a part")
    written, i = 0, 0
    while i < len(rows):
        p = np.searchsorted(base, rows[i], side="right") - 1
        end = np.searchsorted(rows, base[p + 1])
        if end - i > want[p]:
            codes, norms = _view(part, p)
            q, first = q8[p, : part[p, 3]], base[p]
            for j in range(i, end):
                keys[j] = _key(codes, norms, rows[j] - first, q, step[p], offset[p], l2)
        written = _smallest(keys, i, end, want[p], out, written)
        i = end
    return written


@_compiled
def _list_rows(rows: Any, first_row: Any, end_row: Any, lists: Any, whole: Any, out: Any) -> int:
    count, i = 0, 0
    for lst in lists:
        if whole[lst]:
            for r in range(first_row[lst], end_row[lst]):
                out[count] = r
                count += 1
            continue
        while i < len(rows) and rows[i] < first_row[lst]:
            i += 1
        while i < len(rows) and rows[i] < end_row[lst]:
            out[count] = rows[i]
            count += 1
            i += 1
    return count


def list_rows(rows: _Ints, first_row: _Ints, end_row: _Ints, lists: _Ints, whole: npt.NDArray[np.bool_]) -> _Ints:
    """The rows of ``lists`` (ascending; list l holds rows ``first_row[l]`` to ``end_row[l]``) to score: every
    row of a list marked ``whole``, else those of the allowed ``rows`` (ascending) in it. One pass over both
    (numpy's steps took ~1 ms for the 100K rows a 10% filter allows of 1M)."""
    size = int((end_row[lists] - first_row[lists])[whole[lists]].sum()) + len(rows)
    out = np.empty(size, np.int64)
    return out[: _list_rows(rows, first_row, end_row, lists, whole, out)]


@_compiled
def _gather(
    vectors_at: _Ints,
    part_at: _Ints,
    row_ids_at: _Ints,
    dim: int,
    part: _Ints,
    pos: _Ints,
    v: _Floats,
    norms: _Floats,
    rows: _Ints,
) -> bool:
    """Row ``pos[i]`` of part ``part[i]``'s vectors, norm and row offset into ``v[i]``, ``norms[i]``, ``rows[i]``
    (``part_at``: a part's code and norm addresses, rows, code dims); False at a position out of its part."""
    for i in range(len(pos)):
        p, at = part[i], pos[i]
        if p < 0 or p >= len(part_at) or at < 0 or at >= part_at[p, 2]:
            return False
        vector = numba.carray(_float32_at(vectors_at[p] + at * dim * 4), (dim,))
        for j in range(dim):
            v[i, j] = vector[j]
        norms[i] = numba.carray(_float32_at(part_at[p, 1]), (part_at[p, 2],))[at]
        rows[i] = numba.carray(_uint32_at(row_ids_at[p]), (part_at[p, 2],))[at]
    return True


@_compiled
def _positions(
    part_at: _Ints,
    row_pos_at: _Ints,
    base: _Ints,
    parts: _Ints,
    ids: npt.NDArray[np.uint32],
    ends: _Ints,
    counts: _Ints,
    rows: _Ints,
) -> int:
    """:meth:`IvfParts.positions` into ``counts`` and ``rows``: the rows filled, or -1 for a bad part or end."""
    start = 0
    filled = 0
    for i in range(len(parts)):
        p, end = parts[i], ends[i]
        if p < 0 or p >= len(part_at) or end < start or end > len(ids):
            return -1
        n = part_at[p, 2]
        count = np.searchsorted(ids[start:end], n)  # offsets past the part's rows are not its rows
        counts[i] = count
        if 0 < count < n:
            row_pos = numba.carray(_uint32_at(row_pos_at[p]), (n,))
            mine = rows[filled : filled + count]
            if count * _MARK_SHARE >= n:  # many: marked, then swept in order (numba's sort took ~3x numpy's)
                marked = np.zeros(n, np.bool_)
                for j in range(count):
                    marked[row_pos[ids[start + j]]] = True
                w = 0
                for r in range(n):
                    if marked[r]:
                        if w == count:
                            return -1
                        mine[w] = r
                        w += 1
                if w != count:
                    return -1  # positions repeat: not the permutation an index stores
            else:
                for j in range(count):
                    mine[j] = row_pos[ids[start + j]]
                mine.sort()
            for j in range(count):
                mine[j] += base[p]
            filled += count
        start = end
    return filled


class IvfParts:
    """The compiled steps over some IVF indexes of one dimension and metric (the parts), each part addressed by
    its number: routing, query coding, first-pass keys by (part, position)."""

    def __init__(self, parts: Sequence[IvfSections], metric: str) -> None:
        for x in parts:
            arrays: list[npt.NDArray[Any] | None] = [
                x.centroids,
                x.bias,
                x.codes,
                x.scale,
                x.norms,
                x.vectors,
                x.row_ids,
            ]
            arrays += [] if x.proj is None else [x.proj, x.mean]
            rows_each = {len(x.norms), len(x.vectors), len(x.row_ids), len(x.row_pos)}
            if not all(a is not None and a.flags.c_contiguous for a in arrays) or rows_each != {len(x.codes)}:
                raise ValueError("the kernels read the sections in place: contiguous, a norm a row")
        self._parts = list(parts)  # keeps the memory behind the addresses alive
        self._dim = int(parts[0].centroids.shape[1]) if parts else 0
        self._cent_at = _addresses(x.centroids for x in parts)
        self._bias_at = _addresses(x.bias for x in parts)
        self._proj_at = _addresses(x.proj for x in parts)
        self._mean_at = _addresses(x.mean for x in parts)
        self._nlist = np.array([len(x.bias) for x in parts], np.int64)
        self._first = np.concatenate(([0], np.cumsum(self._nlist)))  # part p's lists: first[p] .. first[p + 1]
        rows = np.array([x.codes.shape[0] for x in parts], np.int64)
        self.base = np.concatenate(([0], np.cumsum(rows)))  # the parts' rows numbered together: part p's from base[p]
        self._dims = np.array([x.codes.shape[1] for x in parts], np.int64)
        self.width = int(self._dims.max(initial=0))  # the widest code: the columns of a coded query's ``q8``
        # what the scans read of each part, a row each: code address, norm address, rows, code dims
        self._part = np.stack(
            (_addresses(x.codes for x in parts), _addresses(x.norms for x in parts), rows, self._dims), 1
        )
        self._vectors_at = _addresses(x.vectors for x in parts)
        self._row_ids_at = _addresses(x.row_ids for x in parts)
        self._row_pos_at = _addresses(x.row_pos for x in parts)
        self._l2 = metric == "l2"
        # the parts by how a query is coded for them (full or principal-component codes, of so many dimensions),
        # with their code scales stacked: one quantization of the query for all the parts of a kind
        kinds: dict[tuple[bool, int], list[int]] = {}
        for p, x in enumerate(parts):
            kinds.setdefault((x.proj is not None, x.codes.shape[1]), []).append(p)
        self._kinds = [
            (np.array(ps, np.int64), np.stack([parts[p].scale for p in ps]), parts[ps[0]].proj is not None)
            for ps in kinds.values()
        ]

    @property
    def lists(self) -> int:
        """The lists of all the parts: the length of :meth:`route`'s scores."""
        return int(self._first[-1])

    def gather(self, part: _Ints, pos: _Ints) -> tuple[_Floats, _Floats, _Ints]:
        """The vectors, norms and row offsets at positions ``pos`` of parts ``part``, copied out in one call: a
        rerank pool over 16 parts gathered part by part made ~100 numpy calls, each releasing the interpreter
        lock (a hand-off to another searching thread)."""
        v = np.empty((len(pos), self._dim), np.float32)
        norms = np.empty(len(pos), np.float32)
        rows = np.empty(len(pos), np.int64)
        part, pos = np.ascontiguousarray(part, np.int64), np.ascontiguousarray(pos, np.int64)
        if not _gather(self._vectors_at, self._part, self._row_ids_at, self._dim, part, pos, v, norms, rows):
            raise IndexError("a position out of its part's rows")
        return v, norms, rows

    def positions(self, parts: _Ints, ids: npt.NDArray[np.uint32], ends: _Ints) -> tuple[_Ints, _Ints]:
        """For each of ``parts``, its allowed row offsets ``ids[ends[i - 1]:ends[i]]`` (ascending; those past its
        rows dropped): how many it allows, and, of the parts allowing some rows but not all, the rows'
        positions in the parts' numbering together (each part's ascending, from ``base[part]``), in one call
        rather than a handful of numpy calls a part (each releasing the interpreter lock)."""
        counts = np.empty(len(parts), np.int64)
        rows = np.empty(len(ids), np.int64)
        parts, ends = np.ascontiguousarray(parts, np.int64), np.ascontiguousarray(ends, np.int64)
        filled = _positions(
            self._part, self._row_pos_at, self.base, parts, np.ascontiguousarray(ids), ends, counts, rows
        )
        if filled < 0:
            raise IndexError("a part out of the union, or ends out of the offsets")
        return counts, rows[:filled]

    def route(self, q: _Floats, parts: _Ints) -> _Floats:
        """``bias - 2 c.q`` of every list of ``parts`` (smaller is nearer), in one array numbering the lists of
        all the parts in order (part p's first at the sum of the earlier parts' list counts); other parts' 0."""
        out = np.zeros(self.lists, np.float32)
        parts = np.asarray(parts, np.int64)
        if len(parts) and (parts.min() < 0 or parts.max() >= len(self._parts)):
            raise IndexError(f"parts must be in [0, {len(self._parts)})")
        _route(self._cent_at, self._bias_at, self._nlist, self._dim, parts, self._first, _query(q, self._dim), out)
        return out

    def query_codes(self, q: _Floats, parts: _Ints) -> tuple[npt.NDArray[np.int8], _Keys, _Keys]:
        """The query coded for each of ``parts`` as its codes are: ``q8`` (one row per part, the widest code's
        columns, a part's first ``code dims`` used; other parts' rows 0), and per part the ``step`` and
        ``offset`` such that ``step * (q8 . code) + offset`` estimates q.x for any of its rows. One projection
        call for all the parts of principal-component codes, one quantization per kind of code."""
        q = _query(q, self._dim)
        wanted = np.zeros(len(self._parts), bool)
        wanted[np.asarray(parts, np.int64)] = True
        q8 = np.zeros((len(self._parts), self.width), np.int8)
        step, offset = np.zeros(len(self._parts), np.float64), np.zeros(len(self._parts), np.float64)
        for members, scales, reduced in self._kinds:
            take = np.flatnonzero(wanted[members])
            if not len(take):
                continue
            chosen = members[take]
            if reduced:  # the query's principal components in each part's own basis
                x = np.empty((len(chosen), scales.shape[1]), np.float32)
                _project(self._proj_at, self._mean_at, self._dims, self._dim, chosen, q, x, offset)
            else:  # full codes: the query itself
                x = q[None]
            # the per-component scales folded into the query, then int8 with a step per part: the factor from a
            # dot product with the codes back to the scaled query's
            w = x * scales[take]
            peak = np.abs(w).max(axis=1).astype(np.float64)
            part_step = np.where(peak > 0, peak / 127.0, 1.0)
            q8[chosen, : w.shape[1]] = np.rint(w / part_step.astype(np.float32)[:, None]).astype(np.int8)
            step[chosen] = part_step
        return q8, step, offset

    def nearest(
        self, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys, runs: _Ints, count: int
    ) -> tuple[_Ints, _Keys]:
        """The ``count`` rows of ``runs`` (rows of part, first position, length) of the smallest keys, each row
        by its index in run order, ties at the cut to the lower index, kept in a heap as the rows are scored: the
        indices ascending, and their keys."""
        self._check(q8, step, offset)
        heap_key, heap_at = np.empty(max(count, 0), np.float64), np.empty(max(count, 0), np.int64)
        size = _nearest_runs(self._part, q8, step, offset, self._l2, runs, heap_key, heap_at)
        order = np.argsort(heap_at[:size])
        return heap_at[:size][order], heap_key[:size][order]

    def nearest_each(self, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys, rows: _Ints, count: _Ints) -> _Ints:
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
        return out[: _nearest_each(self._part, q8, step, offset, self._l2, rows, self.base, want, keys, out)]

    def _check(self, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys) -> None:
        # the kernels check positions, not the query: a wrong shape would read past it
        parts = len(self._parts)
        if q8.shape != (parts, self.width) or step.shape != (parts,) or offset.shape != (parts,):
            raise ValueError(f"a query coded for {parts} parts of width {self.width} was expected")


def _addresses(arrays: Any) -> _Ints:
    """Where each array's data starts (0 for a missing one)."""
    return np.array([0 if a is None else a.ctypes.data for a in arrays], np.int64)


def _query(q: _Floats, dim: int) -> _Floats:
    """The query as the kernels take it: one specialization for every caller (same code, same bits)."""
    q = np.require(q, np.float32, ["C", "W"])
    if q.shape != (dim,):
        raise ValueError(f"a query of {dim} components was expected, got shape {q.shape}")
    return q
