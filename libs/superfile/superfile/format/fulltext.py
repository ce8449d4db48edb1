"""Full-text index blobs: one tantivy index per text column, packed into one blob of a superfile.

Tantivy only opens indexes from a directory, so a blob is a tiny archive of the
index files (:mod:`superfile.format.archive`), extracted once into a cache
directory and reused afterwards. What this module reads from tantivy's own
files (the norms) is parsed by :mod:`superfile.format.tantivy_files`.

Inside each index (one per column) there are four fields:

- ``_row``: u64, indexed + fast. The row offset in the Parquet part. Hits are
  mapped to rows through it, never through segment order.
- ``_id``: u64, fast. The row's ``_id``: the merge of several superfiles'
  segments (``fulltext_merge``) orders its documents by it. Indexes written
  before it was added lack it, and are not merged.
- ``text``: the column's text, analysed by the column's tokenizer, indexed
  with term frequencies (BM25) but no positions, not stored (Parquet is the store).
- ``_h_text``: u64, indexed. 64 bits of BLAKE2b of the raw UTF-8 value, so an
  exact-value lookup is one term lookup whose cost is proportional to its matches.

Null values add a document with ``_row`` and ``_id`` only: no terms, no hash.

Besides tantivy's files the blob carries ``superfile-norms``: every row's
tantivy fieldnorm id (its quantised analysed length) and the exact token total,
which :meth:`FullTextIndex.candidates` needs to score with table-wide BM25
statistics (see "Table-wide BM25" in ``docs/format.md``).
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import hashlib
import json
import math
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyroaring
import tantivy

from superfile.errors import CorruptSuperfileError, InvalidOptionError
from superfile.format import archive
from superfile.format.scratch import scratch_dir
from superfile.format.tantivy_files import FIELDNORMS, field_norms, live_files

__all__ = [
    "K1",
    "ROUNDING",
    "TOKENIZERS",
    "B",
    "Candidates",
    "CorpusStats",
    "FullTextBlob",
    "FullTextIndex",
    "Norms",
    "analyzer_name",
    "avgdl32",
    "build_fulltext",
    "corpus_df",
    "global_top_k",
    "idf",
    "idf32",
    "index_schema",
    "invert_tf",
    "length_norm32",
    "make_analyzer",
    "scores32",
    "scoring_query",
    "thread_analyzer",
    "value_hash",
    "weight32",
    "weights32",
]

TOKENIZERS = ("english", "simple", "raw", "whitespace")

ROW_FIELD = "_row"
ID_FIELD = "_id"
TEXT_FIELD = "text"
HASH_FIELD = "_h_text"
INDEX_OPTION = "freq"  # BM25 needs term frequencies and field norms; no phrase queries, so no positions
_WRITER_HEAP = 128_000_000  # per superfile build; above it tantivy flushes another segment (still correct)
_SMALL_ALLOW = 16_384  # allow-lists up to this size are pushed into the query as a term set
_MODES = {"any": False, "or": False, "all": True, "and": True}  # value: every term required
_NORMS_FILE = "superfile-norms"  # our own entry in the packed archive; never extracted next to tantivy's files
_NORMS_HEAD = struct.Struct("<8sQQ")  # magic, row count, exact token total; then one u8 fieldnorm id per row
_NORMS_MAGIC = b"SFNORMS1"
K1, B = 1.2, 0.75  # tantivy's BM25 constants
_SLACK = 1e-4  # relative margin on every score bound: covers tantivy's float32 arithmetic many times over
ROUNDING = 2.0**-20  # relative error bound of a tantivy score as we recompute it (float32: 2^-24 per operation)
_FIRST_EXTRA = 32  # candidates reads k + this many hits first, then 4x as many per round
_ROW_DISJUNCTION = 512  # up to this many rows, a row filter is a union of _row terms, else a term set
_FULL_POSTINGS = 6  # a term's scores come from all its postings if df <= this * candidates (else restricted)


_thread_analyzers = threading.local()


def thread_analyzer(tokenizer: str) -> tantivy.TextAnalyzer:
    """This thread's analyzer of ``tokenizer``, built once a thread: building one (its stop words, its stemmer)
    took longer than analysing a query, and a search analyses every query. An analyzer is not shared between
    threads while it runs."""
    known: dict[str, tantivy.TextAnalyzer] | None = getattr(_thread_analyzers, "by_name", None)
    if known is None:
        known = _thread_analyzers.by_name = {}
    analyzer = known.get(tokenizer)
    if analyzer is None:
        analyzer = known[tokenizer] = make_analyzer(tokenizer)
    return analyzer


def make_analyzer(tokenizer: str) -> tantivy.TextAnalyzer:
    """The analyzer a tokenizer name stands for; the same object analyses documents and queries."""
    f = tantivy.Filter
    if tokenizer == "english":
        builder = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(f.remove_long(40))
            .filter(f.lowercase())
            .filter(f.stopword("english"))
            .filter(f.stemmer("english"))
        )
    elif tokenizer == "simple":
        builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(f.lowercase())
    elif tokenizer == "whitespace":
        builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).filter(f.lowercase())
    elif tokenizer == "raw":
        builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.raw())
    else:
        raise InvalidOptionError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    return builder.build()


def value_hash(value: str) -> int:
    """64 bits of BLAKE2b of the UTF-8 value: the exact-match key (collisions are resolved by the caller)."""
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def analyzer_name(tokenizer: str) -> str:
    """The name an index registers the tokenizer's analyzer under."""
    return f"sf_{tokenizer}"


def index_schema(tokenizer: str) -> tantivy.Schema:
    """The schema of every full-text index: its fields (module docstring) with the tokenizer's analyzer."""
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field(ROW_FIELD, indexed=True, fast=True)
    sb.add_text_field(TEXT_FIELD, stored=False, tokenizer_name=analyzer_name(tokenizer), index_option=INDEX_OPTION)
    sb.add_unsigned_field(HASH_FIELD, indexed=True)
    sb.add_unsigned_field(ID_FIELD, fast=True)  # last: the other fields keep the numbers they had before it
    return sb.build()


