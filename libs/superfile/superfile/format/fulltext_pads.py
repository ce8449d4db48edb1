"""Padding segments: a union of some superfiles' indexes that tantivy scores as if it held the whole table.

A cache node searches its share of a table, and its union's own statistics are the share's: N, the average
length and each term's df. tantivy-py cannot be given other statistics, so the leaf used to take candidates
from tantivy and rescore them exactly (``UnionText``): about half of its work. Two of tantivy's own
mechanisms make its float32 scores the table's instead, bit for bit:

- **The average length.** BM25's length norm depends on ``avgdl = total tokens / N`` in float32, the sums
  taken over the searcher's segments. Segments that match no query term change nothing else, so a few of
  them (empty documents, and documents of a padding token) are added to the union until its float32 avgdl is
  the table's. They come from a fixed family: ``c * 16**k`` empty documents, and for each hex digit ``j``
  one document of ``c * 16**j`` tokens, each built once per cache directory and index schema and linked
  into every padded union (so a commit builds nothing).
- **Each term's idf.** A term's weight is ``idf(N, df) * (K1 + 1)`` in float32, and a boost multiplies it
  once, in float32 (``Bm25Weight::boost_by``). The boost whose product with the share's weight is the
  table's weight is searched among a few float32 neighbours of their quotient: :func:`boosts_for`.

The weights are tantivy's arithmetic as ``fulltext.weight32`` reproduces it. A padded union is checked
against tantivy's own explanation of a padding hit (its avgdl and an idf) before use, so a tantivy that
computed otherwise is caught, and the leaf rescores its candidates instead. So it does when no padding lets
every term of a query be boosted exactly (a product can skip the wanted float32: ~1 term in 8 per padding).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import tantivy

from superfile.format.fulltext import (
    TEXT_FIELD,
    analyzer_name,
    avgdl32,
    idf32,
    index_schema,
    make_analyzer,
    weights32,
)
from superfile.format.tantivy_files import read_meta
from superfile.pools import build_pool

__all__ = ["PAD_WORD", "Padding", "boosts_for", "checked", "pad_directories", "paddings"]

PAD_WORD = "superfilepad"  # the padding documents' one word (a query holding its token is rescored instead)
_BASE = 16
_TOKEN_DIGITS = 5  # padding tokens below 16**5 (~1M): a share's length deficit up to that
_EMPTY_DIGITS = 5  # padding documents below 16**5
_SCAN = 4096  # document counts tried past the least that could fit
_PADS_DIR = "pads"  # under the cache directory's unions/

_F32 = np.float32
_built: dict[str, bool] = {}  # padding directory -> whether it has the schema asked for (it never changes)
_building: set[str] = set()  # padding directories being built
_building_lock = threading.Lock()
log = logging.getLogger(__name__)


class Padding(NamedTuple):
    """Padding segments for one share: ``empty`` empty documents and ``tokens`` padding tokens, held by one
    document per hex digit (:data:`_TOKEN_DIGITS` documents, some of them empty); the padded union then holds
    ``docs`` documents."""

    empty: int
    tokens: int
    docs: int


def boosts_for(docs: np.ndarray, doc_freq: int, wanted: np.float32) -> list[float]:
    """For a term of share df ``doc_freq``, in paddings of ``docs`` documents each: the float32 boost ``b``
    with ``float32(weight * b) == wanted`` (tantivy folds a boost into a term's weight by that one product),
    NaN where no float32 near their quotient gives it. The quotient and its eight neighbours each way are
    tried, nearest first, for every padding at once (a commit makes every term's boosts new)."""
    local = weights32(docs, doc_freq)
    guess = (np.float64(wanted) / local.astype(np.float64)).astype(_F32)
    out = np.full(len(docs), np.nan)
    up, down = guess.copy(), guess.copy()
    for _ in range(8):
        for b in (up, down):
            hit = np.isnan(out) & (local * b == wanted)
            out[hit] = b[hit]
        up, down = np.nextafter(up, _F32(np.inf)), np.nextafter(down, _F32(0))
    out[(local <= 0) | (wanted <= 0)] = np.nan
    return out.tolist()


def paddings(share_docs: int, share_tokens: int, num_docs: int, total_tokens: int, count: int) -> list[Padding]:
    """Up to ``count`` paddings that give a share of ``share_docs`` documents and ``share_tokens`` tokens the
    table's float32 average length, fewest documents first. Each gives every term another weight in the
    share (its N differs), so a term whose weight cannot be boosted exactly in one can be in another.
    ``tokens >= 1``, so a padding document holds the padding token (:func:`checked` explains it)."""
    if num_docs <= 0 or total_tokens <= 0 or share_docs <= 0:
        return []
    target = avgdl32(num_docs, total_tokens)
    base = share_docs + _TOKEN_DIGITS
    least = max(0, int(np.ceil((share_tokens + 1) / float(target))) - base)  # below it r would be < 1
    d = np.arange(least, least + _SCAN, dtype=np.int64)
    n = base + d
    r0 = np.rint(n * float(target)).astype(np.int64) - share_tokens
    found: dict[int, int] = {}
    for shift in (0, -1, 1, -2, 2):
        r = r0 + shift
        ok = (r >= 1) & (r < _BASE**_TOKEN_DIGITS) & (d < _BASE**_EMPTY_DIGITS)
        ok &= (share_tokens + r).astype(_F32) / n.astype(_F32) == target
        for i in np.flatnonzero(ok).tolist():
            found.setdefault(int(d[i]), int(r[i]))
    # spread over the window: the share's weights at neighbouring counts differ by a few ulps, so whether a
    # term's boost is exact comes in runs there (measured: 64% of counts, but 6 failures in a row)
    solutions = sorted(found.items())
    picks = np.unique(np.linspace(0, len(solutions) - 1, min(count, len(solutions))).round().astype(int))
    return [Padding(solutions[i][0], solutions[i][1], base + solutions[i][0]) for i in picks.tolist()]


def _digits(value: int, count: int) -> list[int]:
    return [(value // _BASE**k) % _BASE for k in range(count)]


def pad_directories(unions_dir: str, schema_json: str, tokenizer: str, padding: Padding) -> list[str] | None:
    """The index directories of ``padding``'s segments under ``unions_dir``, shared by every union there; None
    while one is still being built (in the background, on the build pool: meanwhile the leaf rescores, which
    gives the same scores). Raises ValueError if a padding index would not have the parts' schema (a superfile
    written by another version)."""
    family = os.path.join(unions_dir, _PADS_DIR, f"{tokenizer}-{_digest(schema_json)}")
    names = [f"empty-{k}-{c}" for k, c in enumerate(_digits(padding.empty, _EMPTY_DIGITS)) if c]
    names += [f"tokens-{j}-{c}" for j, c in enumerate(_digits(padding.tokens, _TOKEN_DIGITS))]
    out, ready = [], True
    for name in names:
        directory = os.path.join(family, name)
        if not os.path.exists(os.path.join(directory, "meta.json")):  # not built yet, or removed since
            _build_later(directory, tokenizer, name)
            ready = False
            continue
        fits = _built.get(directory)
        if fits is None:
            fits = _built[directory] = json.dumps(read_meta(directory).get("schema"), sort_keys=True) == schema_json
        if not fits:
            raise ValueError(f"padding index {directory} has another schema than the superfiles' indexes")
        out.append(directory)
    return out if ready else None


def _build_later(directory: str, tokenizer: str, name: str) -> None:
    with _building_lock:
        if directory in _building:
            return
        _building.add(directory)

    def build() -> None:
        try:
            _build(directory, tokenizer, name)
        except Exception:  # a later query asks again
            log.exception("padding segment %s not built", directory)
        finally:
            with _building_lock:
                _building.discard(directory)

    build_pool().submit(build)


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _build(directory: str, tokenizer: str, name: str) -> None:
    """Build one padding segment into ``directory`` (atomically: another process may build it too)."""
    kind, place, digit = name.split("-")
    count = int(digit) * _BASE ** int(place)
    tmp = f"{directory}.{uuid.uuid4().hex[:8]}.tmp"
    os.makedirs(tmp)
    try:
        index = tantivy.Index(index_schema(tokenizer), path=tmp)
        index.register_tokenizer(analyzer_name(tokenizer), make_analyzer(tokenizer))
        writer = index.writer(15_000_000, 1)
        if kind == "empty":
            for _ in range(count):
                writer.add_document(tantivy.Document())
        else:  # one document of `count` tokens (none for digit 0)
            doc = tantivy.Document()
            if count:
                values: Sequence[str] = [PAD_WORD] * count if tokenizer == "raw" else [" ".join([PAD_WORD] * count)]
                for value in values:
                    doc.add_text(TEXT_FIELD, value)
            writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()
        for lock in (".tantivy-writer.lock", ".tantivy-meta.lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(tmp, lock))
        try:
            os.rename(tmp, directory)
        except OSError:  # built meanwhile by another process or thread
            if not os.path.exists(os.path.join(directory, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checked(searcher: tantivy.Searcher, query: tantivy.Query, num_docs: int, total_tokens: int) -> bool:
    """Whether tantivy scores this padded union with the table's average length and our idf: its explanation
    of a padding document's hit for the padding token (``query``) against ``avgdl32`` and ``idf32``."""
    hits = searcher.search(query, 1, count=False).hits
    if not hits:
        return False
    found = _explained(json.loads(query.explain(searcher, hits[0][1]).to_json()))
    n = searcher.num_docs
    df = int(found.get("n, number of docs containing this term", -1))
    return (
        found.get("avgdl, average length of field") == float(avgdl32(num_docs, total_tokens))
        and found.get("N, total number of docs") == float(n)
        and found.get("idf, computed as log(1 + (N - n + 0.5) / (n + 0.5))") == float(idf32(n, df))
    )


def _explained(node: dict[str, Any], out: dict[str, float] | None = None) -> dict[str, float]:
    """An explanation's values by description (the first of each), as float32."""
    out = {} if out is None else out
    description, value = node.get("description"), node.get("value")
    if isinstance(description, str) and isinstance(value, int | float):
        out.setdefault(description, float(_F32(value)))
    for child in node.get("details") or []:
        _explained(child, out)
    return out
