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

Tantivy does not say in which order its merger takes the segments (its merge candidates come from a hash map).
The merge is told to sort its documents by the ``_id`` fast field every superfile's index holds
(``fulltext.ID_FIELD``; tantivy's ``sort_by_field``, set in the merge directory's settings only): with sources
whose rows are in ``_id`` order, as appended rows are, the merged segment is in ``_id`` order too, so a union
listing it breaks ties by document as the table breaks them by ``_id``, and fetches nothing past k. Each
document's part (found by its ``_id``) and row (its ``_row``) are read once after the merge, whatever order
tantivy chose.
Indexes written before the ``_id`` field are not merged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import tantivy
from cachetools import LRUCache

from superfile.format.fulltext import ID_FIELD, ROW_FIELD, analyzer_name, make_analyzer
from superfile.format.tantivy_files import read_meta, segment_files

__all__ = ["MIN_SEGMENTS", "Merged", "Merges", "Source", "on_merged", "plan"]

log = logging.getLogger(__name__)

# Tantivy's LogMergePolicy defaults, so its commit merges exactly the inputs given (checked after the merge)
MIN_SEGMENTS = 8  # a level merges once it holds this many segments
_MIN_LAYER_DOCS = 10_000  # smaller segments count as this size
_LEVEL_LOG = 0.75  # a level spans segment sizes within 2**0.75 of its largest
_MAX_DOCS = 10_000_000  # segments this large are not merged again
_WRITER_HEAP = 20_000_000  # the merging writer indexes nothing; tantivy wants at least 15 MB a thread
_GRACE = 8  # unions a merged segment may go unused before it is removed (as many as a pool keeps linked)
# ... and seconds: a pool shared by several shares or tables (a cache node's paddings build up to 32 unions a
# share) must not remove one share's segment while the others build, only to merge it again
_GRACE_S = 600.0
_READ_SLICE = 8192  # documents whose fast field values a merge reads in one call (``_column``)

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


@dataclasses.dataclass(frozen=True)
class Source:
    """One segment a union lists: a part's own (one part) or a merged one (several)."""

    directory: str
    parts: tuple[str, ...]  # the parts' keys (their segment ids)
    sizes: tuple[int, ...]  # documents of each

    @property
    def docs(self) -> int:
        return sum(self.sizes)


