"""Summaries: the per-superfile and per-part facts that pruning reads instead of superfile bytes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from superfile.expressions import ColumnStats
from superfile.manifest.bloom import BloomFilter
from superfile.manifest.model import PartRef, SuperfileEntry, TextSummary, VectorSummary

__all__ = ["column_stats", "extended_ref", "merge_stats", "part_ref", "text_summary", "vector_summary"]

_MAX_BOUND_CHARS = 64


def _bounds_of_strings(lo: str | bytes, hi: str | bytes) -> tuple[str | bytes | None, str | bytes | None]:
    """Truncate long bounds so they stay valid: a prefix is a lower bound; an incremented prefix an upper one."""
    lo = lo[:_MAX_BOUND_CHARS]
    if len(hi) > _MAX_BOUND_CHARS:
        head = hi[: _MAX_BOUND_CHARS - 1]
        last = hi[_MAX_BOUND_CHARS - 1]
        if isinstance(hi, str):
            assert isinstance(last, str) and isinstance(head, str)
            code = ord(last) + 1
            if code in range(0xD800, 0xE000):
                code = 0xE000
            hi = head + chr(code) if code <= 0x10FFFF else None  # type: ignore[assignment]
        else:
            assert isinstance(last, int) and isinstance(head, bytes)
            hi = head + bytes([last + 1]) if last < 255 else None  # type: ignore[assignment]
    return lo, hi


def column_stats(column: pa.ChunkedArray | pa.Array) -> ColumnStats:
    """Min, max and null count of one column; unknown (None) where a bound cannot be trusted."""
    rows = len(column)
    nulls = column.null_count
    if nulls == rows or pa.types.is_nested(column.type):
        return ColumnStats(None, None, nulls, rows)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    mm = pc.min_max(column)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if isinstance(lo, float) and (np.isnan(lo) or np.isnan(hi)):
        lo = hi = None
    if isinstance(lo, float) and pc.any(pc.is_nan(column)).as_py():
        lo = hi = None  # NaN orders above everything in SQL engines; keep it unknown
    if isinstance(lo, (str, bytes)) and isinstance(hi, (str, bytes)):
        lo, hi = _bounds_of_strings(lo, hi)
    return ColumnStats(lo, hi, nulls, rows)


def text_summary(terms: Sequence[str]) -> TextSummary:
    terms = list(terms)
    return TextSummary(BloomFilter.build(terms), min(terms, default=None), max(terms, default=None))


def vector_summary(vectors: np.ndarray, metric: str) -> VectorSummary:
    """Centroid and covering radius, in the geometry the metric searches (unit sphere for cosine)."""
    if len(vectors) == 0:
        return VectorSummary(np.zeros(vectors.shape[1], np.float32), 0.0)
    v = np.asarray(vectors, dtype=np.float32)
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        v = (v / np.where(norms == 0, 1, norms)).astype(np.float32)
    centroid = v.mean(axis=0)
    radius = float(np.sqrt(((v - centroid) ** 2).sum(axis=1).max()))
    return VectorSummary(centroid.astype(np.float32), radius)


def merge_stats(many: Sequence[dict[str, ColumnStats]]) -> dict[str, ColumnStats]:
    """Aggregate column statistics over several superfiles, conservatively."""
    out: dict[str, ColumnStats] = {}
    names = set().union(*(m.keys() for m in many)) if many else set()
    for name in names:
        parts = [m[name] for m in many if name in m]
        if len(parts) != len(many):
            continue  # a superfile without stats for this column: unknown for the whole part
        rows = sum(s.row_count for s in parts)
        nulls = None if any(s.null_count is None for s in parts) else sum(s.null_count or 0 for s in parts)
        valued = [s for s in parts if not (s.null_count is not None and s.null_count == s.row_count)]
        if not valued or any(s.min is None or s.max is None for s in valued):
            out[name] = ColumnStats(None, None, nulls, rows)
        else:
            try:
                lo = min(s.min for s in valued)  # type: ignore[type-var]
                hi = max(s.max for s in valued)  # type: ignore[type-var]
            except TypeError:
                lo = hi = None
            out[name] = ColumnStats(lo, hi, nulls, rows)
    return out


def _text_range(summaries: Sequence[dict[str, TextSummary]]) -> dict[str, TextSummary]:
    """Per full-text column, the term range over ``summaries`` (no bloom filter: a part's says yes)."""
    text: dict[str, TextSummary] = {}
    for col in set().union(*(t.keys() for t in summaries)) if summaries else set():
        ts = [t[col] for t in summaries if col in t]
        lows = [t.min_term for t in ts if t.min_term is not None]
        highs = [t.max_term for t in ts if t.max_term is not None]
        text[col] = TextSummary(None, min(lows, default=None), max(highs, default=None))
    return text


def part_ref(path: str, partition: str | None, entries: Sequence[SuperfileEntry], byte_size: int) -> PartRef:
    return PartRef(
        path=path,
        partition=partition,
        entry_count=len(entries),
        byte_size=byte_size,
        rows=sum(e.rows for e in entries),
        live_rows=sum(e.live_rows for e in entries),
        id_min=min((e.id_min for e in entries), default=0),
        id_max=max((e.id_max for e in entries), default=0),
        stats=merge_stats([e.stats for e in entries]),
        text=_text_range([e.text for e in entries]),
        sealed=False,
    )


def extended_ref(ref: PartRef, path: str, new: Sequence[SuperfileEntry], byte_size: int) -> PartRef:
    """The ref of part ``path``: the entries of ``ref``'s part followed by ``new``. Summarized from ``ref``'s own
    summaries and the new entries only (sums, minima, maxima and "unknown" compose), it equals
    :func:`part_ref` over all the entries at a cost that does not grow with the part: a small commit adds to
    the open part of up to ``manifest_part_max_entries`` entries every time."""
    if not ref.entry_count:
        return part_ref(path, ref.partition, new, byte_size)
    added = part_ref(path, ref.partition, new, byte_size)
    return PartRef(
        path=path,
        partition=ref.partition,
        entry_count=ref.entry_count + added.entry_count,
        byte_size=byte_size,
        rows=ref.rows + added.rows,
        live_rows=ref.live_rows + added.live_rows,
        id_min=min(ref.id_min, added.id_min) if added.entry_count else ref.id_min,
        id_max=max(ref.id_max, added.id_max) if added.entry_count else ref.id_max,
        stats=merge_stats([ref.stats, added.stats]) if added.entry_count else dict(ref.stats),
        text=_text_range([ref.text, added.text]),
        sealed=False,
    )
