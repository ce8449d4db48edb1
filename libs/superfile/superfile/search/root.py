"""The query root: plan on the pinned manifest, fan the per-superfile work out to cache nodes, merge.

A :class:`RootSearcher` is the :class:`~superfile.table.search.Searcher` of a
snapshot whose connection has a fleet (``Searcher.of`` picks it). It keeps the
searcher's planning (argument checks, pruning by the manifest's summaries),
asks the leaves for what is table-wide (BM25 document frequencies and deleted
lengths, prefix expansions), sends each leaf its share with those statistics,
and merges the leaves' ranked rows the way one process merges superfiles:
by score, ties by ``_id``. The leaves run the same ``Searcher`` over their
share (``leaf.py``), so a search ranks as it does embedded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
from cachetools import LRUCache

from superfile._lru import LRU
from superfile.expressions import Predicate
from superfile.schema import ID, SCORE
from superfile.search.fleet import Fleet
from superfile.table.search import Searcher, check_row_limit
from superfile.table.snapshot import Snapshot

__all__ = ["RootFanout", "RootSearcher"]

_term_cache = LRU(64)  # storage URI # manifest path # column -> {term: table-wide df, _DELETED: deleted length}
# storage URI # superfile path # deletion vector # column -> {term: df of its live rows, _DELETED: its length};
# bounded so that the worst case (every query new terms) holds ~100 MB: 4,096 shares of 256 terms. A table
# whose search would need more than a quarter of them is asked whole each time, as a cache that small for it
# would only churn (and the warmer leaves it alone).
_superfile_terms = LRU(4096)
_SHARES_PER_SEARCH = 1024
_DELETED = "\x00deleted"  # not a term: analysers never emit a NUL
_TERMS_PER_MANIFEST = 100_000
_TERMS_PER_SUPERFILE = 256
_RECENT_TERMS = 256  # terms per table and column whose statistics a new version gets ahead of the searches
# storage URI # column -> the terms searched lately (cachetools' caches are not thread-safe: under the lock)
_recent_terms: dict[str, LRUCache[str, None]] = {}
_recent_lock = threading.Lock()


def _remember(key: str, terms: list[str]) -> None:
    with _recent_lock:
        recent = _recent_terms.setdefault(key, LRUCache(maxsize=_RECENT_TERMS))
        for t in terms:
            recent[t] = None  # a term searched again is the most recent


_ORDER: dict[str, list[tuple[str, Literal["ascending", "descending"]]]] = {
    "best": [(SCORE, "descending"), (ID, "ascending")],  # BM25: higher is better
    "nearest": [(SCORE, "ascending"), (ID, "ascending")],  # vectors: score is a distance
    "id": [(ID, "ascending")],  # unranked matches
}


class RootFanout:
    """A fleet as a table's fan-out (``TableFiles.fanout``): scans and counts run on the cache nodes, and
    searches are planned by a :class:`RootSearcher` (``Searcher.of`` asks for it, so the table layer never
    imports the read path built on it)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def scan_parts(self, snap: Snapshot, columns: list[str], where: Predicate | None) -> list[pa.Table]:
        return self.fleet.scan_parts(snap, columns, where)

    def count(self, snap: Snapshot, where: Predicate) -> int:
        return self.fleet.count(snap, where)

    def searcher(self, snapshot: Snapshot) -> RootSearcher:
        return RootSearcher(snapshot, self.fleet)


