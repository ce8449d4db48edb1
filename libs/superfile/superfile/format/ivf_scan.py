"""The steps of an IVF search that touch every probed superfile, compiled: each one call without the interpreter lock.

Run by a numkong kernel call per run of adjacent probed lists, a 16-superfile query at nprobe 24 made ~160
calls and as many numpy passes to turn dots into keys; each released the interpreter lock for microseconds,
so a second thread searching handed the lock over ~300 times a query and two client threads answered fewer
queries a second than one (0.66x, ``bench/core_scaling.py``). These loops score every run of every part in
one call, the lock released throughout: the two threads then answered 1.76x what one did, and one thread
1.24x what it did before, on the same 250K-row table. Routing (each part's centroids against the query) and
the projection of the query into each part's principal components were a BLAS call per part and per step,
with Python around each; they are compiled too. The first pass keeps the best rows of the whole search
in a heap as it scores them (``_nearest_runs``), or picks each part's best from its keys (``_nearest_each``).

A search runs from routing to its rerank pool's exact distances in one call (:meth:`IvfParts.first_pass`, and
:meth:`IvfParts.first_pass_each` for allowed rows per part): as separate steps, ~40 numpy calls around
the kernels each let the lock go for a few microseconds, and with a second thread searching each was a
hand-off; two threads answered 1.10-1.29x one at 250K rows, and 1.61-1.74x since. A filtered search allowing a
few hundred rows keeps the lock instead (:func:`_first_pass_each_held`): its parts are scanned row by row,
unrouted, in tens of microseconds, less than the two context switches of a release.

A row's key is ``-(step * (q8 . code) + offset)``, or ``|x|^2 - 2 (step * (q8 . code) + offset)`` under l2:
an estimate of its distance to the query, up to a term the same for every row, that compares across parts
(each has its own code scales and basis: ``_code``). The dot product is exact in
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
from superfile.format.compiled import compiled_held as _compiled_held
from superfile.format.compiled import pointer_to as _pointer_to
from superfile.format.compiled import prefetch as _prefetch
from superfile.format.distances import METRICS as _METRICS
from superfile.format.distances import distance, dot

__all__ = ["IvfParts", "IvfSections", "superfile_bounds"]

_Keys = npt.NDArray[np.float64]
_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float32]
_HELD_ROWS = 4096  # allowed rows whose positions are found keeping the interpreter lock (a few microseconds)
_AHEAD = 8  # rows asked for this far ahead where a search reads rows scattered over a mapped file
_HELD_SCAN = 512  # allowed rows whose first pass keeps the interpreter lock (tens of microseconds)


class IvfSections(Protocol):
    """What the kernels read of one IVF index (``vector_sections.IvfLists``): list centroids (nlist, dim) with their
    scoring bias, where each list starts in the list-ordered rows (``offsets``, nlist + 1), the search defaults
    (``nprobe``, ``rerank``), the int8 codes (rows, code dims) with per-component scales, the rows' vectors
    (rows, dim), norms and row offsets, each row offset's position, and for codes of principal components the
    mean and the axes (dim, code dims). All C-contiguous."""

    @property
    def centroids(self) -> _Floats: ...
    @property
    def bias(self) -> _Floats: ...
    @property
    def offsets(self) -> _Ints: ...
    @property
    def nprobe(self) -> int: ...
    @property
    def rerank(self) -> int: ...
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
_EXACT_DIMS = 1032  # int8 codes this wide sum exactly in float32: 1032 * 128 * 127 < 2**24
_MARK_SHARE = 32  # a part's allowed rows are sorted by marking its positions when at least 1/32 of its rows


@_compiled
def _route(cent_at: Any, bias_at: Any, nlist: Any, dim: int, parts: Any, first: Any, q: Any, out: Any) -> None:
    for i in range(len(parts)):
        p = parts[i]
        centroids = numba.carray(_float32_at(cent_at[p]), (nlist[p], dim))
        bias = numba.carray(_float32_at(bias_at[p]), (nlist[p],))
        at = first[p]
        for lst in range(nlist[p]):
            out[at + lst] = bias[lst] - np.float32(2.0) * dot(centroids[lst], q)


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
        offset[p] = dot(q, numba.carray(_float32_at(mean_at[p]), (dim,)))


@_compiled
def _key(codes: Any, norms: Any, i: int, q8: Any, step: float, offset: float, l2: bool) -> float:
    row = codes[i]
    dot: Any = 0  # an integer: numba widens the int8 products
    for j in range(len(row)):
        dot += np.int32(row[j]) * np.int32(q8[j])
    return _key_of(np.float64(dot), norms, i, step, offset, l2)


@_compiled
def _key_of(dot: float, norms: Any, i: int, step: float, offset: float, l2: bool) -> float:
    """Row ``i``'s key from its code's dot product with the query's (an integer, as a float64)."""
    if l2:
        norm = norms[i]
        return np.float64(norm * norm) - 2.0 * (dot * step + offset)
    return -step * dot - offset


