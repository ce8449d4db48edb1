"""Exact search over a superfile that lacks a column's index: the per-superfile kernel every search kind uses
wherever the index is missing.

A superfile lacks a full-text or vector index when the index was created after the file was written
(``create_fts_index`` / ``create_vector_index`` commit at once; the files are rewritten with it in the
background, ``table/evolve.py``). Until then such a file is searched here, from its column's values, with the
results the index would give:

- :class:`ExactText` answers what :class:`~superfile.format.fulltext.FullTextIndex` does (document
  frequencies, the table-wide BM25 candidates, boolean and exact matches, prefix expansion) from the analysed
  values: the column's tokenizer, tantivy's length quantisation (``FIELDNORMS``) and the same float32 arithmetic
  as the indexed path's exact rescoring (``format/fulltext.py``, ``global_top_k``), so a row scores the same
  with or without the index. Its candidates are exact at once: ``global_top_k`` merges them with the indexed
  files' candidates.
- :func:`nearest` scans the vectors: exact distances under the column's metric (``exact_distances``, as the
  indexed path reranks), nearest first, ties by row.

Analysing a column costs a pass over its values; it is kept per superfile and column (:data:`_analysed`, up to
:data:`ANALYSED_BYTES` of analyses, not a count: a table of 10,000 small level-0 superfiles keeps them all), as an
index would be, until the background rewrite replaces the file; then, once no live snapshot names the file,
:func:`release` drops it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyroaring

from superfile._lru import BudgetLRU
from superfile.errors import InvalidOptionError
from superfile.format.fulltext import Candidates, CorpusStats, corpus_df, length_norm32, make_analyzer, weight32
from superfile.format.tantivy_files import FIELDNORMS
from superfile.format.vector_sections import exact_distances

__all__ = ["ANALYSED_BYTES", "ExactCandidates", "ExactText", "analysed", "nearest", "release"]

_MODES = {"any": False, "or": False, "all": True, "and": True}

ANALYSED_BYTES = 512 << 20
_analysed = BudgetLRU((ANALYSED_BYTES,), lambda text: (text.nbytes,))  # URI # path # column # tokenizer -> ExactText


class ExactCandidates(Candidates):
    """One unindexed file's rows that can be in a table-wide BM25 top-k, with their exact scores: what
    :class:`~superfile.format.fulltext.Candidates` converges to, known at once (nothing unread)."""

    def __init__(self, rows: np.ndarray, scores: np.ndarray) -> None:  # no plan, query or index to read from
        self.rows = rows
        self.low = self.high = scores
        self.unseen = -math.inf

    def read(self) -> None:
        """Nothing to read: every candidate is known."""

    def deepen(self) -> None:
        """Nothing more to read."""

    def settle(self, threshold: float) -> None:
        """Every score is exact already."""


class ExactText:
    """One superfile's full-text column analysed in memory (row offset = document)."""

    def __init__(self, values: pa.Array | pa.ChunkedArray, tokenizer: str) -> None:
        analyzer = make_analyzer(tokenizer)
        self.values = values
        self.num_docs = len(values)
        lengths = np.zeros(self.num_docs, np.int64)
        rows: dict[str, list[int]] = {}
        freqs: dict[str, list[int]] = {}
        for row, value in enumerate(values.to_pylist()):
            if value is None:
                continue  # a null has no terms and length 0, as in the index
            tokens = analyzer.analyze(value)
            lengths[row] = len(tokens)
            for term, tf in Counter(tokens).items():
                rows.setdefault(term, []).append(row)
                freqs.setdefault(term, []).append(tf)
        self._postings = {t: (np.asarray(rows[t], np.int64), np.asarray(freqs[t], np.float32)) for t in rows}
        self.total_tokens = int(lengths.sum())
        self._norm_ids = (np.searchsorted(FIELDNORMS, lengths, side="right") - 1).astype(np.uint8)  # tantivy's
        # what it holds: the values, 12 bytes a posting, the lengths, and ~200 bytes of Python objects a term
        postings = sum(len(r) for r, _ in self._postings.values())
        self.nbytes = values.nbytes + 12 * postings + self._norm_ids.nbytes + 200 * len(self._postings)

    def doc_freq(self, term: str) -> int:
        """Rows containing the analysed ``term``."""
        found = self._postings.get(term)
        return 0 if found is None else len(found[0])

    def terms_with_prefix(self, prefix: str) -> list[tuple[str, int]]:
        """Every term starting with ``prefix``, with the rows holding it."""
        return sorted((t, len(p[0])) for t, p in self._postings.items() if t.startswith(prefix))

    def match(self, terms: Sequence[str], mode: str = "and") -> pyroaring.BitMap:
        """Rows holding all (``and``/``all``) or any (``or``/``any``) of the analysed terms; none for no terms."""
        uniq = list(dict.fromkeys(terms))
        sets = [pyroaring.BitMap(self._postings[t][0].astype(np.uint32)) if t in self._postings else None for t in uniq]
        if not uniq:
            return pyroaring.BitMap()
        if _required(mode):
            if any(s is None for s in sets):
                return pyroaring.BitMap()
            return pyroaring.BitMap.intersection(*[s for s in sets if s is not None])
        found = [s for s in sets if s is not None]
        return pyroaring.BitMap.union(*found) if found else pyroaring.BitMap()

    def match_exact(self, value: str) -> pyroaring.BitMap:
        """Rows whose value is ``value`` exactly (nulls never match)."""
        equal = pc.equal(self.values, pa.scalar(value, self.values.type)).fill_null(False)
        hits = np.flatnonzero(np.asarray(equal.to_numpy(zero_copy_only=False), bool))
        return pyroaring.BitMap(hits.astype(np.uint32))

    def candidates(
        self,
        terms: Sequence[str],
        k: int,
        stats: CorpusStats,
        *,
        mode: str = "any",
        allow: pyroaring.AbstractBitMap | None = None,
    ) -> ExactCandidates | None:
        """The rows of this file that can make a table-wide BM25 top-``k`` under ``stats``, exactly scored
        (as ``FullTextIndex.candidates`` followed by ``global_top_k``'s rescoring); None when none can score."""
        required = _required(mode)
        uniq = list(dict.fromkeys(terms))
        n_glob, tokens_glob = int(stats.num_docs), int(stats.total_tokens)
        if k <= 0 or not uniq or self.num_docs == 0 or n_glob <= 0 or tokens_glob <= 0:
            return None
        norm = length_norm32(n_glob, tokens_glob)[self._norm_ids]  # tantivy's float32 arithmetic (scores32)
        score = np.zeros(self.num_docs, np.float32)
        hits = np.zeros(self.num_docs, np.int64)
        scored = 0
        for t in uniq:
            found = self._postings.get(t)
            if found is None:
                if required:
                    return None
                continue
            df_glob = corpus_df(stats, t, n_glob)
            if df_glob == 0:  # only rows the corpus does not count (deleted ones) hold the term
                if required:
                    return None
                continue
            rows, tf = found
            score[rows] = score[rows] + weight32(n_glob, df_glob) * (tf / (tf + norm[rows]))
            hits[rows] += 1
            scored += 1
        if not scored:
            return None
        matched = hits == scored if required else hits > 0
        if allow is not None:
            allowed = np.zeros(self.num_docs, bool)
            offsets = np.frombuffer(allow.to_array(), np.uint32).astype(np.int64)
            allowed[offsets[offsets < self.num_docs]] = True
            matched &= allowed
        rows = np.flatnonzero(matched & (score > 0))
        if not len(rows):
            return None
        if len(rows) > k:  # the file's own k-th best bounds what it can add: keep its ties, drop the rest
            kth = np.partition(score[rows], len(rows) - k)[len(rows) - k]
            rows = rows[score[rows] >= kth]
        return ExactCandidates(rows, score[rows].astype(np.float64))


