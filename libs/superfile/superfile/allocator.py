"""Handing freed memory back to the system, in the processes that free much of what they allocate for long:
the builder's compaction process (fixed threshold, release after each run) and the builder itself (glibc's
dynamic threshold, since its commits are the freshness path and the fixed threshold made them 25% slower;
:func:`release_unused` every 10 s after a commit instead; ``docs/builder.md``, "Memory").

Two allocators kept memory the process had freed, and so grew the anonymous memory of the soak's builder and
of its compaction process by about 12 MB a minute each (``BENCHMARKS.md``, "Soak"):

- **glibc's dynamic mmap threshold.** A block of at least ``M_MMAP_THRESHOLD`` (128 KiB at start) gets a
  mapping of its own, unmapped when freed. But freeing such a block raises the threshold to its size (up to
  32 MiB), so from then on the megabyte buffers of tantivy's indexing arena, the vector index and numpy land in
  malloc's arenas, one per thread that allocated them (up to 8 per core). Freed there, they stay with the
  process: in the compaction loop (one 35k-row output per run), glibc's free bytes rose from 24 to 271 MB over
  12 runs while its bytes in use stayed at 24 MB. Setting the threshold (:func:`fix_mmap_threshold`) turns
  the adjustment off: the same loop then held 22-43 MB free.
- **Arrow's memory pools.** mimalloc (pyarrow's default pool) and jemalloc (the decode pool) keep freed pages
  for reuse: after each compaction run, 200-450 MB of the process's anonymous memory was mimalloc's free pages
  while Arrow had 0 bytes allocated. :func:`release_unused` returns them, with what glibc holds free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from typing import Any

import pyarrow as pa

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold", "glibc_bytes", "release_unused"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (Linux), else None: the calls below are glibc's."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):  # musl has no mallinfo2 nor malloc_trim
        return None
    return libc


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """glibc: give every block of at least ``nbytes`` a mapping of its own (returned to the system when freed)
    and keep the threshold there (setting it turns off glibc's raising of it). Returns whether it was set.

    The cost: such blocks are fresh mappings, faulted in page by page. A 2,000-row commit (text and 384-d
    vectors) took 132-134 ms against 103-110 ms with the dynamic threshold (``docs/builder.md``, "Memory")."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, nbytes) == 1)


def glibc_bytes() -> tuple[int, int] | None:
    """glibc's bytes in use and bytes free but kept in its arenas (``mallinfo2``), or None off glibc."""
    libc = _glibc()
    if libc is None:
        return None
    info = libc.mallinfo2()
    return int(info.uordblks), int(info.fordblks)


def release_unused() -> None:
    """Return to the system the free memory the allocators keep: Arrow's pools (the default one and the decode
    pool) and glibc's arenas (``malloc_trim``). Costs a few milliseconds; call it when a burst of work is done."""
    from superfile.format.reader import decode_pool  # the reader imports much; this module is imported early

    pools = {id(p): p for p in (pa.default_memory_pool(), decode_pool())}
    for pool in pools.values():
        try:
            pool.release_unused()
        except Exception:  # a pool that cannot release (the system pool on some platforms): nothing to return
            log.debug("memory pool %s released nothing", pool.backend_name, exc_info=True)
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
