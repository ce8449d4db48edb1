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

A union's directory is named after its parts' directories (each named after
a superfile's content), built once under ``<cache dir>/unions/`` (atomically,
like an extraction) and reused by every process; the caller keeps the opened
union for as long as its snapshot is queried. Every
commit makes a new set of superfiles, so building a union also removes the
oldest union directories beyond the newest ``_KEEP_DIRS`` (links only: an
index already open keeps its memory-mapped segment files). They have a
directory of their own because that removal lists it: listing the cache
directory itself, which holds an extraction per superfile, took 15 ms of
the first query after each commit with 17,000 entries there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence

import numpy as np
import tantivy

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
)
from superfile.format.tantivy_files import read_meta, segment_files

__all__ = ["UnionIndex", "UnionText", "union_of", "union_text"]

_TIE_EXTRA = 16  # hits fetched past k, so rows tied with the k-th are all seen (ties break by _id later)
_KEEP_DIRS = 64  # union directories kept under a cache directory
_UNIONS_DIR = "unions"  # where in a cache directory they are


class UnionIndex:
    """A searcher over the segments of ``parts`` (in order); hits map back to (part, row offset)."""

    def __init__(self, index: tantivy.Index, part_of_segment: list[int], tokenizer: str, ordered: bool) -> None:
        """``ordered``: the parts' rows, in part order, are in ascending ``_id`` order (see :meth:`top`)."""
        index.register_tokenizer(analyzer_name(tokenizer), make_analyzer(tokenizer))
        self.ordered = ordered
        self.index = index
        self.searcher = index.searcher()
        if self.searcher.num_segments != len(part_of_segment):
            raise ValueError(f"union opened {self.searcher.num_segments} segments, listed {len(part_of_segment)}")
        self.part_of = list(part_of_segment)

    def top(self, terms: Sequence[str], k: int, mode: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The BM25 top-``k`` of analysed ``terms`` (mode "any" or "all"), as (part index, row offsets,
        float32 scores) per part that has hits; ties break by ``_id`` as on the per-superfile path.

        Tantivy breaks ties by ascending (segment, doc). When the union is ``ordered`` that is ``_id``
        order, and its top-k is the answer. Otherwise every row tied with the k-th is fetched as well, and
        the caller picks among them by ``_id``."""
        occur = tantivy.Occur.Must if mode == "all" else tantivy.Occur.Should
        schema = self.index.schema
        query = tantivy.Query.boolean_query([(occur, tantivy.Query.term_query(schema, TEXT_FIELD, t)) for t in terms])
        limit = k if self.ordered else k + _TIE_EXTRA
        while True:
            hits = self.searcher.search(query, limit, count=False).hits
            if self.ordered or len(hits) < limit or hits[-1][0] < hits[k - 1][0]:
                break
            limit *= 4
        if not hits:
            return []
        rows = self.searcher.fast_field_values(ROW_FIELD, [d for _, d in hits])
        by_part: dict[int, tuple[list[int], list[float]]] = {}
        for (score, doc), row in zip(hits, rows, strict=True):  # k hits: plain Python beats numpy's set-up
            found = by_part.setdefault(self.part_of[doc.segment_ord], ([], []))
            found[0].append(int(row))  # type: ignore[arg-type]  # the row field is an int fast field
            found[1].append(score)
        return [(p, np.asarray(r, np.int64), np.asarray(s, np.float32)) for p, (r, s) in sorted(by_part.items())]


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
        super().__init__(union.index, parts[0].tokenizer, norms=norms)  # checks the rows add up
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


def union_of(parts: Sequence[FullTextIndex], cache_dir: str, *, ordered: bool) -> UnionIndex:
    """The union of these indexes (same column, same tokenizer, in this order), its directory built under
    ``cache_dir`` unless there already; ``ordered`` as in :class:`UnionIndex`. Raises OSError or ValueError
    when a part's files are not where they were extracted."""
    directories = [p.directory for p in parts]
    if any(d is None for d in directories):
        raise ValueError("a part has no directory")
    key = hashlib.sha1("\n".join(d for d in directories if d).encode()).hexdigest()[:20]
    path = os.path.join(cache_dir, _UNIONS_DIR, f"union-{key}")
    metas = []
    for part in parts:
        assert part.directory is not None
        metas.append(read_meta(part.directory))
    part_of = [i for i, meta in enumerate(metas) for _ in meta["segments"]]
    # A part built in several segments has them in meta.json order, which need not be row order.
    ordered = ordered and all(len(meta["segments"]) <= 1 for meta in metas)
    if not os.path.isdir(path):
        _link(parts, metas, path)
        _prune(os.path.dirname(path))
    return UnionIndex(tantivy.Index.open(path), part_of, parts[0].tokenizer, ordered)


def _prune(unions_dir: str) -> None:
    """Remove all but the newest ``_KEEP_DIRS`` union directories (by modification time)."""
    unions = []
    for entry in os.scandir(unions_dir):
        if entry.name.startswith("union-") and ".tmp-" not in entry.name:
            with contextlib.suppress(FileNotFoundError):
                unions.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _, old in sorted(unions, reverse=True)[_KEEP_DIRS:]:
        shutil.rmtree(old, ignore_errors=True)


def _link(parts: Sequence[FullTextIndex], metas: list[dict], path: str) -> None:
    """Write the union's directory: links to every segment file and one meta.json listing the segments in
    part order. Built aside and renamed into place, so a reader never sees half of it."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)  # and the unions' directory, the first time
    try:
        for part, meta in zip(parts, metas, strict=True):
            assert part.directory is not None
            for name in segment_files(part.directory, meta):
                os.symlink(os.path.join(part.directory, name), os.path.join(tmp, name))
        merged = {**metas[0], "segments": [s for meta in metas for s in meta["segments"]]}
        merged["opstamp"] = max(int(meta.get("opstamp", 0)) for meta in metas)
        with open(os.path.join(tmp, "meta.json"), "w") as fh:
            json.dump(merged, fh)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):  # not a concurrent builder's union: a real failure
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
