"""Build: each shard becomes one superfile (Parquet + full-text + vector indexes) on the build pool,
is uploaded, and is summarized into its manifest entry."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from superfile.commit.shard import Shard
from superfile.commit.summarize import summarize
from superfile.format import SuperfileSpec, VectorColumnSpec, build_superfile
from superfile.format.vector_index import VectorIndexParams
from superfile.io import Storage
from superfile.manifest.model import SuperfileEntry
from superfile.options import TableOptions
from superfile.pools import build_pool

__all__ = ["build_shards", "superfile_spec"]


def superfile_spec(options: TableOptions) -> SuperfileSpec:
    return SuperfileSpec(
        fts_columns=dict(options.fts_columns),
        vector_columns={
            c: VectorColumnSpec(v.dim, v.metric, VectorIndexParams(**v.index) if v.index else None)
            for c, v in options.vector_columns.items()
        },
    )


def _build_one(shard: Shard, spec: SuperfileSpec, options: TableOptions, storage: Storage) -> SuperfileEntry:
    built = build_superfile(shard.rows, spec)
    path = f"data/{uuid.uuid4().hex}.parquet"
    storage.write(path, built.data)
    return summarize(shard.rows, built, path, shard.partition, options)


def build_shards(shards: Sequence[Shard], options: TableOptions, storage: Storage) -> list[SuperfileEntry]:
    """Build and upload every shard in parallel. Uploaded files stay invisible until a commit names them."""
    spec = superfile_spec(options)
    if len(shards) == 1:
        return [_build_one(shards[0], spec, options, storage)]
    futures = [build_pool().submit(_build_one, s, spec, options, storage) for s in shards]
    return [f.result() for f in futures]
