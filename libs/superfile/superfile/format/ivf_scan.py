"""The IVF first pass, compiled: int8 scores of many rows in one call that does not hold the interpreter lock.

Run by a numkong kernel call per run of adjacent probed lists, a 16-superfile query at nprobe 24 made ~160
calls and as many numpy passes to turn dots into keys; each released the interpreter lock for microseconds,
so a second thread searching handed the lock over ~300 times a query and two client threads answered fewer
queries a second than one (0.66x, ``bench/core_scaling.py``). These loops score every run of every part in
one call, the lock released throughout: the two threads then answered 1.76x what one did, and one thread
1.24x what it did before, on the same 250K-row table.

A row's key is ``-(step * (q8 . code) + offset)``, or ``|x|^2 - 2 (step * (q8 . code) + offset)`` under l2:
an estimate of its distance to the query, up to a term the same for every row, that compares across parts
(each has its own code scales and basis: ``IvfLists.query_codes``). The dot product is exact in integers,
the rest is float64 in this order, so a row gets the same key from a union of superfiles as from its own
index.

The kernels read each part's codes and norms where they lie (a mapped superfile), by address: numba's
typed lists would also serve, but building one costs ~0.5 s of compilation in every process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba.core import types
from numba.extending import intrinsic

__all__ = ["CodeScan"]

_Keys = npt.NDArray[np.float64]
_Ints = npt.NDArray[np.int64]


def _pointer_to(dtype: Any) -> Any:
    """An intrinsic turning an address into a typed pointer, for ``numba.carray``."""
    pointer = types.CPointer(dtype)

    @intrinsic
    def at(_typing: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(pointer))

        return pointer(types.intp), codegen

    return at


def _compiled(function: Any) -> Any:
    """``function`` compiled without the interpreter lock, its machine code kept on disk (~1 s to compile, a few
    ms to load): beside this file, else under ``NUMBA_CACHE_DIR`` or the user's cache directory. Where none
    is writable (a read-only image without a home), each process compiles it on first use instead."""
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(function)


_int8_at = _pointer_to(types.int8)
_float32_at = _pointer_to(types.float32)


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
def _scan_runs(
    code_at: Any, norm_at: Any, rows: Any, dims: Any, q8: Any, step: Any, offset: Any, l2: bool, runs: Any, keys: Any
) -> None:
    at = 0
    for r in range(runs.shape[0]):
        p, lo, n = runs[r, 0], runs[r, 1], runs[r, 2]
        if p < 0 or p >= len(rows) or lo < 0 or n < 0 or lo + n > rows[p]:
            raise IndexError("a run of rows past its part's codes")
        codes = numba.carray(_int8_at(code_at[p]), (rows[p], dims[p]))
        norms = numba.carray(_float32_at(norm_at[p]), (rows[p],))
        q = q8[p, : dims[p]]
        for i in range(n):
            keys[at + i] = _key(codes, norms, lo + i, q, step[p], offset[p], l2)
        at += n


@_compiled
def _scan_positions(
    code_at: Any,
    norm_at: Any,
    rows: Any,
    dims: Any,
    q8: Any,
    step: Any,
    offset: Any,
    l2: bool,
    p: int,
    pos: Any,
    keys: Any,
) -> None:
    codes = numba.carray(_int8_at(code_at[p]), (rows[p], dims[p]))
    norms = numba.carray(_float32_at(norm_at[p]), (rows[p],))
    q = q8[p, : dims[p]]
    for i in range(len(pos)):
        if pos[i] < 0 or pos[i] >= rows[p]:
            raise IndexError("a position past its part's codes")
        keys[i] = _key(codes, norms, pos[i], q, step[p], offset[p], l2)


class CodeScan:
    """First-pass keys over the codes of some IVF indexes (one metric), addressed by (part, position): each
    part given as its ``IvfLists`` codes (rows, code dims) int8 and row norms float32.

    Queries come coded per part (``IvfLists.query_codes``): ``q8`` (parts, widest code) int8, each row's first
    ``codes.shape[1]`` used, and per part ``step`` and ``offset`` (float64)."""

    def __init__(self, parts: Sequence[tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]], metric: str) -> None:
        for codes, norms in parts:
            if not (codes.flags.c_contiguous and norms.flags.c_contiguous and len(norms) == len(codes)):
                raise ValueError("a code scan reads codes and norms in place: a norm a row, contiguous")
        self._parts = list(parts)  # keeps the memory behind the addresses alive
        self._code_at = np.array([codes.ctypes.data for codes, _ in parts], np.int64)
        self._norm_at = np.array([norms.ctypes.data for _, norms in parts], np.int64)
        self._rows = np.array([codes.shape[0] for codes, _ in parts], np.int64)
        self._dims = np.array([codes.shape[1] for codes, _ in parts], np.int64)
        self._l2 = metric == "l2"

    @property
    def width(self) -> int:
        """The widest code: the columns of ``q8``."""
        return int(self._dims.max(initial=0))

    def runs(self, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys, runs: _Ints) -> _Keys:
        """Keys of the rows of ``runs`` (rows of part, first position, length), run after run."""
        keys = np.empty(int(runs[:, 2].sum()), np.float64)
        self._check(q8, step, offset)
        _scan_runs(self._code_at, self._norm_at, self._rows, self._dims, q8, step, offset, self._l2, runs, keys)
        return keys

    def positions(self, part: int, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys, pos: _Ints) -> _Keys:
        """Keys of part ``part``'s rows at positions ``pos`` (any order)."""
        keys = np.empty(len(pos), np.float64)
        self._check(q8, step, offset)
        if not 0 <= part < len(self._rows):
            raise IndexError(f"no part {part} among {len(self._rows)}")
        _scan_positions(
            self._code_at, self._norm_at, self._rows, self._dims, q8, step, offset, self._l2, part, pos, keys
        )
        return keys

    def _check(self, q8: npt.NDArray[np.int8], step: _Keys, offset: _Keys) -> None:
        # the kernels check positions, not the query: a wrong shape would read past it
        parts = len(self._rows)
        if q8.shape != (parts, self.width) or step.shape != (parts,) or offset.shape != (parts,):
            raise ValueError(f"a query coded for {parts} parts of width {self.width} was expected")