@dataclass(frozen=True)
class CorpusStats:
    """Table-wide BM25 statistics of one full-text column, summed over superfiles by the table."""

    num_docs: int  # N: rows counted by the caller (the table passes live rows: deleted ones are subtracted)
    total_tokens: int  # sum of analysed document lengths over all rows (avgdl = total_tokens / num_docs)
    doc_freq: Mapping[str, int]  # df per analysed term, summed over superfiles


@dataclass(frozen=True)
class FullTextBlob:
    """A built index: the blob, its distinct terms (sorted) and its statistics for the section directory."""

    blob: bytes
    terms: list[str]
    num_docs: int
    avg_len: float
    total_tokens: int  # exact sum of analysed lengths: the manifest sums it for the table-wide avgdl


@dataclass(frozen=True)
class Norms:
    """What exact BM25 needs besides tf: each row's fieldnorm id and the exact token total."""

    ids: np.ndarray  # uint8, one per row offset
    total_tokens: int

    def pack(self) -> bytes:
        return _NORMS_HEAD.pack(_NORMS_MAGIC, len(self.ids), self.total_tokens) + self.ids.tobytes()

    @classmethod
    def parse(cls, buf: memoryview) -> Norms:
        """Inverse of :meth:`pack` (zero-copy); raises ValueError on a malformed entry."""
        if len(buf) < _NORMS_HEAD.size:
            raise ValueError("norms entry too short")
        magic, rows, total = _NORMS_HEAD.unpack_from(buf, 0)
        if magic != _NORMS_MAGIC or len(buf) != _NORMS_HEAD.size + rows:
            raise ValueError("norms entry has a bad magic number or size")
        return cls(np.frombuffer(buf, np.uint8, rows, _NORMS_HEAD.size), total)

    @property
    def max_length(self) -> int:
        return int(FIELDNORMS[int(self.ids.max())]) if len(self.ids) else 0


def _decode_norms(directory: str, searcher: tantivy.Searcher) -> Norms:
    """Fieldnorm id per row and the exact token total, read from tantivy's files (see
    :func:`~superfile.format.tantivy_files.field_norms`). Segment documents map to rows through the ``_row``
    fast field. Raises ValueError if the files are not laid out as expected.
    """
    ids = np.zeros(searcher.num_docs, np.uint8)
    total = 0
    for ordinal, segment in enumerate(field_norms(directory, TEXT_FIELD)):
        total += segment.total_tokens
        docs = [tantivy.DocAddress(ordinal, d) for d in range(segment.max_doc)]
        rows = np.asarray(searcher.fast_field_values(ROW_FIELD, docs), np.int64)
        ids[rows] = np.frombuffer(segment.fieldnorms, np.uint8)
    return Norms(ids, total)


def _check_norms(index: FullTextIndex, norms: Norms) -> None:
    """Compare decoded norms with tantivy's own BM25 explanation of a few hits (dl and avgdl)."""
    quantised = int(FIELDNORMS[norms.ids.astype(np.int64)].sum())
    if len(norms.ids) != index.num_docs or quantised > norms.total_tokens:
        raise ValueError("row count or token total disagrees with the fieldnorms")
    avg = np.float32(norms.total_tokens) / np.float32(max(index.num_docs, 1))
    schema = index.schema
    for term, _ in index.searcher.terms_with_prefix(TEXT_FIELD, "", limit=4):
        query = tantivy.Query.term_query(schema, TEXT_FIELD, term)
        for _, addr in index.searcher.search(query, 2, count=False).hits:
            explained = _explanation_values(query.explain(index.searcher, addr).to_json())
            row = int(cast(list[int], index.searcher.fast_field_values(ROW_FIELD, [addr]))[0])
            dl, avgdl = explained.get("dl"), np.float32(explained.get("avgdl", math.nan))  # JSON: shortest float32
            if dl != FIELDNORMS[norms.ids[row]] or avgdl != avg:
                raise ValueError(f"row {row}: tantivy explains {explained}, the decoded norms disagree")


def _explanation_values(explanation_json: str) -> dict[str, float]:
    """The named leaves of a one-term BM25 explanation: freq, dl, avgdl (first word of each description)."""
    out: dict[str, float] = {}
    stack = [json.loads(explanation_json)]
    while stack:
        node = stack.pop()
        name = str(node.get("description", "")).split(",", 1)[0]
        if name in ("freq", "dl", "avgdl"):
            out[name] = float(node["value"])
        stack.extend(node.get("details", []))
    return out


def scoring_query(clauses: Sequence[tantivy.Query], required: bool) -> tantivy.Query:
    """The BM25 query of these clauses: their disjunction, or their conjunction if ``required``. A lone clause is
    the query itself: tantivy ranks a term alone by block-WAND, as a boolean of one clause it does not (0.27
    against 0.41 ms for a term in 30% of 250K rows), and it scores it the same either way."""
    if len(clauses) == 1:
        return clauses[0]
    occur = tantivy.Occur.Must if required else tantivy.Occur.Should
    return tantivy.Query.boolean_query([(occur, q) for q in clauses])