@_compiled_fast
def _dot_code(row: Any, q: Any) -> Any:
    """A coded query's (as float32) dot product with one row of codes: exact, as :func:`_dots` says."""
    total = np.float32(0.0)
    for j in range(len(q)):
        total += np.float32(row[j]) * q[j]
    return total


@_compiled_fast
def _dots(codes: Any, lo: int, n: int, q: Any, out: Any) -> None:
    """The dot products of ``q`` (a coded query, as float32) with rows ``lo`` to ``lo + n`` of ``codes`` into
    ``out``, summed in float32: exact (every partial sum is an integer below 2**24 for codes of at most
    :data:`_EXACT_DIMS`), so in any order, and vectorised. A run's dots first, then its keys: 20% less time than
    a key at a time in integers, which numba widens to 64 bits (8 lanes, not 16)."""
    for i in range(n):
        out[i] = _dot_code(codes[lo + i], q)


@_compiled
def _prefetch_bytes(address: int, n: int) -> None:
    """Ask for the cache lines of ``n`` bytes at ``address``."""
    for line in range(address - address % 64, address + n, 64):
        _prefetch(line)


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
    dots = np.empty(0, np.float32)
    q32 = q8.astype(np.float32)  # once a query, not once a run
    for r in range(runs.shape[0]):
        p, lo, n, codes, norms = _run(part, runs, r)
        q = q8[p, : part[p, 3]]
        exact = part[p, 3] <= _EXACT_DIMS
        if exact:
            if n > len(dots):
                dots = np.empty(max(n, 2 * len(dots)), np.float32)
            _dots(codes, lo, n, q32[p, : part[p, 3]], dots)
        for i in range(n):
            if exact:
                key = _key_of(np.float64(dots[i]), norms, lo + i, step[p], offset[p], l2)
            else:
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
    rows cost ~15% more. Each row's codes are asked for :data:`_AHEAD` rows before they are scored: the 25,000
    rows a 10% filter allows of 250,000, each a page walk and a cache miss in a mapped file, took 1.0-2.3 ms
    scored as they came, 0.6-0.7 ms so."""
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
            if part[p, 3] <= _EXACT_DIMS:  # as _dots: exact in float32, vectorised, ~4x a key in integers
                q32 = q.astype(np.float32)
                width = part[p, 3]
                for j in range(i, end):
                    if j + _AHEAD < end:  # rows a filter scatters: each a page walk and a miss, asked for ahead
                        _prefetch_bytes(part[p, 0] + (rows[j + _AHEAD] - first) * width, width)
                        if l2:
                            _prefetch(part[p, 1] + (rows[j + _AHEAD] - first) * 4)
                    dot = _dot_code(codes[rows[j] - first], q32)
                    keys[j] = _key_of(np.float64(dot), norms, rows[j] - first, step[p], offset[p], l2)
            else:
                for j in range(i, end):
                    keys[j] = _key(codes, norms, rows[j] - first, q, step[p], offset[p], l2)
        written = _smallest(keys, i, end, want[p], out, written)
        i = end
    return written


@_compiled
def _list_rows(rows: Any, first_row: Any, end_row: Any, lists: Any, whole: Any, out: Any) -> int:
    """The rows of ``lists`` (ascending; list l holds rows ``first_row[l]`` to ``end_row[l]``) to score, into
    ``out``: every row of a list marked ``whole``, else those of the allowed ``rows`` (ascending) in it. One pass
    over both (numpy's steps took ~1 ms for the 100K rows a 10% filter allows of 1M). Returns how many."""
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


@_compiled
def _rerank(
    vectors_at: _Ints,
    part_at: _Ints,
    row_ids_at: _Ints,
    dim: int,
    part: _Ints,
    pos: _Ints,
    q: _Floats,
    metric: int,
    dist: _Floats,
    rows: _Ints,
) -> bool:
    """The exact distance to ``q`` of row ``pos[i]`` of part ``part[i]`` and its row offset into ``dist[i]``,
    ``rows[i]`` (``part_at``: a part's code and norm addresses, rows, code dims), each vector read where it lies;
    False at a position out of its part. Copying the pool out first, then computing its distances, read and
    wrote its vectors twice more: 0.23 ms more for the 2,500 rows of a 1% filter over 16 parts. Each row is
    asked for :data:`_AHEAD` rows before its distance: a 10% filter's 3,200 rows (a pool of 200 in each of 16
    superfiles) took ~1.8 ms of its first pass, each a page walk and misses in a mapped file."""
    for i in range(len(pos)):
        p, at = part[i], pos[i]
        if p < 0 or p >= len(part_at) or at < 0 or at >= part_at[p, 2]:
            return False
        ahead = i + _AHEAD
        if ahead < len(pos) and 0 <= part[ahead] < len(part_at):
            a, r = part[ahead], pos[ahead]
            _prefetch_bytes(vectors_at[a] + r * dim * 4, dim * 4)
            _prefetch(part_at[a, 1] + r * 4)
            _prefetch(row_ids_at[a] + r * 4)
        vector = numba.carray(_float32_at(vectors_at[p] + at * dim * 4), (dim,))
        norm = numba.carray(_float32_at(part_at[p, 1]), (part_at[p, 2],))[at]
        dist[i] = distance(vector, q, norm, metric)
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


@_compiled_held
def _positions_held(*args: Any) -> int:
    """:func:`_positions` keeping the interpreter lock, for a few allowed rows: microseconds."""
    return _positions(*args)


@_compiled
def _code(
    proj_at: _Ints,
    mean_at: _Ints,
    scale_at: _Ints,
    dims: _Ints,
    dim: int,
    p: int,
    q: _Floats,
    q8: npt.NDArray[np.int8],
    step: _Keys,
    offset: _Keys,
) -> None:
    """The query coded for part ``p`` as its codes are, into row ``p`` of ``q8`` (its first ``dims[p]``
    columns, the rest 0), ``step`` and ``offset``, such that ``step * (q8 . code) + offset`` estimates q.x for
    any of its rows: the query (or its principal components in the part's basis) times the part's
    per-component scales, as int8 with a step per part. Float32 steps as numpy takes them: a quotient of
    float32s is rounded back to float32 (numba divides in float64; rounding that is exact) before it is
    rounded to an integer."""
    n = dims[p]
    scale = numba.carray(_float32_at(scale_at[p]), (n,))
    if proj_at[p] != 0:  # the query's principal components in the part's own basis
        x = np.empty((1, n), np.float32)
        _project(proj_at, mean_at, dims, dim, np.full(1, p, np.int64), q, x, offset)
        row = x[0]
    else:  # full codes: the query itself
        row = q
    w = np.empty(n, np.float32)
    peak = np.float32(0.0)
    for c in range(n):
        w[c] = np.float32(row[c] * scale[c])
        peak = max(peak, abs(w[c]))
    s = np.float64(peak) / 127.0 if peak > 0 else 1.0
    s32 = np.float32(s)
    for c in range(n):
        q8[p, c] = np.int8(np.rint(np.float32(w[c] / s32)))
    for c in range(n, q8.shape[1]):
        q8[p, c] = 0
    step[p] = s


@_compiled
def _pool(
    vectors_at: _Ints, part: _Ints, row_ids_at: _Ints, dim: int, owner: _Ints, pos: _Ints, q: _Floats, metric: int
) -> tuple[_Ints, _Floats, _Ints]:
    """The rerank pool at positions ``pos`` of parts ``owner``: (owner, exact distances, row offsets)."""
    dist, rows = np.empty(len(pos), np.float32), np.empty(len(pos), np.int64)
    if not _rerank(vectors_at, part, row_ids_at, dim, owner, pos, q, metric, dist, rows):
        raise IndexError("a position out of its part's rows")
    return owner, dist, rows


@_compiled
def _choose(
    scores: _Floats,
    parts: _Ints,
    count: _Ints,
    k: int,
    nlist: _Ints,
    first: _Ints,
    size: _Ints,
    rows: _Ints,
    out: _Ints,
) -> int:
    """Each of ``parts``' ``count`` lists nearest by ``scores`` (ties: the lower list), more while they hold fewer
    than ``min(k, its rows)`` rows, as list numbers into ``out``, ascending; returns how many. The nearest are
    found by a partition, not a sort (a sort of 16 parts' 250 lists cost 0.15 ms a query)."""
    n = 0
    for i in range(len(parts)):
        p = parts[i]
        f, m = first[p], nlist[p]
        own = scores[f : f + m]
        take = min(count[i], m)
        start, held = n, 0
        if 0 < take < m:
            cut = np.partition(own.copy(), take - 1)[take - 1]
            ties = take  # how many lists scored equal to the cut make the count
            for j in range(m):
                if own[j] < cut:
                    ties -= 1
            for j in range(m):
                if own[j] < cut or (own[j] == cut and ties > 0):
                    if own[j] == cut:
                        ties -= 1
                    out[n] = f + j
                    n += 1
                    held += size[f + j]
        else:
            for j in range(take):
                out[n] = f + j
                n += 1
                held += size[f + j]
        if held < min(k, rows[p]):  # probe on until the lists hold k rows, as a part searched alone does
            order = np.argsort(own, kind="mergesort")
            seen, reach = 0, 0
            while reach < m:
                seen += size[f + order[reach]]
                reach += 1
                if seen >= k:
                    break
            n = start
            for j in range(max(take, reach)):
                out[n] = f + order[j]
                n += 1
    out[:n].sort()
    return n


@_compiled
def _first_pass(
    plan: tuple[Any, ...],
    start: _Ints,
    parts: _Ints,
    count: _Ints,
    k: int,
    want: int,
    q: _Floats,
) -> tuple[_Ints, _Floats, _Ints]:
    """:meth:`IvfParts.first_pass`, in one call: route, choose the lists, code the query for the parts probed,
    keep the ``want`` best rows of the probed lists in a heap, and rerank them."""
    cent_at, bias_at, nlist, first, dim, proj_at, mean_at, scale_at, part, width, l2, list_part = plan[:12]
    size, vectors_at, row_ids_at, metric = plan[12:]
    scores = np.zeros(first[-1], np.float32)
    _route(cent_at, bias_at, nlist, dim, parts, first, q, scores)
    lists = np.empty(first[-1], np.int64)
    chosen = lists[: _choose(scores, parts, count, k, nlist, first, size, part[:, 2], lists)]
    runs = np.empty((len(chosen), 3), np.int64)  # adjacent lists of one part make one run (part, first, length)
    r = -1
    for lst in chosen:
        if r >= 0 and runs[r, 0] == list_part[lst] and runs[r, 1] + runs[r, 2] == start[lst]:
            runs[r, 2] += size[lst]
        else:
            r += 1
            runs[r, 0], runs[r, 1], runs[r, 2] = list_part[lst], start[lst], size[lst]
    runs = runs[: r + 1]
    q8 = np.zeros((len(part), width), np.int8)
    step, offset = np.zeros(len(part), np.float64), np.zeros(len(part), np.float64)
    coded = np.zeros(len(part), np.bool_)
    for i in range(len(runs)):
        p = runs[i, 0]
        if not coded[p]:
            _code(proj_at, mean_at, scale_at, part[:, 3], dim, p, q, q8, step, offset)
            coded[p] = True
    heap_key, heap_at = np.empty(max(want, 0), np.float64), np.empty(max(want, 0), np.int64)
    best = np.sort(heap_at[: _nearest_runs(part, q8, step, offset, l2, runs, heap_key, heap_at)])
    owner, pos = np.empty(len(best), np.int64), np.empty(len(best), np.int64)
    r, at = 0, 0  # the run holding index best[i], and its first index in run order
    for i in range(len(best)):
        while best[i] >= at + runs[r, 2]:
            at += runs[r, 2]
            r += 1
        owner[i], pos[i] = runs[r, 0], runs[r, 1] + best[i] - at
    return _pool(vectors_at, part, row_ids_at, dim, owner, pos, q, metric)


@_compiled
def _filtered_lists(
    order: _Ints,
    first: int,
    first_row: _Ints,
    end_row: _Ints,
    rows: _Ints,
    count: int,
    target: float,
    out: _Ints,
    at: int,
) -> int:
    """A filtered part's lists with allowed ``rows``, in ``order`` (its lists nearest first, numbered from
    ``first``), until ``count`` of them and ``target`` allowed rows, into ``out[at:]``; returns the next free
    place."""
    useful, seen = 0, 0
    for j in range(len(order)):
        lst = first + order[j]
        held = np.searchsorted(rows, end_row[lst]) - np.searchsorted(rows, first_row[lst])
        if held == 0:
            continue
        if useful >= count and seen >= target:
            break
        out[at] = lst
        at += 1
        useful += 1
        seen += held
    return at


@_compiled
def _first_pass_each(
    plan: tuple[Any, ...],
    first_row: _Ints,
    end_row: _Ints,
    base: _Ints,
    default_nprobe: _Ints,
    default_rerank: _Ints,
    parts: _Ints,
    allowed: _Ints,
    rows: _Ints,
    nprobe: int,
    rerank: int,
    k: int,
    brute_factor: float,
    exponent: float,
    q: _Floats,
) -> tuple[_Ints, _Floats, _Ints]:
    """:meth:`IvfParts.first_pass_each`, in one call."""
    cent_at, bias_at, nlist, first, dim, proj_at, mean_at, scale_at, part, width, l2, list_part = plan[:12]
    size, vectors_at, row_ids_at, metric = plan[12:]
    counts = np.empty(len(parts), np.int64)
    brute = np.zeros(len(parts), np.bool_)
    for i in range(len(parts)):
        p, m = parts[i], nlist[parts[i]]
        counts[i] = min(nprobe, m) if nprobe else default_nprobe[p]
        brute[i] = allowed[i] <= np.floor(brute_factor * counts[i] * part[p, 2] / max(m, 1))
    scores = np.zeros(first[-1], np.float32)
    _route(cent_at, bias_at, nlist, dim, parts[~brute], first, q, scores)  # a part scanned row by row needs none
    lists = np.empty(first[-1], np.int64)
    whole = np.zeros(len(nlist), np.bool_)
    pool = np.zeros(len(nlist), np.int64)
    at = 0
    for i in range(len(parts)):
        p, m = parts[i], nlist[parts[i]]
        n, f = part[p, 2], first[p]
        count = counts[i]
        pool[p] = max(rerank if rerank else default_rerank[p], k)
        whole[p] = allowed[i] == n  # unfiltered: every row of its probed lists
        if brute[i]:  # few rows: each scored (below)
            continue
        if whole[p]:
            at += _choose(
                scores, parts[i : i + 1], np.full(1, count, np.int64), k, nlist, first, size, part[:, 2], lists[at:]
            )
        else:  # its lists with allowed rows, nearest first, until count of them and its share of what probing scans
            order = np.argsort(scores[f : f + m], kind="mergesort")
            probed = 0
            for j in range(max(count, 1)):
                if j < m:
                    probed += size[f + order[j]]
            target = max(k, np.ceil(probed * (allowed[i] / max(n, 1)) ** exponent))
            at = _filtered_lists(order, f, first_row, end_row, rows, count, target, lists, at)
    chosen = np.sort(lists[:at])
    total = len(rows)
    for lst in chosen:
        if whole[list_part[lst]]:
            total += size[lst]
    for i in range(len(parts)):
        if brute[i] and whole[parts[i]]:
            total += allowed[i]
    scored = np.empty(total, np.int64)
    done, c, list_whole = 0, 0, whole[list_part]
    for i in range(len(parts)):  # each part's rows to score, ascending: a scanned part's allowed rows, else its lists'
        p = parts[i]
        if brute[i] and whole[p]:
            scored[done : done + allowed[i]] = np.arange(base[p], base[p + 1])
            done += allowed[i]
            continue
        a, b = np.searchsorted(rows, base[p]), np.searchsorted(rows, base[p + 1])
        if brute[i]:
            scored[done : done + b - a] = rows[a:b]
            done += b - a
            continue
        e = c
        while e < len(chosen) and list_part[chosen[e]] == p:
            e += 1
        done += _list_rows(rows[a:b], first_row, end_row, chosen[c:e], list_whole, scored[done:])
        c = e
    scored = scored[:done]
    q8 = np.zeros((len(nlist), width), np.int8)
    step, offset = np.zeros(len(nlist), np.float64), np.zeros(len(nlist), np.float64)
    held = np.diff(np.searchsorted(scored, base))
    for p in range(len(nlist)):
        if held[p] > pool[p]:  # a part whose rows all fit its pool is taken whole: not coded, not scored
            _code(proj_at, mean_at, scale_at, part[:, 3], dim, p, q, q8, step, offset)
    keys, out = np.empty(len(scored), np.float64), np.empty(min(len(scored), pool.sum()), np.int64)
    best = scored[out[: _nearest_each(part, q8, step, offset, l2, scored, base, pool, keys, out)]]
    owner = np.searchsorted(base, best, side="right") - 1
    pos = best - base[owner]
    return _pool(vectors_at, part, row_ids_at, dim, owner, pos, q, metric)


@_compiled_held
def _first_pass_each_held(*args: Any) -> tuple[_Ints, _Floats, _Ints]:
    """:func:`_first_pass_each` keeping the interpreter lock, for a few hundred allowed rows (tens of
    microseconds: less than the two context switches a release costs with another thread waiting)."""
    return _first_pass_each(*args)


@_compiled
def _best(dist: _Floats, part: _Ints, rows: _Ints, a: int, b: int, k: int, out: _Ints, at: int) -> int:
    """The first ``k`` of candidates ``a:b`` by (distance, part, row) into ``out[at:]``, in that order; returns
    the next free place. A stable sort by distance, then each run of equal distances (up to the k-th) by (part,
    row): an insertion of each candidate into the ``k`` held took 0.15 ms at k 100, a hybrid search's depth.
    Where the candidates are many for ``k`` (a filtered search's pool of 200 in each part, k 10), only those at or
    below the k-th distance are sorted: every tie of a kept distance is among them, so the order is the same,
    and sorting each part's pool whole took ~0.1 ms of a 10% filtered search."""
    n = b - a
    cap = min(k, n)
    if cap <= 0:
        return at
    held = np.arange(a, b)
    if n > 4 * cap:
        below = held[dist[a:b] <= np.partition(dist[a:b], cap - 1)[cap - 1]]
        if len(below) >= cap:  # else a NaN cut (no query or row has one; they are refused): every candidate
            held = below
    order = held[np.argsort(dist[held], kind="mergesort")]
    n = len(order)
    i = 0
    while i < cap:
        j = i + 1
        while j < n and dist[order[j]] == dist[order[i]]:
            j += 1
        for x in range(i + 1, j):  # a run of ties, by (part, row)
            y, m = order[x], x
            while m > i and (
                part[order[m - 1]] > part[y] or (part[order[m - 1]] == part[y] and rows[order[m - 1]] > rows[y])
            ):
                order[m] = order[m - 1]
                m -= 1
            order[m] = y
        i = j
    out[at : at + cap] = order[:cap]
    return at + cap


@_compiled_held
def _ranked(dist: _Floats, part: _Ints, rows: _Ints, k: int, each: bool) -> _Ints:
    """:meth:`IvfParts.ranked`: a rerank pool's few hundred candidates, ~3 us, so it keeps the interpreter lock."""
    out = np.empty(len(dist), np.int64)
    if each:
        at, i = 0, 0
        while i < len(dist):
            j = i
            while j < len(dist) and part[j] == part[i]:
                j += 1
            if j < len(dist) and part[j] < part[i]:
                raise ValueError("the candidates' parts must not descend")
            at = _best(dist, part, rows, i, j, k, out, at)
            i = j
        return out[:at]
    best = out[: _best(dist, part, rows, 0, len(dist), k, out, 0)]
    return best[np.argsort(part[best], kind="mergesort")]  # by part, stably


@_compiled_held
def _superfile_bounds(centroids: _Floats, radii: _Keys, at: _Ints, q: _Floats, metric: int) -> tuple[_Ints, _Keys]:
    """:func:`superfile_bounds`: some tens of superfiles, a few microseconds, so it keeps the interpreter lock."""
    n, dim = len(at), len(q)
    bound = np.zeros(n, np.float64)
    if metric == 2:  # dot has no bound: nearest centroid first
        for i in range(n):
            dot = 0.0
            for j in range(dim):
                dot += float(centroids[at[i], j]) * float(q[j])
            bound[i] = -dot
        return np.argsort(bound, kind="mergesort"), np.zeros(n, np.float64)
    g = q.astype(np.float64)
    if metric == 1:
        g /= max(np.sqrt(np.sum(g * g)), 1e-30)
    for i in range(n):
        d2 = 0.0
        for j in range(dim):
            d = float(centroids[at[i], j]) - g[j]
            d2 += d * d
        gap = max(0.0, np.sqrt(d2) - radii[at[i]])
        gap = max(0.0, gap * (1 - 1e-5) - 1e-6)  # float32 slack: stay conservative
        bound[i] = gap * gap / 2 if metric == 1 else gap * gap
    order = np.argsort(bound, kind="mergesort")
    return order, bound[order]


def superfile_bounds(centroids: _Floats, radii: _Keys, at: _Ints, q: _Floats, metric: str) -> tuple[_Ints, _Keys]:
    """The superfiles ``at`` (rows of their summaries' ``centroids`` and ``radii``) nearest ``q`` first, with the
    smallest distance under ``metric`` any vector of each can have to q (its centroid's distance less its
    radius; 0 under dot, which has no such bound, where they come by descending dot product instead). One
    call: as numpy steps over 16 superfiles of 384 dimensions it let the interpreter lock go six times."""
    return _superfile_bounds(
        np.ascontiguousarray(centroids, np.float32),
        np.ascontiguousarray(radii, np.float64),
        np.ascontiguousarray(at, np.int64),
        np.ascontiguousarray(q, np.float32),
        _METRICS[metric],
    )


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
                x.row_pos,
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
        self.nlist = np.array([len(x.bias) for x in parts], np.int64)
        self._first = np.concatenate(([0], np.cumsum(self.nlist)))  # part p's lists: first[p] .. first[p + 1]
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
        self._scale_at = _addresses(x.scale for x in parts)
        # each list's part, first position in its part's rows and length, numbered across the parts
        self.list_part = np.repeat(np.arange(len(parts), dtype=np.int64), self.nlist)
        self.start = np.concatenate([np.asarray(x.offsets[:-1], np.int64) for x in parts] or [np.zeros(0, np.int64)])
        self.size = np.concatenate([np.diff(np.asarray(x.offsets, np.int64)) for x in parts] or [np.zeros(0, np.int64)])
        if (
            len(self.start) != self.lists
            or np.any(self.size < 0)
            or np.any(self.start + self.size > rows[self.list_part])
        ):
            raise ValueError("list offsets past their part's rows")
        # each list's first row and end in the parts' joint numbering (see ``base``): ascending
        self.first_row = self.base[self.list_part] + self.start
        self.end_row = self.first_row + self.size
        self.nprobe = np.minimum(np.array([x.nprobe for x in parts], np.int64), np.maximum(self.nlist, 1))
        self.rerank = np.array([x.rerank for x in parts], np.int64)
        # what both compiled searches take first (one tuple): the parts' centroids, codes and their geometry
        self._plan = (
            self._cent_at,
            self._bias_at,
            self.nlist,
            self._first,
            self._dim,
            self._proj_at,
            self._mean_at,
            self._scale_at,
            self._part,
            self.width,
            self._l2,
            self.list_part,
            self.size,
            self._vectors_at,
            self._row_ids_at,
            _METRICS[metric],
        )

    @property
    def lists(self) -> int:
        """The lists of all the parts: the length of the routing scores."""
        return int(self._first[-1])

    def positions(self, parts: _Ints, ids: npt.NDArray[np.uint32], ends: _Ints) -> tuple[_Ints, _Ints]:
        """For each of ``parts``, its allowed row offsets ``ids[ends[i - 1]:ends[i]]`` (ascending; those past its
        rows dropped): how many it allows, and, of the parts allowing some rows but not all, the rows'
        positions in the parts' numbering together (each part's ascending, from ``base[part]``), in one call
        rather than a handful of numpy calls a part (each releasing the interpreter lock)."""
        counts = np.empty(len(parts), np.int64)
        rows = np.empty(len(ids), np.int64)
        parts, ends = np.ascontiguousarray(parts, np.int64), np.ascontiguousarray(ends, np.int64)
        kernel = _positions_held if len(ids) <= _HELD_ROWS else _positions
        filled = kernel(self._part, self._row_pos_at, self.base, parts, np.ascontiguousarray(ids), ends, counts, rows)
        if filled < 0:
            raise IndexError("a part out of the union, or ends out of the offsets")
        return counts, rows[:filled]

    def first_pass(self, q: _Floats, parts: _Ints, nprobe: int, k: int, want: int) -> tuple[_Ints, _Floats, _Ints]:
        """The ``want`` rows of the best keys among the lists probed in ``parts`` (ascending, distinct), with their
        exact distances to q: (part, distances, row offsets), in the parts' order and each part's list order.

        Each part probes its ``nprobe`` nearest lists (0: its default), more while they hold fewer than ``k`` rows
        (the lists a search of the part alone probes), and its rows are scored into a heap (``_nearest_runs``).
        One call without the interpreter lock from routing to the reranked pool: as ~40 numpy steps, each let the
        lock go, and with a second thread searching each was a hand-off (two threads answered 1.08x one at
        nprobe 8)."""
        parts = np.ascontiguousarray(parts, np.int64)
        if len(parts) and (parts[0] < 0 or parts[-1] >= len(self._parts) or np.any(parts[1:] <= parts[:-1])):
            raise IndexError(f"parts must ascend, each in [0, {len(self._parts)})")
        count = np.minimum(nprobe, self.nlist[parts]) if nprobe else self.nprobe[parts]
        return _first_pass(
            self._plan,
            self.start,
            parts,
            count,
            k,
            want,
            _query(q, self._dim),
        )

    def first_pass_each(
        self,
        q: _Floats,
        parts: _Ints,
        allowed: _Ints,
        rows: _Ints,
        nprobe: int,
        rerank: int,
        k: int,
        brute_factor: float,
        exponent: float,
    ) -> tuple[_Ints, _Floats, _Ints]:
        """Each part's pool of the best rows it allows, with their exact distances to q: (part, distances, row
        offsets), the parts in order. ``parts`` ascend, each allowing ``allowed`` rows: all of its rows, or those
        of ``rows`` (ascending, in the joint numbering) in it. ``nprobe``, ``rerank``: 0 for each part's own.

        A part allowing at most ``brute_factor`` times what its probing scans has each allowed row scored; an
        unfiltered one probes as in :meth:`first_pass`; a filtered one probes its lists holding allowed rows,
        nearest first, until ``nprobe`` of them and its probing's rows times the allowed share ``**
        exponent``. Its pool (``max(rerank, k)``) is picked from its own keys (``_nearest_each``), or is
        all it holds when that fits. One call without the interpreter lock, as :meth:`first_pass`."""
        parts = np.ascontiguousarray(parts, np.int64)
        allowed, rows = np.ascontiguousarray(allowed, np.int64), np.ascontiguousarray(rows, np.int64)
        if len(allowed) != len(parts):
            raise ValueError("an allowed count for each part was expected")
        if len(parts) and (parts[0] < 0 or parts[-1] >= len(self._parts) or np.any(parts[1:] <= parts[:-1])):
            raise IndexError(f"parts must ascend, each in [0, {len(self._parts)})")
        few = int(allowed.sum()) <= _HELD_SCAN  # a few hundred rows: routing, if any, and scans are short
        return (_first_pass_each_held if few else _first_pass_each)(
            self._plan,
            self.first_row,
            self.end_row,
            self.base,
            self.nprobe,
            self.rerank,
            parts,
            allowed,
            rows,
            nprobe,
            rerank,
            k,
            brute_factor,
            exponent,
            _query(q, self._dim),
        )

    @staticmethod
    def ranked(dist: _Floats, part: _Ints, rows: _Ints, k: int, *, each: bool = False) -> _Ints:
        """The indices of the ``k`` candidates first by (distance, part, row), ordered by part (stably), each
        part's nearest first; or (``each``) of each part's ``k`` first, the parts' candidates adjacent and in
        ascending order. numpy's ``lexsort`` and the steps around it in one call."""
        if not len(dist) == len(part) == len(rows):
            raise ValueError("a part and a row for each distance were expected")
        dist = np.ascontiguousarray(dist, np.float32)
        return _ranked(dist, np.ascontiguousarray(part, np.int64), np.ascontiguousarray(rows, np.int64), k, each)


def _addresses(arrays: Any) -> _Ints:
    """Where each array's data starts (0 for a missing one)."""
    return np.array([0 if a is None else a.ctypes.data for a in arrays], np.int64)


def _query(q: _Floats, dim: int) -> _Floats:
    """The query as the kernels take it: one specialization for every caller (same code, same bits)."""
    q = np.require(q, np.float32, ["C", "W"])
    if q.shape != (dim,):
        raise ValueError(f"a query of {dim} components was expected, got shape {q.shape}")
    return q
