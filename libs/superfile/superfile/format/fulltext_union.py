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

A union's directory is named after its parts' directories (each named after
a superfile's content), built once under the cache directory (atomically,
like an extraction) and reused by every process; the caller keeps the opened
union for as long as its snapshot is queried. Every
commit makes a new set of superfiles, so building a union also removes the
oldest union directories beyond the newest ``_KEEP_DIRS`` (links only: an
index already open keeps its memory-mapped segment files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence

import numpy as np
import tantivy

from superfile.format.fulltext import ROW_FIELD, TEXT_FIELD, FullTextIndex, analyzer_name, make_analyzer
from superfile.format.tantivy_files import read_meta, segment_files

__all__ = ["UnionIndex", "union_of"]

_TIE_EXTRA = 16  # hits fetched past k, so rows tied with the k-th are all seen (ties break by _id later)
_KEEP_DIRS = 64  # union directories kept under a cache directory


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
        self._part_of = list(part_of_segment)

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
            found = by_part.setdefault(self._part_of[doc.segment_ord], ([], []))
            found[0].append(int(row))  # type: ignore[arg-type]  # the row field is an int fast field
            found[1].append(score)
        return [(p, np.asarray(r, np.int64), np.asarray(s, np.float32)) for p, (r, s) in sorted(by_part.items())]


def union_of(parts: Sequence[FullTextIndex], cache_dir: str, *, ordered: bool) -> UnionIndex:
    """The union of these indexes (same column, same tokenizer, in this order), its directory built under
    ``cache_dir`` unless there already; ``ordered`` as in :class:`UnionIndex`. Raises OSError or ValueError
    when a part's files are not where they were extracted."""
    directories = [p.directory for p in parts]
    if any(d is None for d in directories):
        raise ValueError("a part has no directory")
    key = hashlib.sha1("\n".join(d for d in directories if d).encode()).hexdigest()[:20]
    path = os.path.join(cache_dir, f"union-{key}")
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


def _prune(cache_dir: str) -> None:
    """Remove all but the newest ``_KEEP_DIRS`` union directories (by modification time)."""
    unions = []
    for entry in os.scandir(cache_dir):
        if entry.name.startswith("union-") and ".tmp-" not in entry.name:
            with contextlib.suppress(FileNotFoundError):
                unions.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _, old in sorted(unions, reverse=True)[_KEEP_DIRS:]:
        shutil.rmtree(old, ignore_errors=True)


def _link(parts: Sequence[FullTextIndex], metas: list[dict], path: str) -> None:
    """Write the union's directory: links to every segment file and one meta.json listing the segments in
    part order. Built aside and renamed into place, so a reader never sees half of it."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
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
