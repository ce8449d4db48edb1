"""One tantivy searcher over the full-text indexes of several superfiles: a BM25 top-k in one native call.

Each superfile's index of a column is a committed tantivy index (one
segment per build). A tantivy index is a directory whose ``meta.json`` lists
its segments, so the segments of many superfiles' indexes, extracted to the
local cache, can be listed in one ``meta.json`` (the files linked, not
copied) and opened as one index. Its searcher then ranks across all of them
in Rust, in parallel over segments, with BM25 statistics summed over every
segment: the table-wide statistics the per-superfile path computes
(``FullTextIndex.candidates`` and ``global_top_k``), so the ranking is the
same and does not depend on how the rows are split. That holds only while no
row is deleted: tantivy would count deleted rows in the statistics and
return them, so the caller uses a union only for a snapshot without deletion
vectors. It replaces 9-10 tantivy calls and the numpy bookkeeping per
superfile with one query.

A union also serves a table-wide BM25 with statistics it does not hold (a
cache node's share, ranked with the table's df, N and avgdl that a query root
gathered; or the superfiles of a snapshot that has deletes):
:class:`UnionText` presents it as one :class:`FullTextIndex` whose rows are
numbered across its parts, so ``FullTextIndex.candidates`` and
``global_top_k`` rank it as they rank one superfile. Tantivy's scores only
pick the candidates (idf-corrected boosts), every score returned is the exact
float64 one from tf, the row's fieldnorm and the given statistics, and a
bound on the rows not read decides how deep to read: the answer is the
per-superfile path's, to the bit.

A union is read from this process's *pool* for the index schema: one
directory under ``<cache dir>/unions/`` holding links to the segment files of
the parts of its recent unions, one tantivy index opened on it, and one
``meta.json`` that each union rewrites to list its own segments before the
index reloads and hands out a searcher. A searcher keeps the segments it was
given, so a union is fixed however the pool changes afterwards. Building the
union of a new snapshot (every commit makes one) then links only the new
parts' files, and the reload took 1.1 ms over 140 superfiles, against
10-15 ms to open a fresh directory and ~30 ms to link every file into it,
which the first query after each commit paid. Links no recent union lists
are removed (an open searcher keeps its mapped files). A pool's process holds
a lock beside it for as long as it lives (``scratch.hold``), and the next
process of the same host to make a pool there removes the pools whose lock is
free: the kernel lets a lock go however its holder died, where a pid says
nothing once a restarted container's process has the dead one's pid again.

A pool also merges the segments of its BM25 unions, in the background (``fulltext_merge``): a union of a
snapshot lists the merged segments the pool has made of its parts in their place, each in ``_id`` order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tantivy
from cachetools import LRUCache

from superfile.format.fulltext import (
    K1,
    ROUNDING,
    ROW_FIELD,
    TEXT_FIELD,
    FullTextIndex,
    Norms,
    analyzer_name,
    idf,
    invert_tf,
    make_analyzer,
    scoring_query,
    weight32,
)
from superfile.format.fulltext_merge import Merged, Merges, Source
from superfile.format.fulltext_pads import PAD_WORD, Padding, boosts_for, checked, pad_directories, paddings
from superfile.format.scratch import LOCK, held, hold, remove
from superfile.format.tantivy_files import read_meta, segment_files

__all__ = ["PaddedUnion", "UnionIndex", "UnionText", "merges_done", "union_of", "union_text", "unions_dir"]

log = logging.getLogger(__name__)
_PADDINGS = 32  # paddings a share may use (a term's weight cannot be boosted exactly in ~1 of 8, measured)
_TERMS_KEPT = 4096  # terms whose share df and boosts a padded union keeps
_TIE_EXTRA = 16  # hits fetched past k, so rows tied with the k-th are all seen (ties break by _id later)
_MAX_EXTRA = 4096  # the most hits past k a query starts with (more ties: it fetches 4x as many, again)
_KEEP_UNIONS = 8  # unions whose files a pool keeps linked (a search may build one for an older snapshot)
_UNIONS_DIR = "unions"  # where in a cache directory they are
_NAMES = 64  # names a process tries for a pool before it gives up (others holding the first ones)
_MERGES_DIR = "merged"  # where in a pool its merged segments are
_MERGED = -2  # UnionIndex.part_of of a merged segment: its arrays name each document's part
_NONE = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))  # no hit


class UnionIndex:
    """A searcher over the segments of ``parts`` (in order); hits map back to (part, row offset)."""

    def __init__(
        self,
        index: tantivy.Index,
        searcher: tantivy.Searcher,
        part_of_segment: list[int],
        ordered: bool,
        merged: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """``ordered``: the segments' documents, in order, are in ascending ``_id`` order (see :meth:`top`).
        ``merged``: for each merged segment (``part_of`` -2), its parts' indexes in the union and each
        document's part (an index into those) and row (``fulltext_merge.Merged``)."""
        self.ordered = ordered
        self.index = index
        self.schema = index.schema  # once: tantivy's getter lets the interpreter lock go
        self.searcher = searcher
        if self.searcher.num_segments != len(part_of_segment):
            raise ValueError(f"union opened {self.searcher.num_segments} segments, listed {len(part_of_segment)}")
        self.part_of = list(part_of_segment)
        self.merged = merged or {}
        # hits past k an unordered union fetches first: _TIE_EXTRA, or as many as the last query's ties took
        self._extra = _TIE_EXTRA

    def _located(self, docs: list[tantivy.DocAddress]) -> tuple[np.ndarray, np.ndarray]:
        """Each hit's part index and row offset (int64): a merged segment's from its documents' arrays, a part's
        own segment's from its ``_row`` field."""
        at = np.fromiter((d.doc for d in docs), np.int64, len(docs))
        if len(self.part_of) == 1 and self.merged:  # one merged segment: the steady state of a table's union
            parts, part, rows = self.merged[0]
            return parts[part[at].astype(np.intp)], rows[at].astype(np.int64)  # an int32 index lets the lock go
        segment = np.fromiter((d.segment_ord for d in docs), np.int64, len(docs))
        found = np.asarray(self.part_of, np.int64)[segment]
        rows = np.zeros(len(docs), np.int64)
        own = np.flatnonzero(found != _MERGED)
        if len(own):
            rows[own] = self.searcher.fast_field_values(ROW_FIELD, [docs[i] for i in own.tolist()])
        for s, (parts, part, row) in self.merged.items():
            hit = np.flatnonzero(segment == s)
            found[hit] = parts[part[at[hit]].astype(np.intp)]
            rows[hit] = row[at[hit]]
        return found, rows

    def top(
        self, terms: Sequence[str], k: int, mode: str, boosts: Sequence[float] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The BM25 top-``k`` of analysed ``terms`` (mode "any" or "all"), as each hit's part index and row
        offset (int64) and float32 score, best first; ties break by ``_id`` as on the per-superfile path.
        ``boosts``: one per term, multiplying its weight (``fulltext_pads.boosts_for``).

        Tantivy breaks ties by ascending (segment, doc). When the union is ``ordered`` that is ``_id``
        order, and its top-k is the answer. Otherwise every row tied with the k-th is fetched as well, and
        the caller picks among them by ``_id``."""
        schema = self.schema
        clauses = [tantivy.Query.term_query(schema, TEXT_FIELD, t) for t in terms]
        if boosts is not None:
            clauses = [tantivy.Query.boost_query(q, b) for q, b in zip(clauses, boosts, strict=True)]
        query = scoring_query(clauses, mode == "all")
        limit = k if self.ordered else k + self._extra
        while True:
            hits = self.searcher.search(query, limit, count=False).hits
            if self.ordered or len(hits) < limit or hits[-1][0] < hits[k - 1][0]:
                break
            limit *= 4
        found, docs = zip(*hits, strict=True) if hits else ((), ())
        scores = np.asarray(found, np.float32)
        if not self.ordered and len(hits) >= k:  # the next query starts past as many ties as this one had
            tied = int(np.count_nonzero(scores[k:] >= scores[k - 1]))  # scores descend
            self._extra = min(tied + _TIE_EXTRA, _MAX_EXTRA)
        parts, rows = self._located(list(docs))
        return parts, rows, scores


class UnionText(FullTextIndex):
    """A union as one full-text index for the table-wide BM25 (``candidates``, ``global_top_k``): part ``i``'s
    row offset ``r`` is row ``bases[i] + r``; the fieldnorm ids and token total are its parts' together, as
    tantivy's union sums them for its own scores.

    Candidates come from one search over every segment. Their tf per term is read from each part's own index
    (:meth:`term_scorer`): a query restricted to given rows names them by ``_row``, a row offset that every
    part has, so over the union it would look each one up in every segment (~6x the work for 6 parts)."""

    def __init__(self, union: UnionIndex, parts: Sequence[FullTextIndex]) -> None:
        """``parts``: one segment each (a part's docs are then ``DocAddress(0, doc)`` in its own index)."""
        if any(p.searcher.num_segments != 1 for p in parts):
            raise ValueError("a union's parts for the table-wide BM25 have one segment each")
        norms = Norms(np.concatenate([p.fieldnorm_ids for p in parts]), sum(p.total_tokens for p in parts))
        super().__init__(union.index, parts[0].tokenizer, norms=norms, searcher=union.searcher)  # checks rows
        sizes = np.asarray([p.num_docs for p in parts], np.int64)
        self.bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._segment_base = self.bases[np.asarray(union.part_of, np.int64)]
        self.parts = list(parts)

    def rows_of(self, docs: list[tantivy.DocAddress]) -> np.ndarray:
        offsets = super().rows_of(docs)
        segments = np.fromiter((d.segment_ord for d in docs), np.int64, len(docs))
        return offsets + self._segment_base[segments]

    def split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Union rows as (part index, row offset in that part)."""
        part = np.searchsorted(self.bases, rows, side="right") - 1
        return part, rows - self.bases[part]

    def term_scorer(self, rows: np.ndarray, docs: list[tantivy.DocAddress]) -> Callable[[str, int], np.ndarray]:
        """The union's score of a term alone for these docs: tantivy's from the term's postings if it is rare,
        else from the tf that each part's own index gives (float64: within float32 rounding of tantivy's)."""
        part, offsets = self.split(rows)
        groups = []
        part_norm = np.empty(len(rows), np.float64)  # k1 * (1 - b + b * dl / avgdl) with each part's avgdl
        for p in np.unique(part).tolist():
            at = np.flatnonzero(part == p)
            fts = self.parts[p]
            own = [tantivy.DocAddress(0, docs[i].doc) for i in at.tolist()]
            groups.append((at, fts, own, fts.term_scorer(offsets[at], own)))
            part_norm[at] = fts.own_norm[fts.fieldnorm_ids[offsets[at]]]
        norm = self.own_norm[self.fieldnorm_ids[rows]]

        def scores(term: str, doc_freq: int) -> np.ndarray:
            if self.reads_postings(doc_freq, len(docs)):  # a rare term: its postings in one search of the union
                return self.posting_scores(term, doc_freq, docs)
            observed = np.zeros(len(rows), np.float64)
            weight = np.ones(len(rows), np.float64)  # where a part lacks the term, observed 0 inverts to tf 0
            for at, fts, _, scorer in groups:
                part_df = fts.doc_freq(term)
                if part_df:
                    observed[at] = scorer(term, part_df)
                    weight[at] = idf(fts.num_docs, part_df) * (K1 + 1)
            tf = invert_tf(observed[None, :], weight[None, :], part_norm[None, :], observed[None, :] * ROUNDING)[0]
            for i in np.flatnonzero(tf < 0).tolist():  # float32 cannot tell tf apart (tf in the hundreds)
                at, fts, own, _ = next(g for g in groups if i in g[0])
                tf[i] = fts.explained_tf(term, own[int(np.searchsorted(at, i))])
            return idf(self.num_docs, doc_freq) * (K1 + 1) * tf / (tf + norm)

        return scores


def union_text(parts: Sequence[FullTextIndex], cache_dir: str) -> UnionText:
    """The union of these indexes as a :class:`UnionText` (``union_of``'s directory; raises as it does, and
    RuntimeError when a part has no norms)."""
    return UnionText(union_of(parts, cache_dir, ordered=False), parts)


def union_of(
    parts: Sequence[FullTextIndex], cache_dir: str, *, ordered: bool, pads: Sequence[str] = (), merge: bool = False
) -> UnionIndex:
    """The union of these indexes (same column, same tokenizer, in this order), read from this process's pool
    under ``cache_dir``; ``ordered`` as in :class:`UnionIndex`; ``pads``: padding segments' directories
    (``fulltext_pads``) listed after the parts, part -1. ``merge``: list the merged segments the pool has made
    of parts' segments in their place, and have it merge more (``fulltext_merge``); such a union stays
    ``ordered`` where each merged segment holds consecutive parts in ``_id`` order. Raises OSError or
    ValueError when a part's files are not where they were extracted."""
    layouts = [_layout(p) for p in parts]
    pool = _pool(cache_dir, layouts[0].meta, parts[0].tokenizer)
    listed: list[_Layout] = []
    part_of: list[int] = []
    merged: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    rest = list(range(len(layouts)))
    if merge:
        single = [i for i, x in enumerate(layouts) if len(x.meta["segments"]) == 1]  # a merge's sources
        index_of = {_segment_id(layouts[i]): i for i in single}
        # listed by their first part, so that a merged segment of consecutive parts keeps them in order
        covered = pool.merges.cover([_source(layouts[i]) for i in single])
        covered.sort(key=lambda s: min(index_of[p] for p in s.parts))
        for source in covered:
            held = [index_of[p] for p in source.parts]
            if isinstance(source, Merged):
                merged[len(part_of)] = (np.asarray(held, np.int64), source.part, source.rows)
                listed.append(_dir_layout(source.directory))
                part_of.append(_MERGED)
                ordered = ordered and source.ordered and sorted(held) == list(range(min(held), min(held) + len(held)))
            else:
                listed.append(layouts[held[0]])
                part_of.append(held[0])
        rest = [i for i, x in enumerate(layouts) if len(x.meta["segments"]) != 1]
    listed += [layouts[i] for i in rest]
    part_of += [i for i in rest for _ in layouts[i].meta["segments"]]
    # A part built in several segments has them in meta.json order, which need not be row order.
    ordered = ordered and all(len(x.meta["segments"]) <= 1 for x in layouts)
    padding = [_dir_layout(d) for d in pads]
    part_of += [-1 for x in padding for _ in x.meta["segments"]]
    index, searcher = pool.searcher(listed + padding, kept=padding)
    return UnionIndex(index, searcher, part_of, ordered, merged)


def _segment_id(layout: _Layout) -> str:
    return str(layout.meta["segments"][0]["segment_id"])


def _source(layout: _Layout) -> Source:
    """A one-segment part as a source of merged segments."""
    return Source(layout.directory, (_segment_id(layout),), (int(layout.meta["segments"][0]["max_doc"]),))


def merges_done(timeout: float) -> bool:
    """Whether no pool of this process is merging segments (``fulltext_merge``), waiting up to ``timeout``
    seconds for each: for benchmarks and tests, which measure the merged state."""
    with _pools_lock:
        pools = list(_pools.values())
    return all(pool.merges.wait(timeout) for pool in pools)


def unions_dir(cache_dir: str) -> str:
    """Where a cache directory keeps its pools (and the padding segments they link)."""
    return os.path.join(cache_dir, _UNIONS_DIR)


class PaddedUnion:
    """A share's parts searched as if they were the whole table (``fulltext_pads``): tantivy scores them, bit
    for bit, as it scores the table's union, given the table's N, token total and df per term. Each of a few
    paddings (another N each) is a union of the parts (merged segments where its pool has made them,
    ``fulltext_merge``) and its padding segments, built when a query first needs it: a query takes the first in
    which every term's weight can be boosted exactly to the table's."""

    def __init__(
        self,
        parts: Sequence[FullTextIndex],
        cache_dir: str,
        ordered: bool,
        num_docs: int,
        total_tokens: int,
        pad_token: str,
        plans: list[Padding],
    ) -> None:
        self.parts, self.cache_dir, self.ordered = list(parts), cache_dir, ordered
        self.num_docs, self.total_tokens = num_docs, total_tokens
        self.pad_token, self.plans = pad_token, plans
        self._schema = json.dumps(_layout(parts[0]).meta.get("schema"), sort_keys=True)
        self._docs = np.asarray([plan.docs for plan in plans], np.int64)
        self._unions: dict[int, UnionIndex | None] = {}
        self._terms: LRUCache[tuple[str, int], tuple[int, list[float]]] = LRUCache(maxsize=_TERMS_KEPT)
        self._lock = threading.Lock()

    @classmethod
    def make(
        cls, parts: Sequence[FullTextIndex], cache_dir: str, *, ordered: bool, num_docs: int, total_tokens: int
    ) -> PaddedUnion | None:
        """None when no padding fits the share or the padding word is not one token of this analyzer."""
        pad = parts[0].analyze(PAD_WORD)
        share_docs, share_tokens = sum(p.num_docs for p in parts), sum(p.total_tokens for p in parts)
        plans = paddings(share_docs, share_tokens, num_docs, total_tokens, _PADDINGS)
        if len(pad) != 1 or not plans:
            return None
        return cls(parts, cache_dir, ordered, num_docs, total_tokens, pad[0], plans)

    def union(self, i: int) -> UnionIndex | None:
        """The union padded by ``plans[i]`` (built once); None while its padding segments are being built, or
        if tantivy's explanation of a padding hit disagrees with ours (``fulltext_pads.checked``). Raises
        ValueError if a padding index has another schema, and as :func:`union_of` does."""
        with self._lock:
            if i in self._unions:
                return self._unions[i]
            pads = pad_directories(unions_dir(self.cache_dir), self._schema, self.parts[0].tokenizer, self.plans[i])
            if pads is None:
                return None
            union = union_of(self.parts, self.cache_dir, ordered=self.ordered, pads=pads, merge=True)
            probe = tantivy.Query.term_query(union.schema, TEXT_FIELD, self.pad_token)
            fits = checked(union.searcher, probe, self.num_docs, self.total_tokens)
            if not fits:
                log.warning("tantivy does not score a padded union as expected; leaves rescore their candidates")
            self._unions[i] = union if fits else None
            return self._unions[i]

    def top(
        self, terms: Sequence[str], k: int, mode: str, doc_freq: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`UnionIndex.top` with the table's statistics (``doc_freq``: the table's df of each term); None
        when no padding lets every term's weight be boosted exactly (the caller rescores then)."""
        if self.pad_token in terms:
            return None
        kept, boosts = [], []
        for term, df in zip(terms, doc_freq, strict=True):
            here, each = self._term(term, df)
            if not here:  # no row of the share holds it: it scores nothing here
                if mode == "all":
                    return _NONE
                continue
            kept.append(term)
            boosts.append(each)
        if not kept:
            return _NONE
        usable = np.all(np.isfinite(np.asarray(boosts, np.float64)), axis=0)  # per padding: every term boosted
        for i in np.flatnonzero(usable).tolist():
            union = self.union(i)
            if union is not None:
                return union.top(kept, k, mode, [b[i] for b in boosts])
        return None

    def _term(self, term: str, df: int) -> tuple[int, list[float]]:
        """The share's df of ``term`` and its boost in each padding (NaN where none is exact), given its table
        df: computed once per term (and table df) for this share."""
        with self._lock:
            known = self._terms.get((term, df))
            counter = next((u.searcher for u in self._unions.values() if u is not None), None)
        if known is None:
            # the padding holds no term but its own: one look-up in a union built already, else one per part
            here = counter.doc_freq(TEXT_FIELD, term) if counter else sum(p.doc_freq(term) for p in self.parts)
            known = here, boosts_for(self._docs, here, weight32(self.num_docs, df)) if here else []
            with self._lock:
                self._terms[(term, df)] = known
        return known


@dataclass(frozen=True)
class _Layout:
    """A part's directory, its ``meta.json``, its segments as JSON, and the names of its segments' files."""

    directory: str
    meta: dict[str, Any]
    segments: str  # the entries of meta["segments"], serialised and comma-separated
    opstamp: int
    files: tuple[str, ...]


_SEGMENTS = "\x00segments\x00"  # where a union's meta.json gets its parts' segments
_layouts: weakref.WeakKeyDictionary[FullTextIndex, _Layout] = weakref.WeakKeyDictionary()
_dir_layouts: LRUCache[tuple[str, int], _Layout] = LRUCache(maxsize=256)  # paddings and merged segments
_layouts_lock = threading.Lock()


def _layout(part: FullTextIndex) -> _Layout:
    """A part's layout, read once per opened part (an extraction never changes): a union of n parts then
    costs no n file reads and no n directory listings."""
    with _layouts_lock:
        known = _layouts.get(part)
    if known is None:
        if part.directory is None:
            raise ValueError("a part has no directory")
        known = _read_layout(part.directory)
        with _layouts_lock:
            _layouts[part] = known
    return known


def _dir_layout(directory: str) -> _Layout:
    """A padding segment's layout (``fulltext_pads``) or a merged one's (``fulltext_merge``), read once per build
    of it: neither changes, but a padding removed from the cache directory is built again, with other names."""
    key = (directory, os.stat(os.path.join(directory, "meta.json")).st_mtime_ns)
    with _layouts_lock:
        known = _dir_layouts.get(key)
    if known is None:
        known = _read_layout(directory)
        with _layouts_lock:
            _dir_layouts[key] = known
    return known


def _read_layout(directory: str) -> _Layout:
    meta = read_meta(directory)
    segments = ",".join(json.dumps(seg) for seg in meta["segments"])
    return _Layout(directory, meta, segments, int(meta.get("opstamp", 0)), tuple(segment_files(directory, meta)))


class _Pool:
    """This process's union directory for one index schema (see the module's docstring)."""

    def __init__(self, path: str, tokenizer: str) -> None:
        """``path``: a pool directory whose lock this process holds (:func:`_own_path`)."""
        self.path, self.tokenizer = path, tokenizer
        self._lock = threading.Lock()
        self._index: tantivy.Index | None = None
        self._linked: set[str] = set()
        self._recent: deque[set[str]] = deque(maxlen=_KEEP_UNIONS)  # the files of the latest unions
        self._kept: set[str] = set()  # padding segments' files: linked for good (a bounded family)
        self.merges = Merges(os.path.join(path, _MERGES_DIR), tokenizer)  # in the pool: removed with it

    def searcher(self, layouts: list[_Layout], kept: Sequence[_Layout] = ()) -> tuple[tantivy.Index, Any]:
        """The pool's index and a searcher over exactly these parts' segments, in order. The files of ``kept``
        (padding segments, shared by every padded union and never removed) stay linked for good."""
        with self._lock:
            for layout in kept:
                self._kept.update(layout.files)
            try:
                return self._searcher(layouts, repair=False)
            except (OSError, ValueError):  # a link left dangling (its extraction was removed): link anew
                return self._searcher(layouts, repair=True)

    def _searcher(self, layouts: list[_Layout], *, repair: bool) -> tuple[tantivy.Index, Any]:
        if not os.path.isdir(self.path):  # first use, or removed under it: start over
            os.makedirs(self.path, exist_ok=True)
            self._index, self._linked = None, set()
        names: set[str] = set()
        for layout in layouts:
            names.update(layout.files)
            for name in layout.files if repair else set(layout.files) - self._linked:
                link = os.path.join(self.path, name)
                if repair and name in self._linked and os.path.exists(link):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(link)
                os.symlink(os.path.join(layout.directory, name), link)
                self._linked.add(name)
        # meta.json: the first part's, listing every part's segments (each part's serialised once)
        head = {**layouts[0].meta, "segments": _SEGMENTS, "opstamp": max(x.opstamp for x in layouts)}
        segments = "[" + ",".join(x.segments for x in layouts if x.segments) + "]"
        tmp = os.path.join(self.path, f".meta-{uuid.uuid4().hex[:8]}.json")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(head).replace(json.dumps(_SEGMENTS), segments, 1))
        os.replace(tmp, os.path.join(self.path, "meta.json"))
        if self._index is None:
            index = tantivy.Index.open(self.path)
            index.register_tokenizer(analyzer_name(self.tokenizer), make_analyzer(self.tokenizer))
            self._index = index
        else:
            self._index.reload()
        searcher = self._index.searcher()
        self._recent.append(names)
        keep = set().union(self._kept, *self._recent)
        for name in self._linked - keep:  # an open searcher keeps the files it mapped
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.path, name))
        self._linked &= keep
        return self._index, searcher