def build_fulltext(
    values: pa.Array | pa.ChunkedArray, ids: np.ndarray, tokenizer: str, *, work_dir: str | None = None
) -> FullTextBlob:
    """Index one text column; document i is row offset i, whose ``_id`` is ``ids[i]``. Uses one writer thread
    and one commit."""
    analyzer = make_analyzer(tokenizer)
    with scratch_dir("sf-fts-", work_dir) as tmp:  # a killed build's is removed by a later one
        index = tantivy.Index(index_schema(tokenizer), path=tmp)
        index.register_tokenizer(analyzer_name(tokenizer), analyzer)
        writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        dumps = json.dumps  # add_json measured a little faster than add_document (see docs/format.md)
        for row, (value, id_) in enumerate(zip(values.to_pylist(), ids.tolist(), strict=True)):
            if value is None:
                writer.add_json(dumps({ROW_FIELD: row, ID_FIELD: id_}))
            else:
                doc = {ROW_FIELD: row, ID_FIELD: id_, TEXT_FIELD: value, HASH_FIELD: value_hash(value)}
                writer.add_json(dumps(doc))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        fti = FullTextIndex(index, tokenizer)
        terms = sorted(t for t, _ in fti.searcher.terms_with_prefix(TEXT_FIELD, ""))
        try:
            norms = _decode_norms(tmp, fti.searcher)
            _check_norms(fti, norms)
        except (ValueError, KeyError, StopIteration, struct.error) as e:
            version = getattr(tantivy, "__version__", "tantivy")
            raise RuntimeError(f"{version}: its fieldnorms are not laid out as expected ({e})") from None
        files = []
        for name in live_files(tmp):
            with open(os.path.join(tmp, name), "rb") as fh:
                files.append((name, fh.read()))
        blob = archive.pack([*files, (_NORMS_FILE, norms.pack())])
        return FullTextBlob(blob, terms, fti.num_docs, fti.avg_len, norms.total_tokens)


