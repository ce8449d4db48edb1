"""Full-text index blobs: one tantivy index per text column, packed into one blob of a superfile.

Tantivy only opens indexes from a directory, so a blob is a tiny archive of the
index files. Readers extract it once into a cache directory (atomically: temp
dir + rename, so concurrent threads and processes never see half an index) and
reuse the extraction afterwards.

Inside each index (one per column) there are three fields:

- ``_row``: u64, indexed + fast. The row offset in the Parquet part. Hits are
  mapped to rows through it, never through segment order.
- ``text``: the column's text, analysed by the column's tokenizer, indexed
  with term frequencies (BM25) but no positions, not stored (Parquet is the store).
- ``_h_text``: u64, indexed. 64 bits of BLAKE2b of the raw UTF-8 value, so an
  exact-value lookup is one term lookup whose cost is proportional to its matches.

Null values add a document with ``_row`` only: no terms, no hash.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyroaring
import tantivy

from superfile.errors import CorruptSuperfileError, InvalidOptionError

__all__ = [
    "TOKENIZERS",
    "CorpusStats",
    "FullTextBlob",
    "FullTextIndex",
    "build_fulltext",
    "make_analyzer",
    "value_hash",
]

TOKENIZERS = ("english", "simple", "raw", "whitespace")

ROW_FIELD = "_row"
TEXT_FIELD = "text"
HASH_FIELD = "_h_text"
INDEX_OPTION = "freq"  # BM25 needs term frequencies and field norms; no phrase queries, so no positions
_WRITER_HEAP = 128_000_000  # per superfile build; above it tantivy flushes another segment (still correct)
_PACK_MAGIC = b"SFTANTV1"
_PACK_HEAD = struct.Struct("<8sI")
_PACK_ENTRY = struct.Struct("<HQ")
_SMALL_ALLOW = 16_384  # allow-lists up to this size are pushed into the query as a term set
_MODES = {"any": False, "or": False, "all": True, "and": True}  # value: every term required


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


def _analyzer_name(tokenizer: str) -> str:
    return f"sf_{tokenizer}"


def _schema(tokenizer: str) -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field(ROW_FIELD, indexed=True, fast=True)
    sb.add_text_field(TEXT_FIELD, stored=False, tokenizer_name=_analyzer_name(tokenizer), index_option=INDEX_OPTION)
    sb.add_unsigned_field(HASH_FIELD, indexed=True)
    return sb.build()


@dataclass(frozen=True)
class CorpusStats:
    """Table-wide BM25 statistics of one full-text column, summed over superfiles by the table."""

    num_docs: int  # N: rows of all superfiles (deleted rows included, as in Lucene until merge)
    total_tokens: int  # sum of analysed document lengths over all rows (avgdl = total_tokens / num_docs)
    doc_freq: Mapping[str, int]  # df per analysed term, summed over superfiles


@dataclass(frozen=True)
class FullTextBlob:
    """A built index: the blob, its distinct terms (sorted) and its statistics for the section directory."""

    blob: bytes
    terms: list[str]
    num_docs: int
    avg_len: float


def build_fulltext(values: pa.Array | pa.ChunkedArray, tokenizer: str, *, work_dir: str | None = None) -> FullTextBlob:
    """Index one text column; document i is row offset i. Uses one writer thread and one commit."""
    analyzer = make_analyzer(tokenizer)
    tmp = tempfile.mkdtemp(prefix="sf-fts-", dir=work_dir)
    try:
        index = tantivy.Index(_schema(tokenizer), path=tmp)
        index.register_tokenizer(_analyzer_name(tokenizer), analyzer)
        writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        dumps = json.dumps  # add_json measured a little faster than add_document (see docs/format.md)
        for row, value in enumerate(values.to_pylist()):
            if value is None:
                writer.add_json(dumps({ROW_FIELD: row}))
            else:
                writer.add_json(dumps({ROW_FIELD: row, TEXT_FIELD: value, HASH_FIELD: value_hash(value)}))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        fti = FullTextIndex(index, tokenizer)
        terms = sorted(t for t, _ in fti.searcher.terms_with_prefix(TEXT_FIELD, ""))
        return FullTextBlob(_pack(tmp), terms, fti.num_docs, fti.avg_len)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pack(directory: str) -> bytes:
    """The live files of a committed index (meta.json + its segments' files) as one archive blob.

    Layout (little-endian): magic ``SFTANTV1``, u32 file count, then per file
    u16 name length, name (UTF-8), u64 size; then the file contents in that order.
    """
    with open(os.path.join(directory, "meta.json"), "rb") as fh:
        meta = json.load(fh)
    live = {s["segment_id"].replace("-", "") for s in meta["segments"]}
    names = sorted(n for n in os.listdir(directory) if n == "meta.json" or n.split(".", 1)[0] in live)
    contents = []
    for n in names:
        with open(os.path.join(directory, n), "rb") as fh:
            contents.append(fh.read())
    head = [_PACK_HEAD.pack(_PACK_MAGIC, len(names))]
    for n, c in zip(names, contents, strict=True):
        raw = n.encode()
        head.append(_PACK_ENTRY.pack(len(raw), len(c)) + raw)
    return b"".join(head + contents)


def _unpack_directory(blob: memoryview) -> list[tuple[str, int, int]]:
    """(name, start, size) of every file in a packed blob; raises ValueError on a malformed archive."""
    if len(blob) < _PACK_HEAD.size:
        raise ValueError("full-text blob too short")
    magic, count = _PACK_HEAD.unpack_from(blob, 0)
    if magic != _PACK_MAGIC:
        raise ValueError("full-text blob has a bad magic number")
    pos, entries = _PACK_HEAD.size, []
    for _ in range(count):
        if pos + _PACK_ENTRY.size > len(blob):
            raise ValueError("full-text blob directory is truncated")
        name_len, size = _PACK_ENTRY.unpack_from(blob, pos)
        name = bytes(blob[pos + _PACK_ENTRY.size : pos + _PACK_ENTRY.size + name_len]).decode("utf-8", "replace")
        pos += _PACK_ENTRY.size + name_len
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"full-text blob names an unsafe file {name!r}")
        entries.append((name, size))
    files, start = [], pos
    for name, size in entries:
        files.append((name, start, size))
        start += size
    if start != len(blob):
        raise ValueError(f"full-text blob holds {len(blob)} bytes, its directory describes {start}")
    return files


def _extract(blob: memoryview, path: str, source: str) -> None:
    """Extract ``blob`` to ``path`` unless a complete extraction is already there.

    Files are written to a temporary sibling directory that is renamed into
    place, so nobody ever opens half an index. An incomplete directory at
    ``path`` (left by a crash before the data reached the disk) is moved aside
    and replaced; a complete one is never touched.
    """
    try:
        files = _unpack_directory(blob)
    except ValueError as e:
        raise CorruptSuperfileError(source, str(e)) from None
    if _complete(path, files):
        return
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        for name, start, size in files:
            with open(os.path.join(tmp, name), "wb") as fh:
                fh.write(blob[start : start + size])
        if os.path.isdir(path) and not _complete(path, files):
            stale = tempfile.mkdtemp(prefix=".stale-", dir=parent)
            with contextlib.suppress(OSError):  # another extractor may have moved it first
                os.rename(path, os.path.join(stale, "index"))
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not _complete(path, files):  # losing the race to a complete extraction is fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _complete(path: str, files: list[tuple[str, int, int]]) -> bool:
    """Whether ``path`` holds every file of the archive at its full size (cheap: stat calls only)."""
    try:
        return all(os.path.getsize(os.path.join(path, n)) == size for n, _, size in files)
    except OSError:
        return False


class FullTextIndex:
    """One column's tantivy index: BM25 search, boolean match, exact match and term statistics.

    Queries take *analysed* terms (see :meth:`analyze`) so the table can compute
    global statistics over the same tokens every file sees. Thread-safe.
    """

    def __init__(self, index: tantivy.Index, tokenizer: str) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self._analyzer = make_analyzer(tokenizer)
        self._analyzer_lock = threading.Lock()  # a TextAnalyzer is mutably borrowed while it runs
        index.register_tokenizer(_analyzer_name(tokenizer), make_analyzer(tokenizer))
        self.searcher = index.searcher()
        self.num_docs: int = self.searcher.num_docs
        self._avg_len: float | None = None

    @classmethod
    def from_blob(cls, blob: memoryview, path: str, tokenizer: str, *, source: str) -> FullTextIndex:
        """Open a packed index, extracting it to ``path`` first unless a complete copy is there.

        ``source`` names the file in errors.
        """
        _extract(blob, path, source)
        try:
            return cls(tantivy.Index.open(path), tokenizer)
        except (ValueError, OSError) as e:
            raise CorruptSuperfileError(source, f"full-text index at {path} does not open: {e}") from None

    def analyze(self, text: str) -> list[str]:
        """The column's tokenizer applied to ``text``: the tokens a query must use."""
        with self._analyzer_lock:
            return self._analyzer.analyze(text)

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
        """Sum of analysed lengths over all rows (from :attr:`avg_len`; exact up to float32 rounding)."""
        return round(self.avg_len * self.num_docs)

    def _read_avg_len(self) -> float:
        top = self.searcher.terms_with_prefix(TEXT_FIELD, "", limit=1)
        if not top:
            return 0.0
        query = tantivy.Query.term_query(self.index.schema, TEXT_FIELD, top[0][0])
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
            member_query = tantivy.Query.term_set_query(self.index.schema, ROW_FIELD, members)
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
        schema = self.index.schema
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
        return self._all_rows(tantivy.Query.term_query(self.index.schema, HASH_FIELD, h), bound)

    def _scoring_query(self, terms: list[str], required: bool, weights: Mapping[str, float]) -> tantivy.Query:
        occur = tantivy.Occur.Must if required else tantivy.Occur.Should
        clauses = []
        for t in terms:
            q = tantivy.Query.term_query(self.index.schema, TEXT_FIELD, t)
            w = weights.get(t, 1.0)
            if not (math.isfinite(w) and w >= 0):
                raise InvalidOptionError(f"term weight must be a finite number >= 0, got {w!r} for {t!r}")
            clauses.append((occur, q if w == 1.0 else tantivy.Query.boost_query(q, w)))
        return tantivy.Query.boolean_query(clauses)

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


def _mode(mode: str) -> bool:
    try:
        return _MODES[mode]
    except KeyError:
        raise InvalidOptionError(f"mode must be one of {sorted(_MODES)}, got {mode!r}") from None
