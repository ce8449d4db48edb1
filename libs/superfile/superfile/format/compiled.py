"""numba's compilation as the compiled kernels use it: without the interpreter lock, cached on disk, reading
sections by address. Imported only by the kernels' modules, which the rest import lazily (numba takes ~0.2 s
to import)."""

from __future__ import annotations

from typing import Any

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["compiled", "compiled_fast", "compiled_held", "pointer_to", "prefetch"]


def pointer_to(dtype: Any) -> Any:
    """An intrinsic turning an address into a typed pointer, for ``numba.carray``."""
    pointer = types.CPointer(dtype)

    @intrinsic
    def at(_typing: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(pointer))

        return pointer(types.intp), codegen

    return at


def _prefetch(_typing: Any, address: Any) -> Any:
    """Ask for the cache line at ``address`` (an integer) ahead of its use: reads of rows scattered over a mapped
    file wait on a page walk and a cache miss each, and a loop's own look-ahead covers only a row or two."""

    def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])  # read, keep, data
        return context.get_dummy_value()

    return types.void(types.intp), codegen


prefetch: Any = intrinsic(_prefetch)  # called from compiled code as prefetch(address)


def compiled(function: Any) -> Any:
    """``function`` compiled without the interpreter lock, its machine code kept on disk (~1 s to compile, a few
    ms to load): beside its module, else under ``NUMBA_CACHE_DIR`` or the user's cache directory. Where none
    is writable (a read-only image without a home), each process compiles it on first use instead."""
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(function)


def compiled_fast(function: Any) -> Any:
    """As :func:`compiled`, with float sums reassociated (so vectorized): float32 dot products."""
    try:
        return numba.njit(nogil=True, cache=True, fastmath={"reassoc", "nsz"})(function)
    except RuntimeError:
        return numba.njit(nogil=True, fastmath={"reassoc", "nsz"})(function)


def compiled_held(function: Any) -> Any:
    """As :func:`compiled`, keeping the interpreter lock: for a kernel of a few microseconds called from Python.
    Letting the lock go for that long hands it to a thread waiting for it, then waits to get it back: two
    context switches, which cost more than the kernel."""
    try:
        return numba.njit(cache=True)(function)
    except RuntimeError:
        return numba.njit()(function)
