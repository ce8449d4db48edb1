"""The process's in-memory caches: one LRU implementation (cachetools.LRUCache) behind every one of them.

``superfile._lru.LRU`` (manifests, segments, readers, search unions, filter bitsets, ...) keeps futures in a
cachetools.LRUCache under a lock; the search's deleted-text statistics and the gateway's handles on past versions
are cachetools.LRUCaches under their owners' locks. No module keeps an LRU of its own (an OrderedDict moved to
its end on use and popped from its front past a capacity): there were three.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from pathlib import Path

import pytest
from superfile._lru import LRU

ROOT = Path(__file__).resolve().parents[3]
# The idioms of a hand-made LRU over an OrderedDict: move a used key to the end, pop the oldest from the front.
HAND_MADE = re.compile(r"\.move_to_end\(|\.popitem\(\s*last\s*=\s*False")


def test_one_lru_implementation() -> None:
    """No module of the library or the services orders and evicts a cache by hand: cachetools does it."""
    sources = [*ROOT.glob("libs/superfile/superfile/**/*.py"), *ROOT.glob("services/*/superfile_*/**/*.py")]
    assert len(sources) > 50
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HAND_MADE.search(line)
    ]
    assert not found, f"hand-made LRUs (use cachetools.LRUCache, as superfile._lru does): {found}"


def test_least_recently_used_is_evicted() -> None:
    cache = LRU(2)
    assert cache.get_or_load("a", lambda: 1) == (1, True)
    assert cache.get_or_load("b", lambda: 2) == (2, True)
    assert cache.get_or_load("a", lambda: 0) == (1, False)  # a hit: "a" is now the most recently used
    assert cache.get_or_load("c", lambda: 3) == (3, True)  # past the capacity: "b" goes
    assert "a" in cache and "c" in cache and "b" not in cache
    assert cache.get_or_load("b", lambda: 4) == (4, True)  # loaded again; "a" was least recently used
    assert "a" not in cache


def test_concurrent_loads_of_one_key_share_one_load() -> None:
    cache = LRU(4)
    calls = []
    started = threading.Event()

    def load() -> str:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return "value"

    results: list[tuple[str, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_load("k", load))) for _ in range(8)]
    threads[0].start()
    started.wait(5)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert sorted(results) == [("value", False)] * 7 + [("value", True)]


def test_a_failed_load_is_forgotten() -> None:
    """Its callers see the error; the next call loads again."""
    cache = LRU(4)

    def fail() -> int:
        raise OSError("storage is down")

    with pytest.raises(OSError, match="storage is down"):
        cache.get_or_load("k", fail)
    assert "k" not in cache
    assert cache.get_or_load("k", lambda: 7) == (7, True)


def test_many_threads_keep_the_capacity() -> None:
    cache = LRU(8)

    def work(offset: int) -> None:
        for i in range(500):
            key = str((i * 7 + offset) % 32)
            value, _ = cache.get_or_load(key, functools.partial(str, key))
            assert value == key

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(str(i) in cache for i in range(32)) == 8
