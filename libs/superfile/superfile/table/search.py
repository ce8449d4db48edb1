"""Search over a snapshot: prune superfiles from manifest summaries, search the rest in parallel, merge.

Every search is the spec's fan-out: (1) start from the pinned manifest,
(2) skip superfiles the summaries prove irrelevant (term bloom filters, term
ranges, scalar min/max, vector centroid and radius), always conservatively,
(3) run the per-superfile kernel on the query pool, (4) merge into one ranked
result, then resolve hits (superfile, row offset) to ``_id`` and the projected
columns. Result schemas carry per-query counts in their metadata
(``superfile.superfiles``, ``superfile.pruned``, ``superfile.searched``).
"""

from __future__ import annotations

import array
import itertools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import pyroaring
from cachetools import LRUCache

from superfile._lru import LRU
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    InvalidVectorError,
    QueryLimitError,
    UnknownColumnError,
    VectorDimensionError,
)
from superfile.expressions import Predicate, parse_predicate
from superfile.format.fulltext import (
    Candidates,
    CorpusStats,
    FullTextIndex,
    corpus_df,
    global_top_k,
    make_analyzer,
    thread_analyzer,
)
from superfile.format.fulltext_merge import on_merged
from superfile.format.fulltext_union import PaddedUnion, UnionIndex, UnionText, union_of, union_text
from superfile.format.vector_sections import query_length
from superfile.format.vector_union import Hits as VectorHits
from superfile.format.vector_union import VectorUnion
from superfile.manifest.model import SuperfileEntry
from superfile.pools import search_pool, searching
from superfile.schema import ID, SCORE
from superfile.search.request import (
    Bm25Search,
    ExactMatch,
    HybridSearch,
    PrefixSearch,
    SearchRequest,
    TokenMatch,
    VectorSearch,
)
from superfile.table.exact import ExactCandidates, ExactText, analysed, nearest
from superfile.table.results import ranked_ids, ranked_table, result_column
from superfile.table.snapshot import Snapshot, on_release, open_readers

__all__ = [
    "HYBRID_DEPTH",
    "MAX_K",
    "MAX_PREFIX_TERMS",
    "RRF_K",
    "Searcher",
    "check_row_limit",
    "rrf_fuse",
    "top_terms",
]

log = logging.getLogger(__name__)
_SEGMENT_FILES = 8  # files a tantivy segment maps: 6 here (postings, positions, terms, fast, norms, store)
T = TypeVar("T")

_ascending = LRU(4096)  # storage URI # superfile path -> whether its rows are in ascending _id order


class _NewestSnapshots:
    """Search state built once per snapshot (unions, stacked summaries), kept for each table's ``keep`` most
    recently searched snapshots only.

    Keyed by snapshot alone, a process-wide LRU of 16 held a streaming table's sixteen latest snapshots: each
    union maps every segment file and copies every superfile's IVF lists, so the soak's gateway (a commit a
    second) mapped segment files up to 17 times and grew by ~1 GB of copies (BENCHMARKS.md, "Soak")."""

    every: ClassVar[list[_NewestSnapshots]] = []  # what :func:`_release_snapshots` goes through

    def __init__(self, keep: int = 2, tables: int = 64) -> None:
        self._items = LRU(keep * tables)
        self._keep = keep
        self._lock = threading.Lock()
        # table # column -> its snapshots' keys, most recent last; bounded like the values, by table
        self._recent: LRUCache[str, list[str]] = LRUCache(maxsize=tables)
        # table -> its most recent snapshot and that one's state: what almost every search asks for, answered
        # from one dict read (the lists above and the LRU under two locks took ~4 us a search)
        self._hot: dict[str, tuple[str, Any]] = {}
        self._tables = tables
        self._cleared = 0  # how many times clear() ran: a load begun before it is not made hot
        _NewestSnapshots.every.append(self)

    def release(self, uri: str, keep: Callable[[str], bool]) -> None:
        """Drop the state of the snapshots of table ``uri`` whose key ``keep`` rejects."""
        prefix = f"{uri}#"
        stale: set[str] = set()
        with self._lock:
            for table in [t for t in self._recent if t.startswith(prefix)]:
                recent = self._recent[table]
                gone = {k for k in recent if not keep(k[len(table) + 1 :])}
                recent[:] = [k for k in recent if k not in gone]
                stale |= gone
            for table in [t for t, (snapshot, _) in self._hot.items() if t.startswith(prefix) and not keep(snapshot)]:
                del self._hot[table]
        if stale:
            self._items.discard(lambda k: k not in stale)

    def clear(self) -> None:
        """Drop every snapshot's state (whoever holds a value keeps a working one)."""
        self._items.discard(lambda _: False)
        with self._lock:  # after the discard: a load that may have found a dropped value sees a new count
            self._cleared += 1
            self._hot.clear()

    def get_or_load(self, table: str, snapshot: str, load: Callable[[], T]) -> T:
        hot = self._hot.get(table)
        if hot is not None and hot[0] == snapshot:  # the most recent already: nothing to reorder or drop
            held: T = hot[1]
            return held
        key = f"{table}#{snapshot}"
        with self._lock:
            cleared = self._cleared
            recent = self._recent.get(table) or []
            self._recent[table] = recent
            if key in recent:
                recent.remove(key)
            recent.append(key)
            stale = set(recent[: -self._keep])
            del recent[: -self._keep]
        if stale:
            self._items.discard(lambda k: k not in stale)
        value, _ = self._items.get_or_load(key, load)
        with self._lock:
            recent = self._recent.get(table) or []
            # not cleared (a merged segment's union is due), released, nor passed by a newer snapshot meanwhile
            if cleared == self._cleared and recent and recent[-1] == key:
                if len(self._hot) >= self._tables and table not in self._hot:
                    self._hot.clear()
                self._hot[table] = (snapshot, value)
        return value


_unions = _NewestSnapshots()  # -> (BM25 union, its superfiles in _id order, their _ids) or None
# -> (union of the superfiles without deletes, those superfiles) or None; a cache node keeps a few shares
_exact_unions = _NewestSnapshots(keep=4)
_padded_unions = _NewestSnapshots(keep=4)  # -> (a share's padded union, its superfiles in _id order) or None
_PAD_SEGMENTS = 10  # padding segments a padded union may add (fulltext_pads: up to 5 + 5)
# A filtered search alone splits its superfiles over two threads when they allow at least this many rows: under
# it the hand-off costs more than the second core saves (250K rows in 16 superfiles, p50 ms split / not:
# 0.1% allowed 1.46-1.61 / 1.18-1.21, 1% 1.95 / 1.82-1.93, 10% 3.56-3.85 / 4.63-4.66, 50% 4.82-4.97 / 6.72-7.42)
_SPLIT_ROWS = 8_192
# -> (union, its superfiles in part order, part by path, their _ids end to end, where each part's begin) or None
_vector_unions = _NewestSnapshots()
_vector_summaries = _NewestSnapshots()  # -> _Summaries


def _merged() -> None:
    """A merged segment is made (``fulltext_merge``): the next search of each snapshot (or a leaf's share) builds
    a union listing it."""
    _unions.clear()
    _padded_unions.clear()


on_merged(_merged)


def _release_snapshots(uri: str, keep: Callable[[str], bool]) -> None:
    """Drop the search state (unions, summaries) of table ``uri``'s snapshots whose key ``keep`` rejects: those
    that name superfiles no live snapshot does (``TableFiles.release``), whose indexes it holds open."""
    for cache in _NewestSnapshots.every:
        cache.release(uri, keep)


on_release(_release_snapshots)


