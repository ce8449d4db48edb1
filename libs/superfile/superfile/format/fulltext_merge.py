"""Merged segments for full-text unions: many superfiles' small segments searched as one, merged in the background.

A union (``fulltext_union``) searches one segment per superfile. Tantivy looks each term up in every segment's
dictionary and collects every segment's top k from a zero threshold, so 16 segments of 15,625 rows took 1.5x
the time of one segment of 250,000 (0.74 against 0.48 ms a query, BENCHMARKS.md). A tantivy index merges its
segments as it grows; a union's are never written by an index writer, so its pool does it: once a union holds
at least :data:`MIN_SEGMENTS` segments of similar size, a task on the merge thread merges them with tantivy's own
merger (an index writer opened on links to their files, whose commit runs tantivy's merge policy). The merged
segment holds the same postings, norms and ``_row`` fast field, and the union's BM25 statistics (N, token
total, df per term) are sums over segments either way: scores are identical. Later unions of a snapshot
holding those superfiles list the merged segment in their place.

Tantivy does not say in which order it concatenates the segments (its merge candidates come from a hash map),
and a union maps each hit to its superfile. The order is recovered from the fieldnorms: each input's
per-document norm bytes appear, whole, as one run of the merged segment's. Inputs with equal norms are told
apart only when their files are equal too (either mapping then answers the same); otherwise that merge is not
made, and the union keeps the separate segments.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tantivy
from cachetools import LRUCache

from superfile.format.fulltext import ROW_FIELD, TEXT_FIELD, analyzer_name, make_analyzer
from superfile.format.tantivy_files import field_norms, read_meta, segment_files

__all__ = ["MIN_SEGMENTS", "Merged", "Merges", "Source", "on_merged", "plan"]

log = logging.getLogger(__name__)

# Tantivy's LogMergePolicy defaults, so its commit merges exactly the inputs given (checked after the merge)
MIN_SEGMENTS = 8  # a level merges once it holds this many segments
_MIN_LAYER_DOCS = 10_000  # smaller segments count as this size
_LEVEL_LOG = 0.75  # a level spans segment sizes within 2**0.75 of its largest
_MAX_DOCS = 10_000_000  # segments this large are not merged again
_WRITER_HEAP = 20_000_000  # the merging writer indexes nothing; tantivy wants at least 15 MB a thread
_GRACE = 8  # unions a merged segment may go unused before it is removed (as many as a pool keeps linked)
_CHECK_SLICE = 8192  # documents whose rows a merge checks in one call (``_in_order``)

_listeners: list[Callable[[], None]] = []
_tasks: queue.SimpleQueue[Callable[[], None]] | None = None  # merges to run, on one daemon thread
_tasks_lock = threading.Lock()


def _submit(task: Callable[[], None]) -> None:
    """Run ``task`` on this process's merge thread: one merge at a time, beside the searches. A daemon, so a
    process that searched once and exits does not wait for a merge it will not use (a merge killed half-way
    leaves only links and files in its pool, which is removed with the pool)."""
    global _tasks
    with _tasks_lock:
        if _tasks is None:
            _tasks = queue.SimpleQueue()
            threading.Thread(target=_work, args=(_tasks,), name="superfile-merge", daemon=True).start()
        _tasks.put(task)


def _work(tasks: queue.SimpleQueue[Callable[[], None]]) -> None:
    while True:
        tasks.get()()


def _forget_tasks() -> None:
    """In a forked child: the parent's merge thread is not there; the child starts its own."""
    global _tasks, _tasks_lock
    _tasks, _tasks_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_tasks)