@dataclasses.dataclass(frozen=True, eq=False)
class Merged(Source):
    """A merged segment: its document ``d`` is row ``rows[d]`` of part ``parts[part[d]]``. ``ordered``: its
    documents are in ascending ``_id`` order."""

    part: np.ndarray  # int32, a document's index into ``parts``
    rows: np.ndarray  # int32
    ordered: bool


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
        self._builds = 0  # unions built by the pool: the clock of ``_used``
        self._used: dict[str, tuple[int, float]] = {}  # merged directory -> the build that last listed it, when

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
                    self._used[merged.directory] = (self._builds, time.monotonic())
            sources = chosen + [s for s in singles if s.parts[0] not in taken]
            picked = [sources[i] for i in plan([s.docs for s in sources])]
            key = frozenset(p for s in picked for p in s.parts)
            if picked and key not in self._pending and key not in self._failed and key not in self._made:
                self._pending.add(key)
                _submit(functools.partial(self._merge, picked, key))
            self._collect()
        return sources

    def _collect(self) -> None:
        """Remove the merged segments no union listed in the last :data:`_GRACE` builds nor :data:`_GRACE_S`
        seconds (an open searcher keeps the files it mapped). Called under the lock."""
        now = time.monotonic()
        for key, merged in list(self._made.items()):
            build, at = self._used[merged.directory]
            if self._builds - build > _GRACE and now - at > _GRACE_S:
                del self._made[key]
                self._used.pop(merged.directory, None)
                shutil.rmtree(merged.directory, ignore_errors=True)

    def _merge(self, sources: list[Source], key: frozenset[str]) -> None:
        directory = os.path.join(self.directory, uuid.uuid4().hex[:16])
        made: Merged | None = None
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
                    self._made[key] = made
                    self._used[made.directory] = (self._builds, time.monotonic())
                self._idle.notify_all()
        if made is not None:
            for listener in _listeners:
                listener()

    def wait(self, timeout: float) -> bool:
        """Whether no merge is pending, waiting up to ``timeout`` seconds (benchmarks and tests)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)


def merge(sources: Sequence[Source], directory: str, tokenizer: str) -> Merged:
    """Merge the segments of ``sources`` into one, in ``directory``, with tantivy's merger, its documents sorted
    by ``_id``; returns it. Raises ValueError when a source's index has no ``_id`` field, or tantivy
    did not merge them into one segment."""
    metas = [read_meta(s.directory) for s in sources]
    if any(len(m["segments"]) != 1 for m in metas):
        raise ValueError("a source has several segments")
    if any(ID_FIELD not in {f["name"] for f in m["schema"]} for m in metas):
        raise ValueError(f"a source's index has no {ID_FIELD} field (written before it was added)")
    known = [_documents(s) for s in sources]  # before the merge: a merged source is read from its own files
    os.makedirs(directory)
    for source, meta in zip(sources, metas, strict=True):
        for name in segment_files(source.directory, meta):
            os.symlink(os.path.join(source.directory, name), os.path.join(directory, name))
    settings = metas[0]["index_settings"]
    head = {
        **metas[0],
        "index_settings": {**settings, "sort_by_field": {"field": ID_FIELD, "order": "Asc"}},
        "segments": [m["segments"][0] for m in metas],
        "opstamp": max(m["opstamp"] for m in metas),
    }
    _write_meta(directory, head)
    index = tantivy.Index.open(directory)
    index.register_tokenizer(analyzer_name(tokenizer), make_analyzer(tokenizer))
    writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
    writer.commit()  # runs the merge policy over the sources: one level of MIN_SEGMENTS or more
    writer.wait_merging_threads()
    meta = read_meta(directory)
    total = sum(s.docs for s in sources)
    if len(meta["segments"]) != 1 or int(meta["segments"][0]["max_doc"]) != total:
        raise ValueError(f"tantivy left {len(meta['segments'])} segments, not one of {total} documents")
    _write_meta(directory, {**meta, "index_settings": settings})  # unions list it with their own settings
    for entry in os.scandir(directory):  # the links to the sources (tantivy removed none: it did not make them)
        if entry.is_symlink():
            os.unlink(entry.path)
    parts = tuple(p for s in sources for p in s.parts)
    sizes = tuple(n for s in sources for n in s.sizes)
    index.reload()
    searcher = index.searcher()
    ids, rows = _column(searcher, ID_FIELD, total), _column(searcher, ROW_FIELD, total)
    part = _locate(ids, known, [len(s.parts) for s in sources])
    ordered = bool(np.all(ids[1:] > ids[:-1]))
    return Merged(directory, parts, sizes, part.astype(np.int32), rows.astype(np.int32), ordered)


def _write_meta(directory: str, meta: dict[str, object]) -> None:
    tmp = os.path.join(directory, "meta.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(meta, fh)
    os.replace(tmp, os.path.join(directory, "meta.json"))


def _documents(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """Each document of ``source``: its ``_id`` and its part (an index into ``source.parts``)."""
    ids = _column(tantivy.Index.open(source.directory).searcher(), ID_FIELD, source.docs)
    return ids, source.part if isinstance(source, Merged) else np.zeros(len(ids), np.int32)


def _locate(ids: np.ndarray, known: list[tuple[np.ndarray, np.ndarray]], parts: list[int]) -> np.ndarray:
    """The part (numbered across the sources, in order; ``parts``: how many each has) of each merged document,
    found by its ``_id`` among the sources' documents (``known``). Raises ValueError unless every ``_id`` is one
    source document's."""
    first = np.cumsum([0, *parts[:-1]])
    every_id = np.concatenate([i for i, _ in known])
    every_part = np.concatenate([part + base for (_, part), base in zip(known, first, strict=True)])
    order = np.argsort(every_id, kind="stable")
    at = order[np.minimum(np.searchsorted(every_id, ids, sorter=order), len(order) - 1)]
    if len(ids) != len(every_id) or not np.array_equal(every_id[at], ids) or len(np.unique(at)) != len(at):
        raise ValueError("the merged segment's _ids are not its sources' (each once)")
    return every_part[at]


def _column(searcher: tantivy.Searcher, field: str, docs: int) -> np.ndarray:
    """A one-segment index's fast field ``field`` for every document (uint64), read in slices so that no one call
    holds the interpreter lock for long (~45 ms for 250,000 documents)."""
    out = np.empty(docs, np.uint64)
    for lo in range(0, docs, _READ_SLICE):
        addresses = [tantivy.DocAddress(0, d) for d in range(lo, min(lo + _READ_SLICE, docs))]
        out[lo : lo + len(addresses)] = cast(list[int], searcher.fast_field_values(field, addresses))
    return out