def _is_ascending(ids: np.ndarray) -> bool:
    return bool(np.all(ids[1:] > ids[:-1]))


MAX_K = 10_000
_RESULT_FIELDS = (pa.field(ID, pa.uint64(), nullable=False), pa.field(SCORE, pa.float32()))  # then the projection
MAX_PREFIX_TERMS = 64
RRF_K = 60  # the reciprocal-rank-fusion constant: score = sum over retrievers of 1 / (RRF_K + rank)
HYBRID_DEPTH = 100  # candidates taken from each retriever before fusion
_RESULT_SCHEMAS = 256  # result schemas a snapshot keeps (by projection and counts)


@dataclass(frozen=True)
class _DeletedText:
    """What some deleted rows of one superfile contribute to its full-text statistics (subtracted for BM25)."""

    tokens: int  # analysed length summed over the rows
    doc_freq: dict[str, int]  # per term: rows containing it

    def __add__(self, other: _DeletedText) -> _DeletedText:
        df = dict(self.doc_freq)
        for term, n in other.doc_freq.items():
            df[term] = df.get(term, 0) + n
        return _DeletedText(self.tokens + other.tokens, df)


class _DeletedTextCache:
    """Per superfile and column, the statistics of its deleted rows and which rows they cover.

    Each delete commit writes a new, larger deletion vector for a superfile;
    when the cached rows are a subset of the new ones, only the newly deleted
    rows are read and analysed (a burst of small deletes costs what they
    delete, not what was deleted before).
    """

    def __init__(self, capacity: int) -> None:
        self._items: LRUCache[str, tuple[pyroaring.AbstractBitMap, _DeletedText]] = LRUCache(maxsize=capacity)
        self._lock = threading.Lock()

    def get(
        self,
        key: str,
        deleted: pyroaring.AbstractBitMap,
        analyse: Callable[[pyroaring.AbstractBitMap], _DeletedText],
    ) -> _DeletedText:
        with self._lock:
            cached = self._items.get(key)  # a hit makes the key the most recently used
        if cached is not None and cached[0] == deleted:
            return cached[1]
        if cached is not None and cached[0].issubset(deleted):
            found = cached[1] + analyse(pyroaring.BitMap(deleted) - cached[0])
        else:
            found = analyse(deleted)
        with self._lock:
            self._items[key] = (deleted, found)  # the least recently used key goes past the capacity
        return found


_deleted_text = _DeletedTextCache(1024)


# Filter bitsets per superfile, as Elasticsearch caches them per segment: superfiles are immutable, so
# (file, deletion vector, filter) -> matching rows never goes stale, and a repeated filter (a tenant, a
# tag, a date range) costs a lookup instead of a postings walk or a column scan per query. Roaring
# bitmaps of <= 100k-row files take <= 16 KB, so 512 entries stay under ~8 MB at the default file size.
_filter_cache = LRU(512)


@dataclass
class _Hits:
    """Hits of one superfile: row offsets and scores (None for unranked results)."""

    entry: SuperfileEntry
    offsets: np.ndarray
    scores: np.ndarray | None
    ids: np.ndarray | None = None  # their ``_id``, where the search has them at hand (else read at the merge)


@dataclass
class _PartHits:
    """Hits of a union's superfiles, as it gives them: hit i is row ``offsets[i]`` of ``members[part[i]]``. One
    set of arrays for them all: a :class:`_Hits` per superfile, made here and concatenated again at the merge,
    cost ~1 us of Python a superfile each way."""

    members: list[SuperfileEntry]
    part: np.ndarray
    offsets: np.ndarray
    scores: np.ndarray
    ids: np.ndarray


# a union with its parts' superfiles, their _ids end to end and where each part's begin
_UnionOf = tuple[UnionIndex, list[SuperfileEntry], np.ndarray, np.ndarray]
# a vector union with its parts' superfiles, each one's part number by path, their _ids end to end and where each
# part's begin
_VectorUnionOf = tuple[VectorUnion, list[SuperfileEntry], dict[str, int], np.ndarray, np.ndarray]


def _ranking(ids: np.ndarray, scores: np.ndarray | None, descending: bool, k: int | None) -> np.ndarray:
    """The first ``k`` hits by score (None: by ``_id``), ties by ``_id``, in one call that keeps the interpreter
    lock (``format/ranking.py``)."""
    from superfile.format.ranking import rank_order  # numba: ~0.2 s to import, paid by a first search

    return rank_order(ids, None if scores is None else -scores if descending else scores)[:k]


def _check_k(k: object) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= int(k) <= MAX_K:
        raise InvalidOptionError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
    return int(k)


def _mode(mode: str, allowed: Sequence[str]) -> str:
    if mode not in allowed:
        raise InvalidOptionError(f"mode must be one of {tuple(allowed)}, got {mode!r}")
    return mode