class RootSearcher(Searcher):
    """Every search kind of one call, planned here and run on the cache nodes."""

    def __init__(self, snapshot: Snapshot, fleet: Fleet) -> None:
        super().__init__(snapshot)
        self.fleet = fleet

    def _fan(self, paths: Sequence[str], op: str, args: dict[str, Any]) -> list[Any]:
        return self.fleet.run(self.snap, list(paths), op, args)

    def _merge(
        self, answers: list[pa.Table], k: int | None, order: str, projection: Sequence[str] | None, searched: int
    ) -> pa.Table:
        """The leaves' rows as one result, ranked and cut to ``k``, with the result metadata of an embedded one."""
        empty = self._result([], k, True, projection)  # the result's schema and metadata, no rows
        tables = [empty.replace_schema_metadata(None)] + [t.replace_schema_metadata(None) for t in answers]
        merged = pa.concat_tables(tables).sort_by(_ORDER[order])
        if k is not None:
            merged = merged.slice(0, k)
        meta = dict(empty.schema.metadata or {})
        total = self.snap.manifest.superfile_count
        meta.update(
            {b"superfile.pruned": str(total - searched).encode(), b"superfile.searched": str(searched).encode()}
        )
        return merged.combine_chunks().replace_schema_metadata(meta)

    @staticmethod
    def _searched(answers: list[pa.Table]) -> int:
        return sum(int((t.schema.metadata or {}).get(b"superfile.searched", b"0")) for t in answers)

    # -- full-text ------------------------------------------------------------------
    def bm25(self, column: str, terms: list[str], k: int, mode: str, projection: Sequence[str] | None) -> pa.Table:
        terms = list(dict.fromkeys(terms))
        if not terms:
            return self._result([], k, True, projection)
        candidates = self._term_candidates(column, terms, mode)
        df, deleted_tokens = self._term_stats(column, terms)
        corpus = self.corpus_of(column, terms, df, deleted_tokens)
        if mode == "all" and min(df, default=0) == 0:
            candidates = []
        args = {
            "column": column,
            "terms": terms,
            "k": k,
            "mode": mode,
            "projection": self._projection(projection),
            "num_docs": corpus.num_docs,
            "total_tokens": corpus.total_tokens,
            "df": df,
        }
        answers = self._fan([e.path for e in candidates], "bm25", args)
        return self._merge(answers, k, "best", projection, self._searched(answers))

    def _term_stats(self, column: str, terms: list[str]) -> tuple[list[int], int]:
        """The table-wide df of each term and the deleted rows' length: from this manifest's cache where a
        term was asked before, else summed over the superfiles' shares (:meth:`_superfile_stats`). A manifest
        never changes, so neither do its answers: a repeated term costs a search one round trip less."""
        uri = self.snap.files.storage.uri
        _remember(f"{uri}#{column}", terms)
        known: dict[str, int] = _term_cache.get_or_load(f"{uri}#{self.snap.path}#{column}", dict)[0]
        found = {t: known[t] for t in [*terms, _DELETED] if t in known}
        new = [t for t in terms if t not in found]
        if new or _DELETED not in found:
            found.update(self._superfile_stats(column, new))
            if len(known) < _TERMS_PER_MANIFEST:  # a bound on one manifest's cache; past it, terms are asked anew
                known.update(found)
        return [found[t] for t in terms], found[_DELETED]

    def _superfile_stats(self, column: str, terms: list[str]) -> dict[str, int]:
        """Each term's df and ``_DELETED`` summed over the superfiles that may hold a term, have deletes, or lack
        the column's index. A superfile's share depends only on it and its deletion vector, so it is kept
        across versions: after a commit only the superfiles new to the table (or with new deletes) are asked,
        in one round of leaf calls, and none when :meth:`warm_term_stats` asked already."""
        uri = self.snap.files.storage.uri
        holders = {e.path for e in self._term_candidates(column, terms, "any")} if terms else set()
        entries = [e for e in self.snap.entries() if e.path in holders or e.deletes is not None or column not in e.text]
        keeping = len(entries) <= _SHARES_PER_SEARCH  # past that, asked whole and nothing kept
        if keeping:
            keys = {e.path: f"{uri}#{e.path}#{e.deletes.path if e.deletes else ''}#{column}" for e in entries}
            shares: dict[str, dict[str, int]] = {p: _superfile_terms.get_or_load(k, dict)[0] for p, k in keys.items()}
        else:
            shares = {e.path: {} for e in entries}
        missing = [p for p, d in shares.items() if _DELETED not in d or any(t not in d for t in terms)]
        asked = set(missing)
        out = dict.fromkeys(terms, 0)
        out[_DELETED] = 0
        for path, share in shares.items():
            if path not in asked:
                for t in terms:
                    out[t] += share[t]
                out[_DELETED] += share[_DELETED]
        for answer in self._fan(missing, "bm25_stats", {"column": column, "terms": terms}) if missing else []:
            for i, t in enumerate(terms):
                out[t] += int(answer["df"][i])
            out[_DELETED] += int(answer["deleted_tokens"])
            for path, df, length in answer.get("superfiles", []) if keeping else []:  # kept for the next versions
                kept = shares.get(path)
                if kept is not None and len(kept) < _TERMS_PER_SUPERFILE:
                    kept.update(zip(terms, (int(n) for n in df), strict=True))
                    kept[_DELETED] = int(length)
        return out

    def warm_term_stats(self) -> None:
        """Ask the leaves now for the shares, in this version, of the terms searched lately (a query service
        calls it on each commit it sees), so that the next searches of those terms need no statistics round."""
        uri = self.snap.files.storage.uri
        if self.snap.manifest.superfile_count > _SHARES_PER_SEARCH:
            return
        for column in self.options.fts_columns:
            with _recent_lock:
                terms = list(_recent_terms.get(f"{uri}#{column}", ()))
            if terms:
                self._term_stats(column, terms)

    def prefix_terms(self, column: str, p: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        paths = [e.path for e in self._prefix_entries(column, p)]
        for answer in self._fan(paths, "prefix_terms", {"column": column, "term": p}):
            for term, n in answer["terms"].items():
                counts[term] = counts.get(term, 0) + int(n)
        return counts

    def token_match(
        self,
        column: str,
        tokens: str | Sequence[str],
        mode: str,
        projection: Sequence[str] | None,
        max_rows: int | None = None,
    ) -> pa.Table:
        terms, mode, candidates = self._token_plan(column, tokens, mode)
        args = {"column": column, "tokens": terms, "mode": mode, "projection": self._projection(projection)}
        return self._unranked_merge(candidates, "token_match", {**args, "max_rows": max_rows}, projection, max_rows)

    def exact_match(
        self, column: str, value: str, projection: Sequence[str] | None, max_rows: int | None = None
    ) -> pa.Table:
        candidates = self._exact_plan(column, value)
        args = {"column": column, "value": value, "projection": self._projection(projection), "max_rows": max_rows}
        return self._unranked_merge(candidates, "exact_match", args, projection, max_rows)

    def _unranked_merge(
        self,
        candidates: Sequence[Any],
        op: str,
        args: dict[str, Any],
        projection: Sequence[str] | None,
        max_rows: int | None,
    ) -> pa.Table:
        answers = self._fan([e.path for e in candidates], op, args)
        check_row_limit(sum(t.num_rows for t in answers), max_rows)
        return self._merge(answers, None, "id", projection, self._searched(answers))

    # -- vectors ----------------------------------------------------------------------
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
        k, q, _, _, entries = self._vector_plan(column, vector, k, text_filter, where)
        args = {
            "column": column,
            "vector": q.tolist(),
            "k": k,
            "nprobe": nprobe,
            "rerank": rerank,
            "filter": None if text_filter is None else dict(text_filter),
            "where": where,
            "projection": self._projection(projection),
        }
        answers = self._fan([e.path for e in entries], "vector", args)
        return self._merge(answers, k, "nearest", projection, self._searched(answers))
