"""Handing freed memory back to the system, in the processes that free much of what they allocate for long:
the builder's compaction process (fixed threshold, release after each run) and the builder itself (two arenas
that hand back their tops, :func:`bound_arenas`, and :func:`release_unused` every 10 s after a commit; a
threshold fixed at 128 KiB made its commits 25% slower, and they are the freshness path; ``docs/builder.md``,
"Memory"), and the serving processes (gateway, query root, cache node: :func:`tune_for_serving`).

Three things kept memory the process had freed (``BENCHMARKS.md``, "Soak"). Two grew the anonymous memory of
the soak's builder and of its compaction process by about 12 MB a minute each; one raised the builder's by
~170 MB for good, after a commit larger than the rest:

- **glibc's dynamic mmap threshold.** A block of at least ``M_MMAP_THRESHOLD`` (128 KiB at start) gets a
  mapping of its own, unmapped when freed. But freeing such a block raises the threshold to its size (up to
  32 MiB), so from then on the megabyte buffers of tantivy's indexing arena, the vector index and numpy land in
  malloc's arenas, one per thread that allocated them (up to 8 per core). Freed there, they stay with the
  process: in the compaction loop (one 35k-row output per run), glibc's free bytes rose from 24 to 271 MB over
  12 runs while its bytes in use stayed at 24 MB. Setting the threshold (:func:`fix_mmap_threshold`) turns
  the adjustment off: the same loop then held 22-43 MB free.
- **The tops of the arenas other than the main one.** ``malloc_trim`` returns the free pages inside every
  arena, but the free space at the top of a thread's arena only goes back when a free leaves more than the
  trim threshold there, and the dynamic threshold raises that to twice the mmap threshold (up to 64 MiB),
  per arena. One 10,000-row commit among 2,000-row ones left a process 100-170 MB bigger for good, however
  often ``release_unused`` ran: the soak's step after its first long compaction wait.
  :func:`bound_arenas` keeps the blocks the dynamic threshold would serve from the arenas there, but in two
  arenas whose tops go back past 8 MiB: the same sequence then stayed at its floor, commits as fast.
- **Arrow's memory pools.** mimalloc (pyarrow's default pool) and jemalloc (the decode pool) keep freed pages
  for reuse: after each compaction run, 200-450 MB of the process's anonymous memory was mimalloc's free pages
  while Arrow had 0 bytes allocated. :func:`release_unused` returns them, with what glibc holds free.

A fourth kept the serving processes growing: mimalloc's free pages belong to the thread that allocated them,
and only that thread hands them back, so a release from any other thread leaves those of the pool threads
that serve the reads. jemalloc's decay purges from a background thread, whichever thread freed the pages
(``test_allocator.py``: of 160 MiB freed on 4 live pool threads, mimalloc kept more than 64 MB, jemalloc
at most 16 within ~22 s). A reader following 40 commits with 4 reading threads went from 108 to 196-206 MB
with mimalloc, from 104 to 123-125 MB with jemalloc (``bench/reader_memory.py``). So
:func:`tune_for_serving` makes the decode pool Arrow's default pool.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
import threading
import time
from typing import Any

import pyarrow as pa

from superfile.pools import CORES

__all__ = [
    "MMAP_THRESHOLD",
    "bound_arenas",
    "fix_mmap_threshold",
    "glibc_bytes",
    "release_periodically",
    "release_unused",
    "tune_for_serving",
]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed
_ARENA_BLOCKS = 32 << 20  # the most glibc's dynamic threshold rises to (64-bit): blocks below come from arenas
_ARENAS = 2
_TRIM_THRESHOLD = 8 << 20
# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


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


def bound_arenas(arenas: int = _ARENAS, trim_bytes: int = _TRIM_THRESHOLD) -> bool:
    """glibc, at the start of a process whose allocations are its latency (the builder's commits): blocks under
    32 MiB come from malloc's arenas, as with the dynamic threshold once it has risen (no fresh mapping to fault
    in per buffer), but there are at most ``arenas`` of them and each hands the free space at its top back past
    ``trim_bytes`` (setting these turns the dynamic adjustment off, which would raise the trim threshold to
    64 MiB per arena). Call it before the threads that allocate start. Returns whether it was set.

    ``bench/commit_memory.py``, 2,000-row commits with text and 384-d vectors around one of 10,000 rows:
    anonymous memory 172-191 MB after it against 289-351 MB at glibc's defaults, commits as fast."""
    libc = _glibc()
    settings = ((_M_ARENA_MAX, arenas), (_M_MMAP_THRESHOLD, _ARENA_BLOCKS), (_M_TRIM_THRESHOLD, trim_bytes))
    return libc is not None and all(libc.mallopt(param, value) == 1 for param, value in settings)


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


def release_periodically(every_s: float = 30.0) -> threading.Thread:
    """A daemon thread calling :func:`release_unused` every ``every_s``: for a serving process (the gateway),
    whose reads free what they decode at any time and which has no quiet moment of its own to release in."""

    def loop() -> None:
        while True:
            time.sleep(every_s)
            try:
                release_unused()
            except Exception:  # never take the process down for a release
                log.exception("releasing unused memory failed")

    thread = threading.Thread(target=loop, name="superfile-release", daemon=True)
    thread.start()
    return thread


def tune_for_serving(release_every_s: float = 30.0) -> threading.Thread:
    """At the start of a serving process (gateway, query root, cache node), before its threads: one arena per
    core that hands back its top (:func:`bound_arenas`), and a thread releasing what the allocators keep free
    every ``release_every_s`` (:func:`release_periodically`); and Arrow allocates from the decode pool
    (jemalloc), whose free pages go back whichever thread freed them. Their reads free what they decode at any
    time, from many threads, for months (``docs/gateway.md``, "Memory")."""
    from superfile.format.reader import decode_pool

    bound_arenas(arenas=CORES)
    pa.set_memory_pool(decode_pool())
    return release_periodically(release_every_s)
