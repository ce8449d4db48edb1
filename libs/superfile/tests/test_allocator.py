"""The compaction process hands back the megabyte buffers it frees (``superfile/allocator.py``).

glibc raises its mmap threshold to the size of each large block freed, so after the first one the megabyte
buffers of the index builds were served from malloc's arenas, and freed there they stayed with the process:
in a loop of compaction runs glibc's free bytes rose from 24 to 271 MB in 12 runs while its bytes in use
stayed at 24 MB (BENCHMARKS.md, "Soak"). The compaction process fixes the threshold at start.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import superfile
from maintenance_worker import SCHEMA, batch
from superfile.allocator import MMAP_THRESHOLD, glibc_bytes
from superfile.maintenance import CompactionPolicy, Compactor

pytestmark = pytest.mark.skipif(glibc_bytes() is None, reason="glibc only")

_BLOCKS = 48
_MIB = 1 << 20


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def _raise_threshold(libc: ctypes.CDLL) -> None:
    """Free a block larger than all of glibc's free bytes: it cannot come from an arena's free chunks, so it
    is mapped, and freeing it raises a dynamic threshold past 1 MiB (CI once served a 1 MiB one from free
    chunks: no raise, nothing measured)."""
    start = glibc_bytes()
    assert start is not None
    libc.free(libc.malloc(start[1] + _MIB))


def _free_every_other(libc: ctypes.CDLL, *, touch: bool) -> list[int]:
    """Allocate 96 blocks of 1 MiB (written to when ``touch``) and free every other one: the blocks left
    between them keep the holes from merging into the top and being trimmed. Returns the blocks left."""
    blocks = [libc.malloc(_MIB) for _ in range(2 * _BLOCKS)]
    if touch:
        for p in blocks:
            ctypes.memset(p, 1, _MIB)  # resident, as used buffers are
    for p in blocks[::2]:
        libc.free(p)
    return blocks[1::2]


def _in_new_process(printed: str) -> str:
    """What ``print(<printed>)`` writes in a fresh interpreter with this module imported as ``t``: allocator
    settings and thresholds are per process, so each measurement gets its own."""
    import subprocess

    code = f"import test_allocator as t; print({printed})"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    )
    return out.stdout


def churn_megabytes() -> int:
    """In the process it runs in, after :func:`_raise_threshold`: the growth of glibc's free bytes over
    :func:`_free_every_other`, 48 MiB when the blocks came from an arena, about nothing when each had its own
    mapping."""
    libc = _libc()
    _raise_threshold(libc)
    before = glibc_bytes()
    kept = _free_every_other(libc, touch=False)
    after = glibc_bytes()
    for p in kept:
        libc.free(p)
    assert before is not None and after is not None
    return after[1] - before[1]


def test_compaction_process_returns_the_megabyte_buffers_it_frees(tmp_path: Path) -> None:
    uri = (tmp_path / "db").as_uri()
    table = superfile.connect(uri).create_table("t", SCHEMA, max_rows_per_superfile=1000)
    for i in range(5):
        table.append(batch(i, 0, 20))
    compactor = Compactor(uri, CompactionPolicy(2))
    try:
        result = compactor.run("t")  # a real run, in the compaction process
        assert result is not None and result["superfiles_removed"] == 5
        assert table.count_rows() == 100
        pool = compactor._pool
        assert pool is not None
        grown = pool.submit(churn_megabytes).result()
    finally:
        compactor.close()
    assert grown < 4 * _MIB, grown  # 48 MiB and more before the compaction process fixed the threshold
    assert MMAP_THRESHOLD <= _MIB


def test_the_churn_measures_what_it_claims() -> None:
    """The same churn in a process whose threshold moves: the freed blocks stay in the arena (if this fails,
    glibc changed and the test above proves nothing)."""
    out = _in_new_process("t.churn_megabytes()")
    assert int(out) >= _BLOCKS * _MIB // 2, out


def _held_free_then(release: Callable[[float], None]) -> tuple[float, float]:
    """In the process it runs in: leave 48 touched megabytes free in glibc's arena (as a commit's freed index
    buffers are), then ``release(anonymous MB before)``. Returns the anonymous memory (MB) before and after."""
    libc = _libc()
    _raise_threshold(libc)
    kept = _free_every_other(libc, touch=True)
    before = _anon_mb()
    release(before)
    after = _anon_mb()
    for p in kept:
        libc.free(p)
    return before, after


def held_then_released_megabytes() -> tuple[float, float]:
    """48 MB left free, then :func:`release_unused`."""
    from superfile.allocator import release_unused

    return _held_free_then(lambda _: release_unused())


def _anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_release_unused_hands_back_what_the_arenas_hold_free() -> None:
    """What the builder does every few seconds after a commit (the freed megabyte buffers of its commits stay
    free in the arenas until handed back)."""
    before, after = map(float, _in_new_process("*t.held_then_released_megabytes()").split())
    assert before - after >= _BLOCKS // 2, (before, after)  # 48 MB held free; most of it goes back


def released_in_the_background_megabytes() -> tuple[float, float]:
    """48 MB left free, then :func:`release_periodically` (the gateway's, every 50 ms here) and up to 5 s for
    them to go."""
    import time

    from superfile.allocator import release_periodically

    def wait_for_release(before: float) -> None:
        release_periodically(0.05)
        deadline = time.monotonic() + 5
        while before - _anon_mb() < _BLOCKS // 2 and time.monotonic() < deadline:
            time.sleep(0.05)

    return _held_free_then(wait_for_release)


def test_a_serving_process_releases_in_the_background() -> None:
    """The gateway has no quiet moment after a burst of work to release in: a thread does it every 30 s."""
    before, after = map(float, _in_new_process("*t.released_in_the_background_megabytes()").split())
    assert before - after >= _BLOCKS // 2, (before, after)


def top_left_megabytes(bounded: bool) -> float:
    """In the process it runs in (after :func:`~superfile.allocator.bound_arenas` when ``bounded``): a thread of
    its own allocates 40 touched MiB from its arena and frees them, which leaves them free at the arena's top,
    then :func:`release_unused`. Returns the anonymous memory (MB) that stays."""
    import threading

    from superfile.allocator import bound_arenas, release_unused

    libc = _libc()
    if bounded:
        assert bound_arenas()
    else:
        libc.free(libc.malloc(24 * _MIB))  # a mapped block: the dynamic threshold rises to 24 MiB, its trim to 48
    base = _anon_mb()

    def churn() -> None:
        blocks = [libc.malloc(_MIB) for _ in range(40)]
        for p in blocks:
            ctypes.memset(p, 1, _MIB)
        for p in reversed(blocks):  # top first: each free merges into the top
            libc.free(p)

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    release_unused()
    return _anon_mb() - base


@pytest.mark.parametrize("bounded", [False, True])
def test_a_thread_arena_hands_back_its_top_only_when_bounded(bounded: bool) -> None:
    """The builder's step after a large commit: ``malloc_trim`` leaves a thread arena's top alone, and glibc's
    dynamic trim threshold lets it hold tens of MB; :func:`bound_arenas` (the builder, at start) bounds it."""
    left = float(_in_new_process(f"t.top_left_megabytes({bounded})"))
    if bounded:
        assert left <= 12, left  # at most the 8 MiB trim threshold stays
    else:
        assert left >= 30, left  # the control: if this fails, glibc changed and the bounded case proves nothing


def pool_threads_left_megabytes(serving: bool) -> float:
    """In the process it runs in (after :func:`~superfile.allocator.tune_for_serving` when ``serving``, with a
    release every 50 ms; otherwise that release alone): 4 pool threads that stay alive, as a server's do, make
    and free 40 touched MiB of Arrow buffers each; then up to 40 s for the memory to go (jemalloc's dirty and
    then muzzy pages decay over 10 s each: about 22 s here). Returns the anonymous memory (MB) that stays."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    from superfile.allocator import release_periodically, tune_for_serving

    if serving:
        tune_for_serving(release_every_s=0.05)
    else:
        release_periodically(0.05)
    base = _anon_mb()

    def churn(_: int) -> None:
        buffers = [pa.allocate_buffer(_MIB) for _ in range(40)]
        for b in buffers:
            ctypes.memset(b.address, 1, _MIB)

    pool = ThreadPoolExecutor(4)
    list(pool.map(churn, range(4)))
    deadline = time.monotonic() + (40 if serving else 3)
    while _anon_mb() - base > 16 and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _anon_mb() - base
    pool.shutdown()
    return left


@pytest.mark.parametrize("serving", [False, True])
def test_what_the_reading_threads_free_goes_back_in_a_serving_process(serving: bool) -> None:
    """A server's reads allocate Arrow buffers on pool threads that live for months. mimalloc (pyarrow's default
    pool) keeps the pages a thread freed until that thread hands them back, which a release from another thread
    does not do; a serving process allocates from the decode pool (jemalloc) instead (docs/gateway.md,
    "Memory")."""
    left = float(_in_new_process(f"t.pool_threads_left_megabytes({serving})"))
    if serving:
        assert left <= 16, left
    else:
        assert left >= 40, left  # of 160 MiB (runs kept 59.6-92); the control: else the serving case proves nothing
