"""Build: each shard becomes one superfile (Parquet + full-text + vector indexes) on the build pool,
is uploaded, and is summarized into its manifest entry.

A *level-0* superfile (``indexed=False``: what a small write commits, ``TableOptions.level0_max_rows``) is
built without the full-text and vector indexes: its vectors stay in Parquet, its entry has no text or vector
summary, so every reader searches it exactly (``table/exact.py``) and compaction rewrites it with the indexes
(``table/optimize.py``). Scalar indexes, statistics and the ``_id`` section are built as for any superfile; its
Parquet is written without dictionary encoding (at a few rows it only costs time)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from superfile.commit.shard import Shard
from superfile.commit.summarize import summarize
from superfile.format import BITMAP_CARDINALITY_LIMIT, SuperfileSpec, VectorColumnSpec, build_superfile
from superfile.format.vector_index import VectorIndexParams
from superfile.io import Storage
from superfile.manifest.model import SuperfileEntry
from superfile.manifest.store import Uploads
from superfile.options import TableOptions
from superfile.pools import build_pool

__all__ = ["build_shards", "superfile_spec"]


def superfile_spec(options: TableOptions, *, indexed: bool = True) -> SuperfileSpec:
    if not indexed:  # level 0: small, rewritten by compaction; written fast
        return SuperfileSpec(dictionary=False)
    return SuperfileSpec(
        fts_columns=dict(options.fts_columns),
        vector_columns={
            c: VectorColumnSpec(v.dim, v.metric, VectorIndexParams(**v.index) if v.index else None)
            for c, v in options.vector_columns.items()
        },
    )


def _indexable(t: pa.DataType) -> bool:
    return any(
        check(t)
        for check in (
            pa.types.is_boolean,
            pa.types.is_integer,
            pa.types.is_floating,
            pa.types.is_timestamp,
            pa.types.is_date,
            pa.types.is_string,
            pa.types.is_large_string,
        )
    )


def scalar_index_kinds(rows: pa.Table, options: TableOptions) -> dict[str, str]:
    """The scalar index of each column of one superfile.

    ``auto`` (the default for every scalar column that is not full-text):
    bool -> bitmap; a column with few distinct values (at most 1/16 of the rows and
    at most the bitmap limit) -> bitmap; numbers, times and short strings -> sorted;
    long strings (mean over 64 bytes) -> none.
    """
    kinds: dict[str, str] = {}
    for field in rows.schema:
        name, kind = field.name, options.scalar_indexes.get(field.name, "auto")
        auto = kind == "auto"
        if kind == "none" or name in options.vector_columns or (auto and name in options.fts_columns):
            continue
        if auto:
            if not _indexable(field.type):
                continue
            column = rows.column(name)
            distinct = pc.count_distinct(column, mode="all").as_py()
            if pa.types.is_boolean(field.type) or distinct <= min(BITMAP_CARDINALITY_LIMIT, rows.num_rows // 16):
                kind = "bitmap"
            elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
                valid = max(1, rows.num_rows - column.null_count)
                total = pc.sum(pc.binary_length(column)).as_py() or 0
                kind = "sorted" if total <= 64 * valid else "none"
            else:
                kind = "sorted"
        if kind != "none":
            kinds[name] = kind
    return kinds


def _build_one(
    shard: Shard,
    spec: SuperfileSpec,
    options: TableOptions,
    storage: Storage,
    schema_id: int,
    indexed: bool,
    uploads: Uploads | None,
) -> SuperfileEntry:
    built = build_superfile(shard.rows, replace(spec, scalar_indexes=scalar_index_kinds(shard.rows, options)))
    path = f"data/{uuid.uuid4().hex}.parquet"
    if uploads is None:
        storage.write(path, built.data)
    else:
        uploads.put(storage, path, built.data, plain=True)
    entry = summarize(shard.rows, built, path, shard.partition, options, indexed=indexed)
    return replace(entry, schema_id=schema_id)


def build_shards(
    shards: Sequence[Shard],
    options: TableOptions,
    storage: Storage,
    schema_id: int = 0,
    *,
    indexed: bool = True,
    uploads: Uploads | None = None,
) -> list[SuperfileEntry]:
    """Build and upload every shard in parallel. Uploaded files stay invisible until a commit names them.
    ``schema_id``: the table schema the rows were coerced to (``options`` are that schema's): the entries
    record it, so a schema change that lands before they publish still reads their columns right.
    ``indexed=False``: level-0 superfiles, without the full-text and vector indexes (module docstring).
    ``uploads``: the files go to the commit's concurrent uploads (``manifest.store.Uploads``) and may still be
    being written on return; the commit settles them before its pointer swap."""
    spec = superfile_spec(options, indexed=indexed)
    if len(shards) == 1:
        return [_build_one(shards[0], spec, options, storage, schema_id, indexed, uploads)]
    futures = [build_pool().submit(_build_one, s, spec, options, storage, schema_id, indexed, uploads) for s in shards]
    return [f.result() for f in futures]