_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"  # pools are per host and pid
_pools: dict[str, _Pool] = {}
_pools_lock = threading.Lock()


def _forget_pools() -> None:
    """In a forked child: the parent's pools (their indexes, their locks) are the parent's; it makes its own."""
    global _pools, _pools_lock, _layouts_lock
    _pools, _pools_lock, _layouts_lock = {}, threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)


def _pool(cache_dir: str, meta: dict[str, Any], tokenizer: str) -> _Pool:
    """This process's pool for the index schema of ``meta`` under ``cache_dir`` (made on first use)."""
    schema = json.dumps(meta.get("schema"), sort_keys=True)
    key = f"{os.path.abspath(cache_dir)}#{schema}"
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            unions = os.path.join(cache_dir, _UNIONS_DIR)
            os.makedirs(unions, exist_ok=True)
            _prune(unions)
            tag = hashlib.sha1(schema.encode()).hexdigest()[:12]
            pool = _pools[key] = _Pool(_own_path(unions, tag), tokenizer)
        return pool


_held: list[int] = []  # the descriptors of this process's pool locks: open for its life


def _own_path(unions_dir: str, tag: str) -> str:
    """A pool directory for this process, its lock held from now on. The name has this host and pid, unless a
    live process holds that name's lock (another container of a pod, in its own pid namespace, has the same
    hostname and often the same pid, 1): then a count follows the pid."""
    for n in range(_NAMES):
        path = os.path.join(unions_dir, f"pool-{_HOST}-{os.getpid()}{f'x{n}' if n else ''}-{tag}")
        fd = hold(path)
        if fd is not None:
            _held.append(fd)
            return path
    raise OSError(f"{_NAMES} union pools named for this host and pid are held under {unions_dir}")


def _prune(unions_dir: str) -> None:
    """Remove the pools of this host's processes that are gone: whose lock no one holds, or for a pool of an
    earlier version without a lock, whose pid is not alive (another host's, sharing the directory, are not this
    one's to judge: ``flock`` is not reliable across hosts). And the directories per union that earlier
    versions made."""
    for entry in os.scandir(unions_dir):
        name = entry.name
        if name.startswith("pool-"):
            pool = entry.path.removesuffix(LOCK)
            host, _, rest = os.path.basename(pool)[len("pool-") :].rpartition("-")[0].rpartition("-")
            unlocked = not os.path.exists(pool + LOCK)  # an earlier version's pool
            if host != _HOST or held(pool) or (unlocked and rest.isdigit() and _alive(int(rest))):
                continue
            remove(pool)  # or a lock without its pool: a process that never searched
        elif name.startswith("union-"):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