def analysed(key: str, values: Callable[[], pa.Array | pa.ChunkedArray], tokenizer: str) -> ExactText:
    """The analysis of one superfile's column (``key`` names the file and column; ``values()`` reads the column,
    only when it is not kept yet), kept for later queries."""
    found, _ = _analysed.get_or_load(f"{key}#{tokenizer}", lambda: ExactText(values(), tokenizer))
    return found


def release(uri: str, keep: Callable[[str], bool]) -> None:
    """Drop the analyses of table ``uri``'s superfiles whose path ``keep`` rejects (no live snapshot names them:
    ``TableFiles.release``). Keys are ``URI#path#column#tokenizer``, as :func:`analysed` is given them."""
    prefix = f"{uri}#"
    _analysed.discard(lambda k: not k.startswith(prefix) or keep(k[len(prefix) :].split("#", 1)[0]))


def nearest(
    rows: np.ndarray,
    vectors: np.ndarray,
    query: np.ndarray,
    metric: str,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest of ``vectors`` (row ``rows[i]`` holds ``vectors[i]``) to ``query`` under ``metric``,
    nearest first, ties by row: (row offsets int64, distances float32). ``query`` is as the index takes it
    (unit length under cosine). Zero vectors have no direction under cosine: they are never returned."""
    if not len(rows) or k <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    v = np.asarray(vectors, np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", v, v))
    if metric == "cosine" and not norms.all():
        keep = norms > 0
        rows, v, norms = rows[keep], v[keep], norms[keep]
    dist = np.asarray(exact_distances(v, query, norms, metric), np.float32)
    order = np.lexsort((rows, dist))[:k]
    return rows[order].astype(np.int64), dist[order]


def _required(mode: str) -> bool:
    try:
        return _MODES[mode]
    except KeyError:
        raise InvalidOptionError(f"mode must be one of {sorted(_MODES)}, got {mode!r}") from None