class Searcher:
    """All searches of one call, against one snapshot."""

    def __init__(self, snapshot: Snapshot, corpus: CorpusStats | None = None) -> None:
        """``corpus``: the table-wide BM25 statistics, when a query root gathered them for this leaf's share."""
        self.snap = snapshot
        self.options = snapshot.manifest.options
        self.corpus = corpus
        self.total = 0
        self.searched = 0
        self.spread = True  # whether this search may spread its kernels over threads (``pools.searching``)
        self._memos: dict[Any, dict[Any, Any]] = {}  # the snapshot's memos this search used (``Snapshot.memo``)

    @staticmethod
    def of(snapshot: Snapshot) -> Searcher:
        """The searcher for ``snapshot``: in this process, or a query root fanning out to cache nodes."""
        fanout = snapshot.fanout
        return Searcher(snapshot) if fanout is None else fanout.searcher(snapshot)

    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search request (the one entry point of the handle, SQL, the gateway and the SDK)."""
        with searching() as self.spread:
            return self._search(request)

    def warm(self) -> None:
        """Do now the slow part of what the first search of this snapshot would wait for: open each superfile
        (its download into the disk cache and its checks) and its full-text and vector indexes (a full-text
        index is extracted to local disk). A serving process calls it when a new version appears (the
        gateway's warm on commit, docs/gateway.md). The unions over the indexes are left to the first search
        of the version: building them is quick once the parts are open, and a version no one searches needs
        none. A snapshot whose superfiles do not all stay open together (``TableFiles.batches``) is left
        alone: warming it would evict what it opened."""
        entries = self.snap.entries()
        if len(self.snap.files.batches(entries)) > 1:
            return

        def prepare(entry: SuperfileEntry) -> None:
            file = self.snap.open(entry)
            for column in self.options.fts_columns:
                if file.has_text_index(column):
                    file.fulltext(column)
            for column in self.options.vector_columns:
                if file.has_vector_index(column):
                    file.vector_index(column)

        self.snap.each(prepare, entries)

    def _search(self, request: SearchRequest) -> pa.Table:
        match request:
            case Bm25Search():
                return self.bm25_search(request.column, request.query, request.k, request.mode, request.projection)
            case PrefixSearch():
                return self.bm25_search_prefix(request.column, request.prefix, request.k, request.projection)
            case TokenMatch():
                return self.token_match(
                    request.column, request.tokens, request.mode, request.projection, request.max_rows
                )
            case ExactMatch():
                return self.exact_match(request.column, request.value, request.projection, request.max_rows)
            case VectorSearch():
                return self.vector_search(
                    request.column,
                    request.vector,
                    request.k,
                    nprobe=request.nprobe,
                    rerank=request.rerank,
                    text_filter=request.filter,
                    where=request.where,
                    projection=request.projection,
                )
            case HybridSearch():
                return self.hybrid_search(
                    request.text_column,
                    request.query,
                    request.vector_column,
                    request.vector,
                    request.k,
                    request.projection,
                )
        raise InvalidInputError(f"not a search request: {request!r}")

    # -- validation ------------------------------------------------------------------
    def _fts_column(self, column: str) -> str:
        if column not in self.options.fts_columns:
            raise UnknownColumnError(
                f"{column!r} is not a full-text column; full-text columns: {sorted(self.options.fts_columns)}"
            )
        return column

    def _vector_column(self, column: str) -> str:
        if column not in self.options.vector_columns:
            raise UnknownColumnError(
                f"{column!r} is not a vector column; vector columns: {sorted(self.options.vector_columns)}"
            )
        return column

    def _projection(self, projection: Sequence[str] | None) -> list[str]:
        names = self.snap.schema.names
        if projection is None:
            return [n for n in names if n != ID]
        if isinstance(projection, str):
            raise InvalidInputError("projection must be a list of column names")
        unknown = [c for c in projection if c not in names and c != SCORE]
        if unknown:
            raise UnknownColumnError(f"unknown columns in projection: {unknown}; the table has {names}")
        return [c for c in projection if c not in (ID, SCORE)]

    def _query_vector(self, column: str, vector: Any) -> np.ndarray:
        dim = self.options.vector_columns[column].dim
        try:
            q = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidVectorError(f"query vector for {column!r} must be a list of numbers") from None
        if q.ndim != 1 or q.shape[0] != dim:
            raise VectorDimensionError(f"query vector for {column!r} must have {dim} values, got shape {q.shape}")
        if not np.isfinite(q).all():
            raise InvalidVectorError(f"query vector for {column!r} has NaN or infinite values")
        if self.options.vector_columns[column].metric == "cosine" and not np.any(q):
            raise InvalidVectorError(f"a zero query vector has no direction under {column!r}'s cosine metric")
        return q

    # -- helpers ---------------------------------------------------------------------
    def _live(self, entry: SuperfileEntry) -> pyroaring.AbstractBitMap | None:
        """Rows not deleted, or None when none are (so kernels can skip filtering)."""
        deleted = self.snap.deleted(entry)
        if not len(deleted):
            return None
        return pyroaring.BitMap(deleted).flip(0, entry.rows)

    def _fulltext(self, entry: SuperfileEntry, column: str) -> FullTextIndex | ExactText:
        """The column's full-text index in this superfile, or, where the superfile lacks it (the index was
        created after it was written), the same answers computed from its values (``table/exact.py``)."""
        reader = self.snap.open(entry)
        if reader.has_text_index(column):
            return reader.fulltext(column)
        key = f"{self.snap.files.storage.uri}#{entry.path}#{reader.physical(column)}"
        return analysed(key, lambda: reader.read([column]).column(column), self.options.fts_columns[column])

    def _indexed(self, entries: Sequence[SuperfileEntry], column: str) -> bool:
        """Whether every one of these superfiles holds the column's full-text index (from the manifest: an
        entry has the column's term summary exactly when its file has the current index)."""
        return all(column in e.text for e in entries)

    def _tokens(self, entry: SuperfileEntry, column: str) -> int:
        """The analysed length of every row of the superfile's column (the manifest's, or counted)."""
        known = entry.fts_tokens.get(column)
        if known is not None and column in entry.text:
            return known
        found = self._fulltext(entry, column)
        assert isinstance(found, ExactText)
        return found.total_tokens

    def _analyze(self, column: str, text: str) -> list[str]:
        """Analyse with the column's tokenizer (any superfile's analyzer is the same one)."""
        return list(thread_analyzer(self.options.fts_columns[column]).analyze(text))

    def _entries(self, where: Predicate | None = None) -> list[SuperfileEntry]:
        entries = self.snap.entries(where)
        self.total = self.snap.manifest.superfile_count
        return entries

    def _run(self, fn: Any, entries: Sequence[SuperfileEntry]) -> list[Any]:
        self.searched = len(entries)
        return self.snap.each(fn, entries)

    def _result(
        self, hits: Sequence[_Hits | _PartHits], k: int | None, descending: bool, projection: Sequence[str] | None
    ) -> pa.Table:
        """Merge per-superfile hits into one ranking (ties: ``_id``), resolve ids and projected columns."""
        ranked = [h for h in hits if len(h.offsets)]
        if not ranked:
            empty = np.zeros(0, np.int64)
            return self._ranked([], empty, empty, np.zeros(0, np.uint64), None, k, descending, projection)
        entries: list[SuperfileEntry] = []
        which: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        for h in ranked:
            if isinstance(h, _PartHits):
                which.append(h.part + len(entries) if entries else h.part)
                entries += h.members
                ids.append(h.ids)
            else:
                which.append(np.full(len(h.offsets), len(entries)))
                entries.append(h.entry)
                ids.append(self.snap.files.open(h.entry).ids(h.offsets) if h.ids is None else h.ids)
        scores = None
        if ranked[0].scores is not None:
            scores = _joined([h.scores for h in ranked if h.scores is not None])
        offsets = _joined([h.offsets for h in ranked])
        return self._ranked(entries, _joined(which), offsets, _joined(ids), scores, k, descending, projection)

    def _ranked(
        self,
        entries: list[SuperfileEntry],
        which: np.ndarray,
        offsets: np.ndarray,
        ids: np.ndarray,
        scores: np.ndarray | None,
        k: int | None,
        descending: bool,
        projection: Sequence[str] | None,
        order: slice | None = None,
    ) -> pa.Table:
        """The result of hits given flat: each one's superfile (an index into ``entries``), row offset, ``_id``
        and score (None: unranked, in ``_id`` order). ``order``: the hits' answer, where they come ranked."""
        cols = self._projection(projection)
        if scores is not None:
            scores = scores.astype(np.float32, copy=False)
        at = _ranking(ids, scores, descending, k) if order is None else order
        if scores is not None and not cols:
            return ranked_table(self._result_schema(cols), ids[at], scores[at])
        hit_ids = ids[at]
        arrays: list[pa.Array | pa.ChunkedArray] = [
            result_column(hit_ids, pa.uint64()),
            result_column(scores[at], pa.float32()) if scores is not None else pa.nulls(len(hit_ids), pa.float32()),
        ]
        if cols:
            table = self._rows(entries, which[at], offsets[at], cols)
            arrays += [table.column(c) for c in cols]
        return pa.Table.from_arrays(arrays, schema=self._result_schema(cols))

    def _result_schema(self, cols: list[str], hybrid: bool = False) -> pa.Schema:
        """The result's schema with the search's counts as metadata (a hybrid result: its float64 score and the
        version alone), made once per snapshot, projection and counts."""
        key = (tuple(cols), hybrid, self.total, self.searched)
        schemas = self.snap.memo("result schemas")
        schema = schemas.get(key)
        if schema is None:
            if len(schemas) >= _RESULT_SCHEMAS:  # many projections asked of one snapshot: start over
                schemas.clear()
            score = pa.field(SCORE, pa.float64()) if hybrid else _RESULT_FIELDS[1]
            fields = [_RESULT_FIELDS[0], score, *(self.snap.plain_schema.field(c) for c in cols)]
            meta: dict[bytes | str, bytes | str] = {"superfile.version": str(self.snap.version)}
            if not hybrid:
                meta["superfile.superfiles"] = str(self.total)
                meta["superfile.pruned"] = str(self.total - self.searched)
                meta["superfile.searched"] = str(self.searched)
            schema = schemas[key] = pa.schema(fields, metadata=meta)
        return schema

    def _rows(self, entries: list[SuperfileEntry], which: np.ndarray, offsets: np.ndarray, cols: list[str]) -> pa.Table:
        """Projected columns of the chosen hits in rank order: read superfile by superfile, then put back."""
        pieces: list[pa.Table] = []
        positions: list[np.ndarray] = []
        for i in np.unique(which).tolist():  # the superfiles with hits, each read once
            pos = np.flatnonzero(which == i)
            pieces.append(self.snap.read_rows(entries[i], offsets[pos], cols))
            positions.append(pos)
        if not pieces:
            return pa.schema([self.snap.plain_schema.field(c) for c in cols]).empty_table()
        back = np.argsort(np.concatenate(positions), kind="stable")
        return pa.concat_tables(pieces).take(back)

    # -- full-text -----------------------------------------------------------------
    def _term_candidates(self, column: str, terms: list[str], mode: str) -> list[SuperfileEntry]:
        """Superfiles whose bloom filters say they may hold the terms (all of them for mode "all")."""
        every = mode == "all"
        return [e for e in self._entries() if column not in e.text or e.text[column].may_hold(terms, every=every)]

    def _deleted(self, entry: SuperfileEntry, column: str) -> _DeletedText:
        """The deleted rows' analysed lengths and terms (cached per superfile; see _DeletedTextCache)."""

        def analyse(rows: pyroaring.AbstractBitMap) -> _DeletedText:
            offsets = np.fromiter(rows, np.int64, len(rows))
            values = self.snap.open(entry).read([column], rows=offsets).column(column).to_pylist()
            analyzer = make_analyzer(self.options.fts_columns[column])
            tokens = 0
            df: dict[str, int] = {}
            for value in values:
                if value is not None:
                    analysed = analyzer.analyze(value)
                    tokens += len(analysed)
                    for term in set(analysed):
                        df[term] = df.get(term, 0) + 1
            return _DeletedText(tokens, df)

        # the column's analysis: its tokenizer names it (an index created again may analyse otherwise)
        key = f"{self.snap.files.storage.uri}#{entry.path}#{column}#{self.options.fts_columns[column]}"
        return _deleted_text.get(key, self.snap.deleted(entry), analyse)

    def _corpus_stats(self, column: str, terms: list[str], holders: list[SuperfileEntry]) -> CorpusStats:
        """Table-wide BM25 statistics over the live rows: N and total length from the manifest, df from the
        files that may hold a term (a pruned file's bloom filter proved df = 0 there), minus what deleted rows
        add to them. Deleted rows thus never change a score: a search ranks the same before and after the
        deletion vectors are compacted away."""
        df, deleted_tokens = self.term_stats(column, terms, holders)
        return self.corpus_of(column, terms, df, deleted_tokens)

    def corpus_of(self, column: str, terms: list[str], df: Sequence[int], deleted_tokens: int) -> CorpusStats:
        """The statistics from the manifest's totals and the (summed) :meth:`term_stats` of the superfiles
        (``deleted_tokens``: what their deleted rows add, less what unindexed superfiles hold)."""
        entries = self.snap.entries()
        num_docs = sum(e.live_rows for e in entries)
        total_tokens = sum(e.fts_tokens.get(column, 0) for e in entries if column in e.text) - deleted_tokens
        return CorpusStats(num_docs, total_tokens, dict(zip(terms, [int(n) for n in df], strict=True)))

    def term_stats(
        self, column: str, terms: list[str], holders: list[SuperfileEntry] | None = None
    ) -> tuple[list[int], int]:
        """This snapshot's share of the BM25 statistics: per term, the live rows holding it (over ``holders``,
        the superfiles that may hold any term, found here if not given), and the analysed length of its
        deleted rows less that of the superfiles without the column's index (which the manifest cannot
        count; ``corpus_of`` adds the rest). A query root sums the shares its leaves report."""
        return self.summed(self.term_stats_each(column, terms, holders), len(terms))

    @staticmethod
    def summed(each: list[tuple[str, list[int], int]], terms: int) -> tuple[list[int], int]:
        """:meth:`term_stats_each`'s shares added up: df per term (``terms`` of them) and length."""
        df = np.zeros(terms, np.int64)
        for _, counts, _ in each:
            df += np.asarray(counts, np.int64)
        return df.tolist(), sum(length for _, _, length in each)

    def term_stats_each(
        self, column: str, terms: list[str], holders: list[SuperfileEntry] | None = None
    ) -> list[tuple[str, list[int], int]]:
        """:meth:`term_stats` superfile by superfile: (path, df per term, length) for each holder and each
        superfile with deletes or without the column's index. A superfile's share depends only on it and its
        deletion vector, so a query root keeps it across versions (``search/root.py``)."""
        entries = self.snap.entries()
        unindexed = [e for e in entries if column not in e.text]
        with_deletes = [e for e in entries if e.deletes is not None]
        deleted = dict(
            zip(
                [e.path for e in with_deletes],
                self.snap.each(lambda e: self._deleted(e, column), with_deletes),
                strict=True,
            )
        )

        def freqs(e: SuperfileEntry) -> list[int]:
            fts = self._fulltext(e, column)
            gone = deleted[e.path].doc_freq if e.path in deleted else {}
            return [fts.doc_freq(t) - gone.get(t, 0) for t in terms]

        if holders is None:
            holders = self._term_candidates(column, terms, "any")
        length = {e.path: d.tokens for e, d in zip(with_deletes, deleted.values(), strict=True)}
        for e, n in zip(unindexed, self.snap.each(lambda e: self._tokens(e, column), unindexed), strict=True):
            length[e.path] = length.get(e.path, 0) - n
        counts = dict(zip([e.path for e in holders], self.snap.each(freqs, holders), strict=True))
        zero = [0] * len(terms)
        return [(path, counts.get(path, zero), length.get(path, 0)) for path in dict.fromkeys([*counts, *length])]

    def _union(self, column: str) -> _UnionOf | None:
        """One searcher over every superfile's index of ``column`` (``format/fulltext_union.py``) for a
        snapshot without deletion vectors: it ranks like the per-superfile path, and every query of that
        snapshot takes it, warm or cold, so a query always gets the same float32 scores (the two paths
        round differently). Returns it with its parts' superfiles (in ``_id`` order), built once per
        snapshot, with each one's ``_id`` section; None otherwise, or if the union cannot be built."""
        try:  # None is kept too
            united = _unions.get_or_load(self._table_key(column), self.snap.key, lambda: self._build_union(column))
        except (OSError, ValueError) as exc:
            log.warning("full-text union not built, searching the superfiles one by one: %s", exc)
            return None
        return united

    def _build_union(self, column: str) -> _UnionOf | None:
        entries = self.snap.entries()
        if not entries or any(e.deletes is not None for e in entries) or not self._indexed(entries, column):
            return None
        if not _fits_open_files(len(entries) * _SEGMENT_FILES):
            return None
        entries, parts = self._sorted_parts(entries, column)
        union = union_of(parts, self.snap.files.cache_dir, ordered=self._ordered(entries), merge=True)
        ids = [self.snap.files.open(e).ids() for e in entries]
        return union, entries, *_end_to_end(ids)

    def _sorted_parts(
        self, entries: Sequence[SuperfileEntry], column: str
    ) -> tuple[list[SuperfileEntry], list[FullTextIndex]]:
        """``entries`` in a union's segment order (``_id`` order where it can be) and their indexes of ``column``,
        the cold ones opened in parallel."""
        ordered = sorted(entries, key=lambda e: (e.id_min, e.path))
        return ordered, self.snap.each(lambda e: self.snap.open(e).fulltext(column), ordered)

    def _ordered(self, entries: Sequence[SuperfileEntry]) -> bool:
        """Whether the rows of ``entries`` (sorted by ``id_min``), in that order, are in ascending ``_id`` order."""
        return all(a.id_max < b.id_min for a, b in itertools.pairwise(entries)) and all(
            self._ascending(e) for e in entries
        )

    def _ascending(self, entry: SuperfileEntry) -> bool:
        """Whether the superfile's rows are in ascending ``_id`` order (appends are; a superfile holding
        updated rows may not be). Superfiles are immutable: computed once per superfile."""
        key = f"{self.snap.files.storage.uri}#{entry.path}"
        ascending, _ = _ascending.get_or_load(key, lambda: _is_ascending(self.snap.files.open(entry).ids()))
        return ascending

    def bm25(self, column: str, terms: list[str], k: int, mode: str, projection: Sequence[str] | None) -> pa.Table:
        terms = list(dict.fromkeys(terms))
        if not terms:
            return self._result([], k, True, projection)
        united = self._union(column) if self.corpus is None else None
        if united is not None:
            union, entries, ids, starts = united
            # one native search over every superfile, whose term dictionaries skip those without the terms:
            # checking the manifest's bloom filters first cost ~8% of the query and saved tantivy nothing
            self.total = self.snap.manifest.superfile_count
            self.searched = len(entries)
            parts, rows, scores = union.top(terms, k, mode)
            hit_ids = ids[starts[parts] + rows]
            # an ordered union's hits come ranked: by score, ties by (segment, doc), which is _id order
            order = slice(k) if union.ordered else None
            return self._ranked(entries, parts, rows, hit_ids, scores, k, True, projection, order)
        if self.corpus is not None:  # a leaf: the root sent only superfiles whose bloom filters may hold the terms
            candidates = self._entries()
            stats = self.corpus
        else:
            candidates = self._term_candidates(column, terms, mode)
            # df counts every superfile holding the term: in mode "all" that is more than those holding them all
            holders = candidates if mode == "any" else self._term_candidates(column, terms, "any")
            stats = self._corpus_stats(column, terms, holders)
        if mode == "all" and min(stats.doc_freq.values(), default=0) == 0:
            candidates = []

        def one(e: SuperfileEntry) -> Candidates | None:
            return self._fulltext(e, column).candidates(terms, k, stats, mode=mode, allow=self._live(e))

        # a leaf: its share's superfiles without deletes in one tantivy search, padded to score with the root's
        # statistics (else ranked with them and rescored), the rest one by one
        padded = self._padded_top(column, terms, k, mode) if self.corpus is not None and candidates else None
        exact = None
        if padded is None and self.corpus is not None and len(candidates) > 1:
            exact = self._exact_union(column)
        joint_index = exact[0] if exact is not None else None
        members = exact[1] if exact is not None else padded[1] if padded is not None else []
        inside = {e.path for e in members}
        rest = [e for e in candidates if e.path not in inside]
        found = [(e, c) for e, c in zip(rest, self._run(one, rest), strict=True) if c is not None]
        self.searched = len(candidates)
        if padded is not None:  # exact already: merged with the rest's candidates as such
            if not found:
                return self._result(padded[0], k, True, projection)
            found += [(h.entry, ExactCandidates(h.offsets, np.asarray(h.scores, np.float64))) for h in padded[0]]
        joint = None
        if joint_index is not None and len(rest) < len(candidates):
            joint = joint_index.candidates(terms, k, stats, mode=mode)
        top = global_top_k([c for _, c in found] + ([joint] if joint is not None else []), k)
        hits = [_Hits(e, rows, scores) for (e, _), (rows, scores) in zip(found, top[: len(found)], strict=True)]
        if joint_index is not None and joint is not None:  # the union's rows back to their superfiles
            rows, scores = top[-1]
            part, offsets = joint_index.split(rows)
            for p in np.unique(part).tolist():
                at = part == p
                hits.append(_Hits(members[p], offsets[at], scores[at]))
        return self._result(hits, k, True, projection)

    def _padded_top(
        self, column: str, terms: list[str], k: int, mode: str
    ) -> tuple[list[_Hits], list[SuperfileEntry]] | None:
        """A leaf's top-``k`` of its share's superfiles without deletes, scored by tantivy as the table's union
        scores them, bit for bit: one search of a padded union (``format/fulltext_pads.py``). Returns the hits
        and those superfiles, or None where that cannot be done exactly (the caller rescores them then)."""
        corpus = self.corpus
        assert corpus is not None
        united = self._padded_union(column)
        if united is None:
            return None
        padded, entries = united
        df = [corpus_df(corpus, t, corpus.num_docs) for t in terms]
        try:
            found = padded.top(terms, k, mode, df)
        except (OSError, ValueError, RuntimeError) as exc:  # a padding's files removed under it, say
            log.warning("padded full-text union not searched, rescoring candidates: %s", exc)
            return None
        if found is None:
            return None
        parts, rows, scores = found
        return [_Hits(entries[p], rows[parts == p], scores[parts == p]) for p in sorted(set(parts.tolist()))], entries

    def _padded_union(self, column: str) -> tuple[PaddedUnion, list[SuperfileEntry]] | None:
        """This share's superfiles that hold the column's index and no deletes as a :class:`PaddedUnion` with the
        root's statistics, made once per share and statistics; None without such superfiles, or past the
        open-file budget."""
        corpus = self.corpus
        assert corpus is not None

        def build() -> tuple[PaddedUnion, list[SuperfileEntry]] | None:
            entries = [e for e in self.snap.entries() if e.deletes is None and column in e.text]
            if not entries:
                return None
            if not _fits_open_files((len(entries) + _PAD_SEGMENTS) * _SEGMENT_FILES):
                return None
            entries, parts = self._sorted_parts(entries, column)
            padded = PaddedUnion.make(
                parts,
                self.snap.files.cache_dir,
                ordered=self._ordered(entries),
                num_docs=corpus.num_docs,
                total_tokens=corpus.total_tokens,
            )
            return None if padded is None else (padded, entries)

        key = f"{self.snap.key}#{corpus.num_docs}#{corpus.total_tokens}"
        try:  # None is kept too
            return _padded_unions.get_or_load(self._table_key(column), key, build)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("padded full-text union not built, rescoring candidates: %s", exc)
            return None

    def _exact_union(self, column: str) -> tuple[UnionText, list[SuperfileEntry]] | None:
        """One searcher over this share's superfiles that hold the column's index and no deletes, for a leaf's
        table-wide BM25 with the root's statistics (``UnionText``). Built once per share (a restricted snapshot);
        None for fewer than two such superfiles, past the open-file budget, or if it cannot be built."""

        def build() -> tuple[UnionText, list[SuperfileEntry]] | None:
            entries = [e for e in self.snap.entries() if e.deletes is None and column in e.text]
            # it maps its parts' files twice: through the union, and through each part's own index (term scores)
            if len(entries) < 2 or not _fits_open_files(2 * len(entries) * _SEGMENT_FILES):
                return None
            entries, opened = self._sorted_parts(entries, column)
            single = [(e, p) for e, p in zip(entries, opened, strict=True) if p.searcher.num_segments == 1]
            if len(single) < 2:  # a superfile's index is one segment unless its build outgrew the writer's heap
                return None
            return union_text([p for _, p in single], self.snap.files.cache_dir), [e for e, _ in single]

        try:  # None is kept too
            return _exact_unions.get_or_load(self._table_key(column), self.snap.key, build)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("full-text union not built, searching the superfiles one by one: %s", exc)
            return None

    def bm25_search(self, column: str, query: str, k: int, mode: str, projection: Sequence[str] | None) -> pa.Table:
        self._fts_column(column)
        k = _check_k(k)
        mode = _mode(mode, ("any", "all"))
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty string")
        return self.bm25(column, self._analyze(column, query), k, mode, projection)

    def bm25_search_prefix(self, column: str, prefix: str, k: int, projection: Sequence[str] | None) -> pa.Table:
        """BM25 over the terms the prefix expands to (at most MAX_PREFIX_TERMS, most frequent table-wide)."""
        self._fts_column(column)
        k = _check_k(k)
        if not isinstance(prefix, str) or not prefix.strip():
            raise InvalidInputError("prefix must be a non-empty string")
        return self.bm25(
            column, top_terms(self.prefix_terms(column, self.prefix_term(column, prefix))), k, "any", projection
        )

    def prefix_term(self, column: str, prefix: str) -> str:
        """The term a prefix query expands: its last word, analysed unless the analyzer stems."""
        tokens = self._analyze(column, prefix) if self.options.fts_columns[column] != "english" else None
        # stemming would cut the prefix ("aerodyn" -> "aerodyn" but "flutter" -> "flutter"): lowercase instead
        return tokens[-1] if tokens else prefix.strip().split()[-1].lower()

    def prefix_terms(self, column: str, p: str) -> dict[str, int]:
        """Every term of this snapshot starting with ``p``, with the rows holding it (before deletes)."""
        entries = self._prefix_entries(column, p)
        counts: dict[str, int] = {}
        for found in self.snap.each(lambda e: self._terms_with_prefix(e, column, p), entries):
            for term, n in found:
                counts[term] = counts.get(term, 0) + n
        return counts

    def _terms_with_prefix(self, entry: SuperfileEntry, column: str, p: str) -> list[tuple[str, int]]:
        found = self._fulltext(entry, column)
        if isinstance(found, ExactText):
            return found.terms_with_prefix(p)
        return found.searcher.terms_with_prefix("text", p)

    def _prefix_entries(self, column: str, p: str) -> list[SuperfileEntry]:
        """The superfiles whose term range can hold a term starting with ``p`` (and those without the
        column's index, which have no term range)."""
        entries = []
        for e in self._entries():
            s = e.text.get(column)
            if s is None:
                entries.append(e)
                continue
            if s.min_term is None or s.max_term is None:
                continue
            if s.max_term >= p and (s.min_term < p or s.min_term.startswith(p)):
                entries.append(e)
        return entries

    def token_match(
        self,
        column: str,
        tokens: str | Sequence[str],
        mode: str,
        projection: Sequence[str] | None,
        max_rows: int | None = None,
    ) -> pa.Table:
        terms, mode, candidates = self._token_plan(column, tokens, mode)

        def one(e: SuperfileEntry) -> _Hits:
            rows = self._fulltext(e, column).match(terms, "and" if mode == "all" else "or")
            live = self._live(e)
            if live is not None:
                rows &= live
            return _Hits(e, np.fromiter(rows, np.int64, len(rows)), None)

        return self._unranked(self._run(one, candidates), projection, max_rows)

    def _token_plan(
        self, column: str, tokens: str | Sequence[str], mode: str
    ) -> tuple[list[str], str, list[SuperfileEntry]]:
        """A token match's analysed terms, its mode (``all``/``any``) and the superfiles that may hold them."""
        self._fts_column(column)
        mode = {"and": "all", "or": "any", "all": "all", "any": "any"}.get(
            _mode(mode, ("and", "or", "all", "any")), mode
        )
        words = [tokens] if isinstance(tokens, str) else list(tokens)
        terms = list(dict.fromkeys(t for w in words for t in self._analyze(column, w)))
        if not terms:
            raise InvalidInputError("token_match needs at least one token that the column's tokenizer keeps")
        return terms, mode, self._term_candidates(column, terms, mode)

    def _exact_plan(self, column: str, value: str) -> list[SuperfileEntry]:
        """The superfiles an exact match must look in: min/max and term blooms can hold the value."""
        self._fts_column(column)
        if not isinstance(value, str):
            raise InvalidInputError("exact_match value must be a string")
        where = parse_predicate(f"{_quote_ident(column)} = {_quote_literal(value)}", self.snap.schema)
        terms = self._analyze(column, value)
        candidates = [e for e in self._entries(where)]
        if terms:
            bloom_ok = set(id(e) for e in self._term_candidates(column, terms, "all"))
            candidates = [e for e in candidates if id(e) in bloom_ok]
        return candidates

    def exact_match(
        self, column: str, value: str, projection: Sequence[str] | None, max_rows: int | None = None
    ) -> pa.Table:
        """Two passes: the index prunes to candidate rows, a raw string comparison decides."""
        candidates = self._exact_plan(column, value)

        def one(e: SuperfileEntry) -> _Hits:
            rows = self._fulltext(e, column).match_exact(value)
            live = self._live(e)
            if live is not None:
                rows &= live
            offsets = np.fromiter(rows, np.int64, len(rows))
            if len(offsets):
                text = self.snap.open(e).read([column], rows=offsets).column(column).to_pylist()
                offsets = offsets[np.asarray([t == value for t in text], bool)]
            return _Hits(e, offsets, None)

        return self._unranked(self._run(one, candidates), projection, max_rows)

    def _unranked(self, hits: list[_Hits], projection: Sequence[str] | None, max_rows: int | None) -> pa.Table:
        """Every hit as a row, unless there are more than ``max_rows`` (counted before any row is read)."""
        check_row_limit(sum(len(h.offsets) for h in hits), max_rows)
        return self._result(hits, None, True, projection)

    # -- vectors -----------------------------------------------------------------------
    def _allowed(
        self,
        e: SuperfileEntry,
        text_filter: Mapping[str, Any] | None,
        where: Predicate | None,
        where_text: str | None,
    ) -> pyroaring.AbstractBitMap | None:
        """Live rows of ``e`` that pass both filters, kept with the snapshot (a filtered search over 16 superfiles
        looked each up in ``_filter_cache``, ~3 us apiece, and recomputed its live rows); each filter's rows
        come from ``_filter_cache``, which later snapshots share."""
        memo = self._allowed_memo(text_filter, where_text)
        if e.path in memo:
            kept: pyroaring.AbstractBitMap | None = memo[e.path]
            return kept
        allow = self._live(e)
        file_key = f"{self.snap.files.storage.uri}#{e.path}"
        if text_filter is not None:
            column, terms, mode = text_filter["column"], text_filter["terms"], text_filter["mode"]
            key = "\x1f".join([file_key, "text", column, self.options.fts_columns[column], mode, *terms])
            fts = self._fulltext(e, column)
            matched, _ = _filter_cache.get_or_load(
                key, lambda: pyroaring.FrozenBitMap(fts.match(terms, "and" if mode == "all" else "or"))
            )
            allow = matched if allow is None else (matched & allow)
        if where is not None:
            # matching_offsets leaves out this snapshot's deleted rows, so the deletion vector is part of
            # the key: an older version (as_of, restore) has fewer deletes and must not reuse the entry
            dv = e.deletes.path if e.deletes is not None else ""
            key = "\x1f".join([file_key, dv, "where", self.snap.schema_key, str(where_text)])
            matched, _ = _filter_cache.get_or_load(
                key, lambda: pyroaring.FrozenBitMap(_bitmap(self.snap.matching_offsets(e, where)))
            )
            allow = matched if allow is None else (matched & allow)
        memo[e.path] = allow
        return allow

    def _allowed_each(
        self,
        entries: Sequence[SuperfileEntry],
        text_filter: Mapping[str, Any] | None,
        where: Predicate | None,
        where_text: str | None,
    ) -> list[pyroaring.AbstractBitMap | None]:
        """:meth:`_allowed` of each of ``entries``, from the snapshot's memo where every one is there (a repeated
        filter's steady state; :meth:`Snapshot.each` weighs each superfile's budget, ~2 us apiece), else
        through it: on this thread, since a cold filter's Arrow kernels use Arrow's own threads."""
        memo = self._allowed_memo(text_filter, where_text)
        known = [memo.get(e.path, memo) for e in entries]  # the memo itself: not there
        if all(a is not memo for a in known):
            return known
        return self.snap.each(lambda e: self._allowed(e, text_filter, where, where_text), entries)

    def _allowed_memo(self, text_filter: Mapping[str, Any] | None, where_text: str | None) -> dict[str, Any]:
        """The snapshot's memo of each superfile's allowed rows under these filters, by superfile path."""
        filters = None if text_filter is None else (text_filter["column"], text_filter["mode"], *text_filter["terms"])
        key = ("allowed", filters, where_text)
        memo = self._memos.get(key)
        if memo is None:  # once a search: the snapshot's memo is an LRU lookup under a lock
            memo = self._memos[key] = self.snap.memo(key)
        return memo

    def _vector_plan(
        self, column: str, vector: Any, k: int, text_filter: Mapping[str, Any] | None, where: str | None
    ) -> tuple[int, np.ndarray, Predicate | None, dict[str, Any] | None, list[SuperfileEntry]]:
        """A vector search checked (k, the query vector, both filters) and the superfiles the filters' summaries
        keep (min/max for ``where``, term blooms for the text filter)."""
        self._vector_column(column)
        k = _check_k(k)
        q = self._query_vector(column, vector)
        predicate = self.snap.predicate(where)
        tf: dict[str, Any] | None = None
        if text_filter is not None:
            if not isinstance(text_filter, Mapping) or not {"column", "query"} <= set(text_filter):
                raise InvalidInputError('filter must be {"column": ..., "query": ..., "mode": "any"|"all"}')
            fcol = self._fts_column(text_filter["column"])
            fmode = _mode(text_filter.get("mode", "any"), ("any", "all"))
            fterms = list(dict.fromkeys(self._analyze(fcol, str(text_filter["query"]))))
            if not fterms:
                raise InvalidInputError("the text filter's query has no indexable terms")
            tf = {"column": fcol, "terms": fterms, "mode": fmode}
        entries = self._entries(predicate)
        if tf is not None:
            allowed_ids = {id(e) for e in self._term_candidates(tf["column"], tf["terms"], tf["mode"])}
            entries = [e for e in entries if id(e) in allowed_ids]
        return k, q, predicate, tf, entries

    def vector_search(
        self,
        column: str,
        vector: Any,
        k: int,
        *,
        nprobe: int | None,
        rerank: int | None,
        text_filter: Mapping[str, Any] | None,
        where: str | None,
        projection: Sequence[str] | None,
    ) -> pa.Table:
        k, q, predicate, tf, entries = self._vector_plan(column, vector, k, text_filter, where)
        metric = self.options.vector_columns[column].metric
        entries, bound = _route(entries, self._summaries(column), q, metric)

        def one(e: SuperfileEntry) -> _Hits:
            allow = self._allowed(e, tf, predicate, where)
            if allow is not None and not len(allow):
                return _Hits(e, np.zeros(0, np.int64), np.zeros(0, np.float32))
            reader = self.snap.open(e)
            if not reader.has_vector_index(column):  # created after this superfile was written: scan it
                found, vectors = reader.vector_rows(column, allow)
                rows, dist = nearest(found, vectors, _unit(q, metric), metric, k)
                return _Hits(e, rows, dist)
            rows, dist = reader.vector_index(column).search(q, k, nprobe=nprobe, rerank=rerank, allow=allow)
            return _Hits(e, np.asarray(rows, np.int64), np.asarray(dist, np.float32))

        # Filtered, each superfile's allowed rows come from its filters' bitmaps (cached). The union searches every
        # superfile it holds in one pass: one rerank pool over all where nothing is filtered or deleted, else a
        # pool per superfile, whose answer does not depend on the others (a fleet's shares, and the two halves a
        # search alone splits over the query pool while the cores are idle).
        filtered = tf is not None or predicate is not None
        run = self.snap.map if filtered and self.spread else self.snap.each
        united = self._vector_union(column)

        def search(batch: list[SuperfileEntry]) -> list[_Hits | _PartHits]:
            if united is None:
                return list(run(one, batch))
            union, members, part_of, ids, starts = united

            def own_pools(each: list[tuple[int, pyroaring.AbstractBitMap | None]]) -> VectorHits:
                return union.top_each(q, k, each, nprobe=nprobe, rerank=rerank)

            inside = [e for e in batch if e.path in part_of]
            alone = [part_of[e.path] for e in inside if not filtered and e.deletes is None]
            own = [e for e in inside if filtered or e.deletes is not None]
            each = list(zip([part_of[e.path] for e in own], self._allowed_each(own, tf, predicate, where), strict=True))
            found = [union.top(q, k, alone, nprobe=nprobe, rerank=rerank)] if alone else []
            if filtered and self.spread and len(each) > 1 and _allowed_rows(each, members) >= _SPLIT_ROWS:
                found += self.snap.map(own_pools, [each[0::2], each[1::2]])
            elif each:
                found.append(own_pools(each))
            hits: list[_Hits | _PartHits] = []
            if found:
                part, rows, dist = (_joined([f[i] for f in found]) for i in range(3))
                hits.append(_PartHits(members, part, rows, dist, ids[starts[part] + rows]))
            hits += run(one, [e for e in batch if e.path not in part_of])
            return hits

        # Two waves: the nearest quarter, then what its k-th distance cannot rule out; one wave if no bound is
        # above 0 (q within every superfile's radius), when nothing can be ruled out. Each wave costs ~0.3 ms
        # of routing and reranking besides its scan, so more, smaller waves would cost more than they prune.
        first = max(2, math.ceil(len(entries) / 4)) if np.any(bound > 0) else len(entries)
        hits = search(entries[:first])
        remaining: list[SuperfileEntry] = []
        if first < len(entries):
            kth = _kth(hits, k)
            later = zip(entries[first:], bound[first:].tolist(), strict=True)
            remaining = [e for e, b in later if kth is None or b <= kth]
            hits += search(remaining) if remaining else []
        searched = min(first, len(entries)) + len(remaining)
        self.searched = searched
        return self._result(hits, k, False, projection)

    def _summaries(self, column: str) -> _Summaries:
        """The snapshot's vector summaries of ``column``, stacked once per snapshot."""
        dim = self.options.vector_columns[column].dim
        return _vector_summaries.get_or_load(
            self._table_key(column), self.snap.key, lambda: _Summaries(self.snap.entries(), column, dim)
        )

    def _table_key(self, column: str) -> str:
        """Names the table's column in the per-snapshot caches (the storage URI is the table's own prefix)."""
        return f"{self.snap.files.storage.uri}#{column}"

    def _vector_union(self, column: str) -> _VectorUnionOf | None:
        """One IVF search over the superfiles with an IVF index of ``column`` (``format/vector_union.py``), those
        superfiles (its parts, in order), each one's part number by path and each one's ``_id`` by row offset
        (a view of its ids section, as the union's are of its index: a hit's id then needs no open of its
        superfile, ~2 us a hit); built once per snapshot. None if no superfile qualifies."""

        def build() -> _VectorUnionOf | None:
            entries = [e for e in self.snap.entries() if column in e.vectors]
            if not _fits_open_files(len(entries)):
                return None
            indexes = self.snap.each(lambda e: self.snap.open(e).vector_index(column), entries)
            ivf = [(e, index) for e, index in zip(entries, indexes, strict=True) if index.ivf_lists is not None]
            if not ivf:
                return None
            members = [e for e, _ in ivf]
            ids = [self.snap.files.open(e).ids() for e in members]
            union = VectorUnion([index for _, index in ivf])
            return union, members, {e.path: i for i, e in enumerate(members)}, *_end_to_end(ids)

        return _vector_unions.get_or_load(self._table_key(column), self.snap.key, build)

    # -- hybrid ------------------------------------------------------------------------
    def hybrid_search(
        self,
        text_column: str,
        query: str,
        vector_column: str,
        vector: Any,
        k: int,
        projection: Sequence[str] | None,
    ) -> pa.Table:
        """BM25 (``any``) and vector kNN, each for ``max(k, HYBRID_DEPTH)`` candidates and run concurrently on
        this snapshot, fused by reciprocal rank: ``_id``, ``score`` (float64, higher is better), the projection."""
        k = _check_k(k)
        cols = self._projection(projection)
        depth = max(k, HYBRID_DEPTH)  # each retriever's list length: fusion needs more than the final k

        def text() -> pa.Table:
            searcher = Searcher.of(self.snap)
            searcher.spread = self.spread
            return searcher.bm25_search(text_column, query, depth, "any", cols)

        def vec() -> pa.Table:
            searcher = Searcher.of(self.snap)
            searcher.spread = self.spread
            return searcher.vector_search(
                vector_column, vector, depth, nprobe=None, rerank=None, text_filter=None, where=None, projection=cols
            )

        # The halves run at once while cores are idle, or when they wait on cache nodes rather than compute;
        # otherwise one after the other on this thread, which costs the least CPU. Not on the query pool: the
        # halves' kernels run there, and it must not wait on itself.
        if self.spread or self.snap.fanout is not None:
            pending = search_pool().submit(text)
            nearest_rows = vec()
            results = [pending.result(), nearest_rows]
        else:
            results = [text(), vec()]
        ranked = [ranked_ids(r) for r in results]
        ids, fused = rrf_fuse(ranked, k)
        schema = self._result_schema(cols, hybrid=True)
        if not cols:
            return ranked_table(schema, ids, fused)
        # each fused row's columns from its first place in the two lists
        every = np.concatenate(ranked)
        order = np.argsort(every, kind="stable")
        first = order[np.searchsorted(every[order], ids)]
        rows = pa.concat_tables([r.select(cols) for r in results]).take(first)
        arrays: list[pa.Array | pa.ChunkedArray] = [result_column(ids, pa.uint64()), result_column(fused, pa.float64())]
        arrays += [rows.column(c) for c in cols]
        return pa.Table.from_arrays(arrays, schema=schema)