class FullTextIndex:
    """One column's tantivy index: BM25 search, boolean match, exact match and term statistics.

    Queries take *analysed* terms (see :meth:`analyze`) so the table can compute
    global statistics over the same tokens every file sees. Thread-safe.
    """

    def __init__(
        self,
        index: tantivy.Index,
        tokenizer: str,
        *,
        norms: Norms | None = None,
        directory: str | None = None,
        searcher: tantivy.Searcher | None = None,
    ) -> None:
        """``norms`` (from the blob) or ``directory`` (where the index's files are, to decode them on
        first use) enable :meth:`candidates` and an exact :attr:`total_tokens`. ``searcher``: the one to
        search (default: the index's current one)."""
        self.index = index
        self.schema = index.schema  # tantivy's getter copies it with the interpreter lock let go: once, not a query
        self.tokenizer = tokenizer
        self._lock = threading.Lock()  # guards the length cache
        index.register_tokenizer(analyzer_name(tokenizer), make_analyzer(tokenizer))
        self.searcher = index.searcher() if searcher is None else searcher
        self.num_docs: int = self.searcher.num_docs
        self._avg_len: float | None = None
        self._norms = norms
        self._directory = directory
        self._length_cache: dict[tuple[int, int], _Lengths] = {}
        self._own_norm: np.ndarray | None = None
        if norms is not None and len(norms.ids) != self.num_docs:
            raise ValueError(f"norms cover {len(norms.ids)} rows, the index has {self.num_docs}")

    @property
    def directory(self) -> str | None:
        """Where the index's files are (None for an index not opened from a directory)."""
        return self._directory

    @classmethod
    def from_blob(cls, blob: memoryview, path: str, tokenizer: str, *, source: str) -> FullTextIndex:
        """Open a packed index, extracting it to ``path`` first unless a complete copy is there.

        ``source`` names the file in errors.
        """
        files = archive.extract(blob, path, source, skip=(_NORMS_FILE,))
        norms = None
        try:
            for name, start, size in files:
                if name == _NORMS_FILE:
                    norms = Norms.parse(blob[start : start + size])
            try:
                index = tantivy.Index.open(path)
            except (ValueError, OSError):
                if os.path.isdir(path):
                    raise
                # removed since the check above (a released superfile's, archive.remove_later): once more
                archive.extract(blob, path, source, skip=(_NORMS_FILE,))
                index = tantivy.Index.open(path)
            return cls(index, tokenizer, norms=norms, directory=path)
        except (ValueError, OSError) as e:
            raise CorruptSuperfileError(source, f"full-text index at {path} does not open: {e}") from None

    def analyze(self, text: str) -> list[str]:
        """The column's tokenizer applied to ``text``: the tokens a query must use."""
        return thread_analyzer(self.tokenizer).analyze(text)

    def doc_freq(self, term: str) -> int:
        """Number of rows containing the analysed ``term``."""
        return self.searcher.doc_freq(TEXT_FIELD, term)

    @property
    def avg_len(self) -> float:
        """Average analysed length over all rows (nulls count as 0): BM25's avgdl, as tantivy computes it.

        Tantivy does not expose it directly, so it is read from the explanation
        of one hit of the most frequent term; 0.0 for an index without terms.
        """
        if self._avg_len is None:
            self._avg_len = self._read_avg_len()
        return self._avg_len

    @property
    def total_tokens(self) -> int:
        """Sum of analysed lengths over all rows: exact (from the norms), else from :attr:`avg_len`."""
        if self._norms is None and self._directory is None:
            return round(self.avg_len * self.num_docs)
        return self._norm_data().total_tokens

    @property
    def fieldnorm_ids(self) -> np.ndarray:
        """Every row's tantivy fieldnorm id (uint8; :data:`FIELDNORMS` maps it to the BM25 length)."""
        return self._norm_data().ids

    def length_factors(self, n_glob: int, tokens_glob: int) -> _Lengths:
        """BM25's length factors of this file's rows with its own avgdl and with a corpus of ``n_glob`` rows
        and ``tokens_glob`` tokens (the last few corpora are kept)."""
        key = (n_glob, tokens_glob)
        found = self._length_cache.get(key)
        if found is None:
            found = _Lengths.make(self.num_docs, self._norm_data(), n_glob, tokens_glob)
            with self._lock:
                if len(self._length_cache) >= 8:  # a table has one corpus per version: a few suffice
                    self._length_cache.pop(next(iter(self._length_cache)))
                self._length_cache[key] = found
        return found

    def _norm_data(self) -> Norms:
        if self._norms is None:
            if self._directory is None:
                raise RuntimeError("this FullTextIndex was opened without its norms (use from_blob)")
            self._norms = _decode_norms(self._directory, self.searcher)  # blobs written before norms existed
        return self._norms

    def _read_avg_len(self) -> float:
        top = self.searcher.terms_with_prefix(TEXT_FIELD, "", limit=1)
        if not top:
            return 0.0
        query = tantivy.Query.term_query(self.schema, TEXT_FIELD, top[0][0])
        hits = self.searcher.search(query, 1, count=False).hits
        stack = [json.loads(query.explain(self.searcher, hits[0][1]).to_json())]
        while stack:
            node = stack.pop()
            if str(node.get("description", "")).startswith("avgdl"):
                return float(node["value"])
            stack.extend(node.get("details", []))
        raise RuntimeError("tantivy's BM25 explanation no longer reports avgdl")

    def prefix_terms(self, prefix: str, limit: int | None = None) -> list[str]:
        """Indexed terms starting with the analysed ``prefix``, most frequent first (ties: term order)."""
        found = self.searcher.terms_with_prefix(TEXT_FIELD, prefix, limit=limit)
        return [t for t, _ in sorted(found, key=lambda tf: (-tf[1], tf[0]))]

    def search(
        self,
        terms: Sequence[str],
        k: int,
        *,
        mode: str = "any",
        weights: Mapping[str, float] | None = None,
        allow: pyroaring.AbstractBitMap | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-``k`` over analysed terms: (row offsets int64, scores float32), best first.

        ``mode`` "any" (or "or") ranks rows with at least one term, "all" (or
        "and") only rows with every term. ``weights`` multiply a term's
        contribution (default 1). ``allow`` restricts results to those row
        offsets and still returns the true top-k among them: a small allow-list
        becomes a term-set filter inside the query; otherwise the unfiltered
        ranking is read in growing prefixes until k allowed rows are found.
        Duplicate terms count once.
        """
        required = _mode(mode)
        uniq = list(dict.fromkeys(terms))
        empty = (np.empty(0, np.int64), np.empty(0, np.float32))
        if k <= 0 or not uniq:
            return empty
        query = self._scoring_query(uniq, required, weights or {})
        if allow is None:
            return self._top(query, k)
        n_allow = allow.range_cardinality(0, self.num_docs) if self.num_docs else 0
        if n_allow == 0:
            return empty
        if n_allow == self.num_docs:
            return self._top(query, k)
        if n_allow <= _SMALL_ALLOW:
            members = [r for r in allow.to_array().tolist() if r < self.num_docs]
            member_query = tantivy.Query.term_set_query(self.schema, ROW_FIELD, members)
            filtered = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, query),
                    (tantivy.Occur.Must, tantivy.Query.const_score_query(member_query, 0.0)),
                ]
            )
            return self._top(filtered, k)
        limit = k * max(2, math.ceil(2 * self.num_docs / n_allow))
        while True:
            rows, scores = self._top(query, limit)
            keep = np.fromiter((r in allow for r in rows.tolist()), bool, len(rows))
            if keep.sum() >= k or len(rows) < limit:
                return rows[keep][:k], scores[keep][:k]
            limit *= 4

    def candidates(
        self,
        terms: Sequence[str],
        k: int,
        stats: CorpusStats,
        *,
        mode: str = "any",
        allow: pyroaring.AbstractBitMap | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> Candidates | None:
        """This file's first BM25 candidates for a table-wide top-``k``, with bounds on their table-wide scores
        (None when no row of the file can score). :func:`global_top_k` merges the candidates of many files.

        How: tantivy ranks candidates with idf-corrected boosts (its own avgdl);
        a candidate's tf per term is later recovered by inverting tantivy's
        score of that term alone, and its exact score computed from tf, the
        stored fieldnorm and the global statistics, only for candidates that
        can still make the top-k. A local score bounds the global one given dl
        (see :meth:`_Lengths.ratio`). See docs/format.md.
        """
        required = _mode(mode)
        uniq = list(dict.fromkeys(terms))
        if k <= 0 or not uniq or self.num_docs == 0:
            return None
        plan = _GlobalPlan.make(self, uniq, required, stats, weights or {})
        if plan is None:
            return None
        query, keep, limit = plan.query, None, k + _FIRST_EXTRA
        if allow is not None:
            n_allow = allow.range_cardinality(0, self.num_docs)
            if n_allow == 0:
                return None
            if n_allow < self.num_docs and n_allow <= _SMALL_ALLOW:
                members = [r for r in allow.to_array().tolist() if r < self.num_docs]
                query = tantivy.Query.boolean_query(
                    [
                        (tantivy.Occur.Must, query),
                        (tantivy.Occur.Must, tantivy.Query.const_score_query(self.row_filter(members), 0.0)),
                    ]
                )
            elif n_allow < self.num_docs:
                keep = allow
                limit = max(limit, math.ceil(limit * self.num_docs / n_allow))
        found = Candidates(plan, query, keep, limit)
        found.read()
        return found

    # What the table-wide BM25 (Candidates, _GlobalPlan) reads of one file: hits of a tantivy query, a filter to
    # given rows, one term's scores, a term's frequency in one doc, and length_factors above.

    def hits(self, query: tantivy.Query, limit: int) -> tuple[np.ndarray, np.ndarray, list[tantivy.DocAddress]]:
        """The first ``limit`` hits as (row offsets, float64 scores, doc addresses)."""
        hits = self.searcher.search(query, limit, count=False).hits if limit > 0 else []
        docs = [a for _, a in hits]
        return self.rows_of(docs), np.asarray([s for s, _ in hits], np.float64), docs

    def rows_of(self, docs: list[tantivy.DocAddress]) -> np.ndarray:
        """The row numbers of these docs (int64): their row offsets in the superfile."""
        return np.asarray(self.searcher.fast_field_values(ROW_FIELD, docs) if docs else [], np.int64)

    def row_filter(self, rows: Sequence[int]) -> tantivy.Query:
        """A query matching exactly these row offsets (a union of ``_row`` terms for few rows: a term set
        query scans the whole ``_row`` fast field, ~15 ns per row of the file)."""
        if len(rows) > _ROW_DISJUNCTION:
            return tantivy.Query.term_set_query(self.schema, ROW_FIELD, list(rows))
        schema = self.schema
        return tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, ROW_FIELD, r)) for r in rows]
        )

    def term_scores(
        self, term: str, doc_freq: int, docs: list[tantivy.DocAddress], only: Callable[[], tantivy.Query]
    ) -> np.ndarray:
        """Tantivy's score of ``term`` alone (its own statistics, no boost) for each doc; 0 without the term.

        Reads all the term's postings when that is cheaper than a query restricted to the docs by ``only()``.
        """
        if self.reads_postings(doc_freq, len(docs)):
            return self.posting_scores(term, doc_freq, docs)
        query = tantivy.Query.term_query(self.schema, TEXT_FIELD, term)
        restricted = tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, only())])
        return _scores_of(self.searcher.search(restricted, len(docs), count=False).hits, docs)

    @staticmethod
    def reads_postings(doc_freq: int, docs: int) -> bool:
        """Whether reading all of a term's postings is cheaper than a query restricted to ``docs`` rows."""
        return doc_freq <= _FULL_POSTINGS * docs

    def posting_scores(self, term: str, doc_freq: int, docs: list[tantivy.DocAddress]) -> np.ndarray:
        """:meth:`term_scores` from all the term's ``doc_freq`` postings."""
        query = tantivy.Query.term_query(self.schema, TEXT_FIELD, term)
        return _scores_of(self.searcher.search(query, doc_freq, count=False).hits, docs)

    def explained_tf(self, term: str, doc: tantivy.DocAddress) -> int:
        """The term's frequency in one doc from tantivy's explanation (slow; for ambiguous inversions)."""
        query = tantivy.Query.term_query(self.schema, TEXT_FIELD, term)
        return round(_explanation_values(query.explain(self.searcher, doc).to_json())["freq"])

    def term_scorer(self, rows: np.ndarray, docs: list[tantivy.DocAddress]) -> Callable[[str, int], np.ndarray]:
        """``(term, doc_freq) ->`` :meth:`term_scores` of these docs (``rows``: their row numbers), the row filter
        built once for all terms."""
        cached: list[tantivy.Query] = []

        def only() -> tantivy.Query:  # built once, only if some term needs a restricted query
            if not cached:
                cached.append(tantivy.Query.const_score_query(self.row_filter(rows.tolist()), 0.0))
            return cached[0]

        return lambda term, doc_freq: self.term_scores(term, doc_freq, docs, only)

    @property
    def own_norm(self) -> np.ndarray:
        """BM25's length factor k1 * (1 - b + b * dl / avgdl) per fieldnorm id with this index's own avgdl
        (tantivy's, up to float32 rounding)."""
        if self._own_norm is None:
            self._own_norm = _length_norm(self.num_docs, self._norm_data().total_tokens)
        return self._own_norm

    def match(self, terms: Sequence[str], mode: str = "and") -> pyroaring.BitMap:
        """Every row offset containing all (mode "and"/"all") or any ("or"/"any") analysed terms, unranked.

        No terms match nothing.
        """
        required = _mode(mode)
        uniq = list(dict.fromkeys(terms))
        if not uniq:
            return pyroaring.BitMap()
        freqs = [self.doc_freq(t) for t in uniq]
        bound = min(freqs) if required else min(sum(freqs), self.num_docs)
        if bound == 0:
            return pyroaring.BitMap()
        schema = self.schema
        if required:
            inner = tantivy.Query.boolean_query(
                [(tantivy.Occur.Must, tantivy.Query.term_query(schema, TEXT_FIELD, t)) for t in uniq]
            )
        else:
            inner = tantivy.Query.term_set_query(schema, TEXT_FIELD, uniq)
        return self._all_rows(tantivy.Query.const_score_query(inner, 1.0), bound)

    def match_exact(self, value: str) -> pyroaring.BitMap:
        """Candidate rows whose value may equal ``value`` (same 64-bit hash); the caller compares the text.

        Nulls never match.
        """
        h = value_hash(value)
        bound = self.searcher.doc_freq(HASH_FIELD, h)
        if bound == 0:
            return pyroaring.BitMap()
        return self._all_rows(tantivy.Query.term_query(self.schema, HASH_FIELD, h), bound)

    def _scoring_query(self, terms: list[str], required: bool, weights: Mapping[str, float]) -> tantivy.Query:
        clauses = []
        for t in terms:
            q = tantivy.Query.term_query(self.schema, TEXT_FIELD, t)
            w = weights.get(t, 1.0)
            if not (math.isfinite(w) and w >= 0):
                raise InvalidOptionError(f"term weight must be a finite number >= 0, got {w!r} for {t!r}")
            clauses.append(q if w == 1.0 else tantivy.Query.boost_query(q, w))
        return scoring_query(clauses, required)

    def _top(self, query: tantivy.Query, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``limit`` hits (tantivy preallocates for ``limit``, so it is capped at num_docs)."""
        limit = min(limit, self.num_docs)
        hits = self.searcher.search(query, limit, count=False).hits if limit > 0 else []
        if not hits:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        rows = self.searcher.fast_field_values(ROW_FIELD, [a for _, a in hits])
        return np.asarray(rows, np.int64), np.asarray([s for s, _ in hits], np.float32)

    def _all_rows(self, query: tantivy.Query, bound: int) -> pyroaring.BitMap:
        """Row offsets of every hit of ``query``, which has at most ``bound`` hits."""
        hits = self.searcher.search(query, bound, count=False).hits
        rows = self.searcher.fast_field_values(ROW_FIELD, [a for _, a in hits])
        return pyroaring.BitMap(array.array("I", cast(list[int], rows)))


class Candidates:
    """The candidates one file has read so far for a table-wide BM25 top-k: row offsets, tantivy's local
    scores, and bounds on their exact table-wide scores (exact once computed). Rows not read yet score at
    most ``unseen``."""

    def __init__(self, plan: _GlobalPlan, query: tantivy.Query, keep: pyroaring.AbstractBitMap | None, limit: int):
        self.plan, self.query, self.keep, self.limit = plan, query, keep, limit
        self.known: dict[int, float] = {}  # row -> exact score, kept across reads
        self.rows = np.empty(0, np.int64)
        self.low = self.high = np.empty(0, np.float64)
        self.unseen = -math.inf
        self._local = np.empty(0, np.float64)
        self._docs: list[tantivy.DocAddress] = []

    def read(self) -> None:
        """(Re)read the first ``limit`` hits and bound their scores and the rest's."""
        index = self.plan.index
        self.limit = min(self.limit, index.num_docs)
        rows, local, docs = index.hits(self.query, self.limit)
        exhausted = len(rows) < self.limit or self.limit == index.num_docs
        self.unseen = -math.inf if exhausted else self.plan.unseen_bound(float(local[-1]))
        if self.keep is not None:
            mask = np.fromiter((r in self.keep for r in rows.tolist()), bool, len(rows))
            rows, local, docs = rows[mask], local[mask], [d for d, m in zip(docs, mask, strict=True) if m]
        self.rows, self._local, self._docs = rows, local, docs
        self.low, self.high = self.plan.bounds(rows, local)
        if self.known:
            exact = np.fromiter((self.known.get(r, math.nan) for r in rows.tolist()), np.float64, len(rows))
            have = ~np.isnan(exact)
            self.low[have] = self.high[have] = exact[have]

    def deepen(self) -> None:
        """Read four times as many hits."""
        self.limit *= 4
        self.read()

    def settle(self, threshold: float) -> None:
        """Exact scores for every candidate whose bound reaches ``threshold`` (the table's k-th lower bound)."""
        todo = np.flatnonzero((self.high >= threshold) & (self.low != self.high))
        if len(todo):
            exact = self.plan.exact(self.rows[todo], self._local[todo], [self._docs[i] for i in todo.tolist()])
            self.known.update(zip(self.rows[todo].tolist(), exact.tolist(), strict=True))
            self.low[todo] = self.high[todo] = exact


def _kth_low(found: Sequence[Candidates], k: int) -> float:
    lows = np.concatenate([c.low for c in found]) if found else np.empty(0)
    return float(np.partition(lows, len(lows) - k)[len(lows) - k]) if len(lows) >= k else -math.inf


def global_top_k(found: Sequence[Candidates], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The table-wide exact top-``k`` over several files' candidates: per file, (row offsets, exact scores) of
    its rows that can be in it (the caller ranks them: best first, ties by row; at most ``k`` of them all are).

    score(d) = sum over terms t in d of w_t * idf(t) * (k1 + 1) * tf / (tf + k1 * (1 - b + b * dl / avgdl))
    with idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)), N, df and avgdl =
    total_tokens / N from the candidates' ``stats``, dl the row's length as
    tantivy quantises it (:data:`~superfile.format.tantivy_files.FIELDNORMS`),
    k1 = 1.2, b = 0.75, w_t = ``weights`` (default 1; 0 in mode "all" keeps the
    term as a filter). Computed in tantivy's float32 arithmetic (:func:`scores32`)
    from per-row quantities only, so a row scores the same however the table is
    split into files, and as tantivy scores it over the whole table; rows scoring
    0 are not returned. One file's exact top-k is this over its candidates alone.

    Files whose unread rows could still beat the k-th best lower bound read deeper; then exact scores are
    computed only for candidates whose upper bound reaches it. A file none of whose candidates can make the
    table's top-k computes no exact score at all: that is the cost of a search over many files.
    """
    while True:
        threshold = _kth_low(found, k)
        deeper = [c for c in found if c.unseen > -math.inf and c.unseen >= threshold]  # -inf: read to the end
        if not deeper:
            break
        for c in deeper:
            c.deepen()
    for c in found:
        if len(c.rows) and float(c.high.max()) >= threshold:
            c.settle(threshold)
    threshold = _kth_low(found, k)  # exact scores only raise lower bounds: fewer rows remain in contention
    out = []
    for c in found:
        pick = np.flatnonzero((c.high >= threshold) & (c.low > 0))
        out.append((c.rows[pick], c.low[pick].astype(np.float32)))
    return out


@dataclass(frozen=True)
class _Lengths:
    """BM25's length factor k1 * (1 - b + b * dl / avgdl) per fieldnorm id, with the file's avgdl and with the
    corpus avgdl; the file keeps them for the last few corpora."""

    local_norm: np.ndarray  # with the file's avgdl (tantivy's, up to float32 rounding)
    global_norm: np.ndarray  # with the corpus avgdl
    global_norm32: np.ndarray  # the same, as tantivy computes it (exact scores)
    present: np.ndarray  # the fieldnorm ids that occur in the file

    @classmethod
    def make(cls, num_docs: int, norms: Norms, n_glob: int, tokens_glob: int) -> _Lengths:
        local_norm = _length_norm(num_docs, norms.total_tokens)
        global_norm = _length_norm(n_glob, tokens_glob)
        present = np.flatnonzero(np.bincount(norms.ids, minlength=256))
        return cls(local_norm, global_norm, length_norm32(n_glob, tokens_glob), present)

    def ratio(self, ids: np.ndarray, local: np.ndarray, total_weight: float) -> np.ndarray:
        """An extreme of global / local score for rows with these fieldnorm ids and local scores.

        Per term, x = tf / (tf + K_local) and the global part is h(x) = x K_local
        / (x (K_local - K_global) + K_global): concave if K_local > K_global (the
        file's avgdl is the smaller), convex otherwise, with h(0) = 0, h(1) = 1.
        Every present term has x >= x0 = 1 / (1 + K_local) (tf >= 1). With
        weights w_t (sum W over the query's terms) and local score S = sum w_t
        x_t, Jensen's inequality and x_t >= x0 give, for the concave case,
        global <= W' h(S / W') with W' = min(W, S / x0), and global >= S; the
        convex case mirrors it (global in [W' h(S / W'), S]). Returns h(x) / x
        at x = S / W': the upper bound of the ratio if >= 1, else the lower one.
        """
        k_local, k_global = self.local_norm[ids], self.global_norm[ids]
        x = np.clip(local / total_weight, 1 / (1 + k_local), 1.0)
        return np.asarray(k_local / (x * (k_local - k_global) + k_global), np.float64)


def _scores_of(hits: list[tuple[float, tantivy.DocAddress]], docs: list[tantivy.DocAddress]) -> np.ndarray:
    """Each doc's score among ``hits`` (0 where it is not one)."""
    where = {(d.segment_ord, d.doc): i for i, d in enumerate(docs)}
    out = np.zeros(len(docs), np.float64)
    for score, d in hits:
        i = where.get((d.segment_ord, d.doc))
        if i is not None:
            out[i] = score
    return out


def _length_norm(num_docs: int, total_tokens: int) -> np.ndarray:
    """k1 * (1 - b + b * dl / avgdl) for every fieldnorm id's dl, avgdl = total_tokens / num_docs."""
    return np.asarray(K1 * (1 - B + B * FIELDNORMS.astype(np.float64) * num_docs / total_tokens), np.float64)


@dataclass
class _GlobalPlan:
    """One :meth:`FullTextIndex.candidates` call: the candidate query and the exact rescoring."""

    index: FullTextIndex
    ids: np.ndarray  # the file's fieldnorm id per row
    lengths: _Lengths
    terms: list[str]  # scored terms present in this file (weight > 0)
    doc_freqs: list[int]  # local df of each
    boosts: np.ndarray  # weight * global idf / local idf: tantivy's candidate ranking then uses global idf
    global_weights: np.ndarray  # weight * global idf * (k1 + 1) per term
    weights32: np.ndarray  # the same as tantivy computes it (float32): the exact scores' weights
    local_weights: np.ndarray  # local idf * (k1 + 1) per term: tantivy's unboosted term weight
    query: tantivy.Query

    @classmethod
    def make(
        cls,
        index: FullTextIndex,
        terms: list[str],
        required: bool,
        stats: CorpusStats,
        weights: Mapping[str, float],
    ) -> _GlobalPlan | None:
        """None when nothing can match in this file."""
        ids = index.fieldnorm_ids  # raises here for an index opened without its norms
        n_glob, tokens_glob = int(stats.num_docs), int(stats.total_tokens)
        # The corpus may count fewer rows than this file holds: the table leaves deleted rows out (and
        # filters them with ``allow``), so only the counts' own consistency is checked.
        if n_glob < 0 or tokens_glob < 0:
            raise InvalidOptionError(f"corpus statistics (N={n_glob}, tokens={tokens_glob}) must be >= 0")
        if n_glob == 0 or tokens_glob == 0:
            return None  # no counted row holds a term
        schema = index.schema
        scored, freqs, boosts, gw, gw32, lw, clauses = [], [], [], [], [], [], []
        for t in terms:
            w = weights.get(t, 1.0)
            if not (math.isfinite(w) and w >= 0):
                raise InvalidOptionError(f"term weight must be a finite number >= 0, got {w!r} for {t!r}")
            df = index.doc_freq(t)
            if df == 0:
                if required:
                    return None
                continue
            q = tantivy.Query.term_query(schema, TEXT_FIELD, t)
            if w == 0:
                if required:
                    clauses.append(tantivy.Query.const_score_query(q, 0.0))
                continue
            df_glob = corpus_df(stats, t, n_glob)
            if df_glob == 0:  # only rows the corpus does not count (deleted ones) hold the term
                if required:
                    return None
                continue
            idf_glob, idf_local = idf(n_glob, df_glob), idf(index.num_docs, df)
            scored.append(t)
            freqs.append(df)
            boosts.append(w * idf_glob / idf_local)
            gw.append(w * idf_glob * (K1 + 1))
            gw32.append(weight32(n_glob, df_glob) * _F32(w))
            lw.append(idf_local * (K1 + 1))
            clauses.append(tantivy.Query.boost_query(q, boosts[-1]))
        if not scored:
            return None
        return cls(
            index=index,
            ids=ids,
            lengths=index.length_factors(n_glob, tokens_glob),
            terms=scored,
            doc_freqs=freqs,
            boosts=np.asarray(boosts, np.float64),
            global_weights=np.asarray(gw, np.float64),
            weights32=np.asarray(gw32, np.float32),
            local_weights=np.asarray(lw, np.float64),
            query=scoring_query(clauses, required),
        )

    def unseen_bound(self, local: float) -> float:
        """Upper bound of the global score of any row whose local score is at most ``local``."""
        ratio = self.lengths.ratio(self.lengths.present, np.full(len(self.lengths.present), local), self.weight)
        return max(1.0, float(ratio.max())) * local * (1 + _SLACK)

    @property
    def weight(self) -> float:
        return float(self.global_weights.sum())

    def bounds(self, rows: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds of the exact global scores of rows with these local (tantivy) scores."""
        ratio = self.lengths.ratio(self.ids[rows], local, self.weight)
        return np.minimum(1.0, ratio) * local * (1 - _SLACK), np.maximum(1.0, ratio) * local * (1 + _SLACK)

    def exact(self, rows: np.ndarray, local: np.ndarray, docs: list[tantivy.DocAddress]) -> np.ndarray:
        """Exact global scores of these rows from each term's tf, recovered from tantivy's scores.

        One term query per term restricted to the rows, except for the term
        with the largest df: its score is the candidate score minus the others'.
        """
        n_terms = len(self.terms)
        skip = int(np.argmax(self.doc_freqs))
        observed = np.zeros((n_terms, len(rows)), np.float64)
        error = np.zeros((n_terms, len(rows)), np.float64)  # bound on the absolute error of observed
        scores_of = self.index.term_scorer(rows, docs)
        for j, term in enumerate(self.terms):
            if j != skip:
                observed[j] = scores_of(term, self.doc_freqs[j])
                error[j] = observed[j] * ROUNDING
        rest = local - self.boosts @ observed  # the skipped term's row of observed is still 0
        observed[skip] = np.maximum(rest, 0.0) / self.boosts[skip]
        error[skip] = (n_terms + 1) * ROUNDING * local / self.boosts[skip]
        ids = self.ids[rows]
        tf = invert_tf(observed, self.local_weights[:, None], self.lengths.local_norm[ids][None, :], error)
        for j, i in zip(*np.nonzero(tf < 0), strict=True):  # float32 cannot tell tf apart (tf in the hundreds)
            tf[j, i] = self.index.explained_tf(self.terms[j], docs[i])
        return scores32(self.weights32, tf, self.lengths.global_norm32[ids]).astype(np.float64)


def idf(n: int, df: int) -> float:
    """BM25's inverse document frequency (tantivy's, Lucene's): of a term in ``df`` of ``n`` documents."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


# Tantivy's BM25 arithmetic, bit for bit. Every exact score is computed with it: float32 operations in
# tantivy's order, terms summed in query order, and the C library's logf, which Rust's f32::ln calls (numpy's
# float32 log differs in the last bit for ~4% of inputs). A row then scores the same, to the bit, whether
# tantivy ranked it over the whole table (the union), rescoring recomputed it, or a leaf's padded union
# scored it (``fulltext_pads``): copies of a text tie wherever they are, and ties break by ``_id``.
_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_logf = _libm.logf
_logf.restype = ctypes.c_float
_logf.argtypes = [ctypes.c_float]
_F32 = np.float32
_WEIGHT = _F32(K1) + _F32(1.0)  # a term's weight is its idf times this


def _idfs32(num_docs: np.ndarray, doc_freq: int) -> np.ndarray:
    """Tantivy's idf of one df at several document counts: ``ln(1 + ((N - n) + 0.5) / (n + 0.5))`` with N - n
    and n converted to float32, the log by ``logf`` one value at a time."""
    x = ((num_docs - doc_freq).astype(np.float32) + _F32(0.5)) / (_F32(doc_freq) + _F32(0.5))
    return np.fromiter((_logf(v) for v in (_F32(1.0) + x).tolist()), np.float32, len(x))


def idf32(num_docs: int, doc_freq: int) -> np.float32:
    """Tantivy's idf of a term in ``doc_freq`` of ``num_docs`` documents."""
    return _idfs32(np.asarray([num_docs], np.int64), doc_freq)[0]


def weight32(num_docs: int, doc_freq: int) -> np.float32:
    """Tantivy's BM25 weight of a term, ``idf * (K1 + 1)``."""
    return idf32(num_docs, doc_freq) * _WEIGHT


def weights32(num_docs: np.ndarray, doc_freq: int) -> np.ndarray:
    """:func:`weight32` of one df at several document counts (float32 array)."""
    return _idfs32(num_docs, doc_freq) * _WEIGHT


def avgdl32(num_docs: int, total_tokens: int) -> np.float32:
    """Tantivy's average length: the u64 totals converted to float32, then divided."""
    return _F32(total_tokens) / _F32(num_docs)


def length_norm32(num_docs: int, total_tokens: int) -> np.ndarray:
    """Tantivy's ``K1 * (1 - B + B * dl / avgdl)`` for every fieldnorm id (float32)."""
    dl = FIELDNORMS.astype(np.float32)
    return _F32(K1) * (_F32(1.0) - _F32(B) + _F32(B) * dl / avgdl32(num_docs, total_tokens))


def scores32(weights: np.ndarray, tf: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """Tantivy's scores of rows: ``weights[t] * (tf / (tf + norm))`` per term (float32, rows of ``tf``),
    summed in term order (float32)."""
    total = np.zeros(tf.shape[1], np.float32)
    tf = tf.astype(np.float32)
    for j in range(tf.shape[0]):
        total = total + _F32(weights[j]) * (tf[j] / (tf[j] + norm))
    return total


def corpus_df(stats: CorpusStats, term: str, n: int) -> int:
    """The table-wide document frequency of ``term``, checked against the corpus size ``n``."""
    df = stats.doc_freq.get(term)
    if df is None or not 0 <= df <= n:
        raise InvalidOptionError(f"corpus doc_freq of {term!r} is {df}: it must be between 0 and N ({n})")
    return df


def invert_tf(score: np.ndarray, weight: np.ndarray, norm: np.ndarray, error: np.ndarray) -> np.ndarray:
    """Term frequencies from one-term scores ``weight * tf / (tf + norm)`` known within +-``error``.

    tf = s * norm / (weight - s), rounded; -1 where the error could reach
    another integer (d tf / d s = norm * weight / (weight - s)^2 grows like
    tf^2, so float32 scores stop telling tf apart in the hundreds).
    """
    gap = np.maximum(weight - score, 1e-300)
    raw = score * norm / gap
    tf = np.rint(raw)
    spread = error * norm * weight / gap**2
    tf[(np.abs(raw - tf) + spread >= 0.45) | (score >= weight)] = -1
    return tf


def _mode(mode: str) -> bool:
    try:
        return _MODES[mode]
    except KeyError:
        raise InvalidOptionError(f"mode must be one of {sorted(_MODES)}, got {mode!r}") from None
