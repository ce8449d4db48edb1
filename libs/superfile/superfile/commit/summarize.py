"""Summarize: derive a new superfile's manifest entry from its rows and its built indexes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from superfile.format import BuiltSuperfile
from superfile.manifest.model import SuperfileEntry
from superfile.manifest.summary import column_stats, text_summary, vector_summary
from superfile.options import TableOptions
from superfile.schema import ID

__all__ = ["summarize", "vectors_of"]


def vectors_of(rows: pa.Table, column: str) -> np.ndarray:
    arr = rows.column(column).combine_chunks()
    assert isinstance(arr, pa.FixedSizeListArray)
    dim = arr.type.list_size
    return np.asarray(arr.values.to_numpy(zero_copy_only=False), np.float32).reshape(-1, dim)


def summarize(
    rows: pa.Table,
    built: BuiltSuperfile,
    path: str,
    partition: str | None,
    options: TableOptions,
    *,
    indexed: bool = True,
) -> SuperfileEntry:
    """``indexed=False``: a level-0 superfile, built without its full-text and vector indexes; its entry has no
    text or vector summary, which is how every reader knows to search it exactly (``table/exact.py``)."""
    ids = rows.column(ID)
    mm = pc.min_max(ids)
    return SuperfileEntry(
        path=path,
        size=len(built.data),
        rows=rows.num_rows,
        id_min=mm["min"].as_py(),
        id_max=mm["max"].as_py(),
        footer_crc32=built.footer_crc32,
        sections=dict(built.sections),
        stats={n: column_stats(rows.column(n)) for n in rows.column_names if n not in options.vector_columns},
        text={c: text_summary(built.terms.get(c, [])) for c in options.fts_columns} if indexed else {},
        vectors={c: vector_summary(vectors_of(rows, c), v.metric) for c, v in options.vector_columns.items()}
        if indexed
        else {},
        partition=partition,
        added_version=0,
        fts_tokens={c: total for c, (_, total) in built.fts_stats.items()},
    )