def check_row_limit(found: int, max_rows: int | None) -> None:
    """An unranked match of more than ``max_rows`` rows is refused before any row is read."""
    if max_rows is not None and found > max_rows:
        raise QueryLimitError(f"{found} rows match, more than the limit of {max_rows}: narrow the match")


def top_terms(counts: Mapping[str, int]) -> list[str]:
    """The ``MAX_PREFIX_TERMS`` most frequent expansions of a prefix (ties: alphabetical)."""
    return [t for t, _ in sorted(counts.items(), key=lambda tc: (-tc[1], tc[0]))[:MAX_PREFIX_TERMS]]


def rrf_fuse(rankings: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of ranked id lists: the top ``k`` ids and their fused scores (ties: ``_id``)."""
    from superfile.format.ranking import rrf_scores  # numba: ~0.2 s to import, paid by a first search

    ids, fused = rrf_scores(rankings, RRF_K)
    order = _ranking(ids, fused, True, k)
    return ids[order], fused[order]


class _Summaries:
    """A snapshot's vector summaries of one column, stacked once: routing a query gathers rows of them instead
    of stacking every superfile's centroid again (~0.15 ms a query over 16 superfiles)."""

    def __init__(self, entries: list[SuperfileEntry], column: str, dim: int) -> None:
        summaries = [e.vectors.get(column) for e in entries]
        self.row = {e.path: i for i, e in enumerate(entries)}
        zero = np.zeros(dim, np.float32)
        self.centroids = np.stack([s.centroid if s is not None else zero for s in summaries]) if entries else None
        self.radii = np.array([s.radius if s is not None else np.inf for s in summaries])


def _fits_open_files(mappings: int) -> bool:
    """Whether a union holding ``mappings`` files open fits the process's open-file budget. A union keeps its
    parts' files mapped for as long as its snapshot is searched, outside the budget of open superfiles; past
    it (thousands of superfiles before compaction catches up) the superfiles are searched one by one, which
    the budget bounds."""
    return mappings <= open_readers().limits[1]


def _route(
    entries: list[SuperfileEntry], summaries: _Summaries, q: np.ndarray, metric: str
) -> tuple[list[SuperfileEntry], np.ndarray]:
    """Nearest superfiles first, so early results can prune the rest, with the smallest distance any vector of
    each can have to q (from its centroid and radius; 0 under dot, which has no such bound)."""
    if not entries or summaries.centroids is None:
        return [], np.zeros(0)
    from superfile.format.ivf_scan import superfile_bounds  # numba: ~0.2 s to import, paid by a first search

    at = np.fromiter((summaries.row[e.path] for e in entries), np.int64, len(entries))
    order, bound = superfile_bounds(summaries.centroids, summaries.radii, at, q, metric)
    return [entries[i] for i in order.tolist()], bound


def _unit(q: np.ndarray, metric: str) -> np.ndarray:
    """The query as a vector index takes it: unit length under cosine (``VectorIndex.prepare_query``)."""
    if metric != "cosine":
        return q
    return np.ascontiguousarray(q / np.float32(query_length(q)))


def _kth(hits: Sequence[_Hits | _PartHits], k: int) -> float | None:
    scores = [h.scores for h in hits if h.scores is not None and len(h.scores)]
    if not scores:
        return None
    allscores = np.concatenate(scores)
    if len(allscores) < k:
        return None
    return float(np.partition(allscores, k - 1)[k - 1])


def _end_to_end(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A union's parts' ``_id`` sections end to end, and where each part's begins (part ``p``'s row ``r`` is at
    ``starts[p] + r``)."""
    starts = np.fromiter(itertools.accumulate(map(len, ids[:-1]), initial=0), np.int64, len(ids))
    return np.concatenate(ids), starts


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` end to end; a lone one as it is."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _bitmap(offsets: np.ndarray) -> pyroaring.BitMap:
    """Row offsets as a bitmap through a uint32 buffer (7x faster than from a Python list at 50k rows)."""
    buf = array.array("I")
    buf.frombytes(np.ascontiguousarray(offsets, np.uint32).tobytes())
    return pyroaring.BitMap(buf)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _allowed_rows(each: list[tuple[int, pyroaring.AbstractBitMap | None]], members: list[SuperfileEntry]) -> int:
    """How many rows a filtered search through the union may score: the allowed ones, every row where none is
    filtered."""
    return sum(members[p].rows if allow is None else len(allow) for p, allow in each)