def on_merged(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after each merge is ready, so unions built before it can be dropped and rebuilt."""
    _listeners.append(listener)


@dataclass(frozen=True)
class Source:
    """One segment a union lists: a part's own (one part) or a merged one (several, in document order)."""

    directory: str
    parts: tuple[str, ...]  # the parts' keys (their segment ids), in the order of their documents
    sizes: tuple[int, ...]  # documents of each

    @property
    def docs(self) -> int:
        return sum(self.sizes)

    def starts(self) -> list[int]:
        """The first document of each part."""
        return list(itertools.accumulate(self.sizes[:-1], initial=0))


@dataclass(frozen=True)
class Merged(Source):
    """A merged segment, made when its pool had built ``born`` unions. ``in_order``: its document ``d`` in the
    run of part ``i`` is that part's row ``d - starts()[i]`` (checked when made), so a hit needs no look-up of
    its ``_row``."""

    born: int
    in_order: bool


def plan(sizes: Sequence[int]) -> list[int]:
    """The indices of the segments to merge next: the first level of similar sizes (largest first) holding at
    least :data:`MIN_SEGMENTS`, as tantivy's LogMergePolicy picks them; empty if no level does."""
    order = sorted((i for i, n in enumerate(sizes) if 0 < n < _MAX_DOCS), key=lambda i: -sizes[i])
    level: list[int] = []
    top = math.inf
    for i in order:
        size = math.log2(max(sizes[i], _MIN_LAYER_DOCS))
        if top - size > _LEVEL_LOG:
            if len(level) >= MIN_SEGMENTS:
                return level
            level, top = [], size
        level.append(i)
    return level if len(level) >= MIN_SEGMENTS else []


class Merges:
    """A pool's merged segments (under ``directory``): which exist, which are being made, which failed."""

    def __init__(self, directory: str, tokenizer: str) -> None:
        self.directory, self.tokenizer = directory, tokenizer
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a merge ends
        self._made: dict[frozenset[str], Merged] = {}
        self._pending: set[frozenset[str]] = set()
        self._failed: LRUCache[frozenset[str], bool] = LRUCache(maxsize=256)  # not tried again
        self._builds = 0  # unions built by the pool: the clock of :attr:`Merged.born`
        self._used: dict[str, int] = {}  # merged directory -> the build that last listed it

    def cover(self, singles: Sequence[Source]) -> list[Source]:
        """The segments a union of these parts' segments lists: merged ones where made (the largest first),
        then the parts no merged segment holds, in the given order. Schedules the next merge its sizes call
        for, and removes merged segments no recent union listed."""
        with self._lock:
            self._builds += 1
            keys = {s.parts[0] for s in singles}
            chosen: list[Source] = []
            taken: set[str] = set()
            for merged in sorted(self._made.values(), key=lambda m: -m.docs):
                if taken.isdisjoint(merged.parts) and keys.issuperset(merged.parts) and os.path.isdir(merged.directory):
                    chosen.append(merged)
                    taken.update(merged.parts)
                    self._used[merged.directory] = self._builds
            sources = chosen + [s for s in singles if s.parts[0] not in taken]
            picked = [sources[i] for i in plan([s.docs for s in sources])]
            key = frozenset(p for s in picked for p in s.parts)
            if picked and key not in self._pending and key not in self._failed and key not in self._made:
                self._pending.add(key)
                _submit(functools.partial(self._merge, picked, key))
            self._collect()
        return sources

    def _collect(self) -> None:
        """Remove the merged segments no union listed in the last :data:`_GRACE` builds (an open searcher keeps
        the files it mapped). Called under the lock."""
        for key, merged in list(self._made.items()):
            if self._builds - max(merged.born, self._used.get(merged.directory, 0)) > _GRACE:
                del self._made[key]
                self._used.pop(merged.directory, None)
                shutil.rmtree(merged.directory, ignore_errors=True)

    def _merge(self, sources: list[Source], key: frozenset[str]) -> None:
        directory = os.path.join(self.directory, uuid.uuid4().hex[:16])
        made = None
        try:
            made = merge(sources, directory, self.tokenizer)
        except Exception as exc:  # a task of its own: any failure leaves the segments apart
            log.info("full-text segments not merged (the union keeps them apart): %s", exc)
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            with self._lock:
                self._pending.discard(key)
                if made is None:
                    self._failed[key] = True
                else:
                    self._made[key] = Merged(directory, made[0], made[1], self._builds, made[2])
                self._idle.notify_all()
        if made is not None:
            for listener in _listeners:
                listener()

    def wait(self, timeout: float) -> bool:
        """Whether no merge is pending, waiting up to ``timeout`` seconds (benchmarks and tests)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)


def merge(sources: Sequence[Source], directory: str, tokenizer: str) -> tuple[tuple[str, ...], tuple[int, ...], bool]:
    """Merge the segments of ``sources`` into one, in ``directory``, with tantivy's merger; returns the parts
    it holds and their sizes, in document order, and whether its rows are in order (:attr:`Merged.in_order`).
    Raises ValueError when tantivy did not merge them into one segment, or the order cannot be told (see the
    module's docstring)."""
    metas = [read_meta(s.directory) for s in sources]
    if any(len(m["segments"]) != 1 for m in metas):
        raise ValueError("a source has several segments")
    runs = _Runs([field_norms(s.directory, TEXT_FIELD)[0].fieldnorms for s in sources], sources)
    os.makedirs(directory)
    for source, meta in zip(sources, metas, strict=True):
        for name in segment_files(source.directory, meta):
            os.symlink(os.path.join(source.directory, name), os.path.join(directory, name))
    head = {**metas[0], "segments": [m["segments"][0] for m in metas], "opstamp": max(m["opstamp"] for m in metas)}
    tmp = os.path.join(directory, "meta.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(head, fh)
    os.replace(tmp, os.path.join(directory, "meta.json"))
    index = tantivy.Index.open(directory)
    index.register_tokenizer(analyzer_name(tokenizer), make_analyzer(tokenizer))
    writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
    writer.commit()  # runs the merge policy over the sources: one level of MIN_SEGMENTS or more
    writer.wait_merging_threads()
    meta = read_meta(directory)
    total = sum(s.docs for s in sources)
    if len(meta["segments"]) != 1 or int(meta["segments"][0]["max_doc"]) != total:
        raise ValueError(f"tantivy left {len(meta['segments'])} segments, not one of {total} documents")
    for entry in os.scandir(directory):  # the links to the sources (tantivy removed none: it did not make them)
        if entry.is_symlink():
            os.unlink(entry.path)
    order = runs.order(field_norms(directory, TEXT_FIELD)[0].fieldnorms)
    parts = tuple(p for i in order for p in sources[i].parts)
    sizes = tuple(n for i in order for n in sources[i].sizes)
    return parts, sizes, _in_order(directory, sizes)


def _in_order(directory: str, sizes: Sequence[int]) -> bool:
    """Whether each run of the merged segment in ``directory`` holds its part's rows in order: its documents'
    ``_row`` values are ``0 .. size - 1`` run after run. A part indexes row i as document i, and a merge keeps
    each segment's documents in their order; read here, once a merge (~45 ms for 250,000 rows), in slices
    so that no one call holds the interpreter lock for long."""
    searcher = tantivy.Index.open(directory).searcher()
    at = 0
    for size in sizes:
        for lo in range(0, size, _CHECK_SLICE):
            docs = [tantivy.DocAddress(0, at + lo + d) for d in range(min(_CHECK_SLICE, size - lo))]
            if searcher.fast_field_values(ROW_FIELD, docs) != list(range(lo, lo + len(docs))):
                return False
        at += size
    return True


class _Runs:
    """The sources' norms, by length and digest: where in a merged segment each source's documents are."""

    def __init__(self, norms: list[bytes], sources: Sequence[Source]) -> None:
        """Raises ValueError when two sources have equal norms and different files (their order is unknowable)."""
        self.sizes = [len(n) for n in norms]
        self.known: dict[tuple[int, bytes], list[int]] = {}
        for i, n in enumerate(norms):
            self.known.setdefault((len(n), _digest(n)), []).append(i)
        for same in self.known.values():
            if len(same) > 1 and not all(_same_files(sources[same[0]], sources[i]) for i in same[1:]):
                raise ValueError("two segments have the same norms but not the same files")

    def order(self, merged: bytes) -> list[int]:
        """The sources in the merged segment's document order: each one's norms are one run of ``merged``."""
        lengths = sorted(set(self.sizes))
        order: list[int] = []
        pos = 0
        while pos < len(merged):
            found = [
                i
                for size in lengths
                for i in self.known.get((size, _digest(merged[pos : pos + size])), [])
                if i not in order
            ]
            if not found or any(self.sizes[i] != self.sizes[found[0]] for i in found):
                raise ValueError(f"no single source's norms at document {pos} of the merged segment")
            order.append(found[0])
            pos += self.sizes[found[0]]
        if sorted(order) != list(range(len(self.sizes))):
            raise ValueError("the merged segment's norms are not its sources' in some order")
        return order


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _same_files(a: Source, b: Source) -> bool:
    """Whether two single-part sources' segment files have equal contents (by extension)."""
    if len(a.parts) != 1 or len(b.parts) != 1:
        return False

    def contents(source: Source) -> dict[str, bytes]:
        names = segment_files(source.directory, read_meta(source.directory))
        out = {}
        for name in names:
            with open(os.path.join(source.directory, name), "rb") as fh:
                out[name.split(".", 1)[1]] = fh.read()
        return out

    with contextlib.suppress(OSError):
        return contents(a) == contents(b)
    return False
