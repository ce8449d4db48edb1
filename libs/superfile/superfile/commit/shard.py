"""Shard: split staged rows into balanced shards, one superfile each, whatever the caller's batching."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from superfile.options import PartitionSpec, TableOptions

__all__ = ["Shard", "partition_keys", "shard"]


@dataclass(frozen=True)
class Shard:
    partition: str | None
    rows: pa.Table


def _bucket(value: object, buckets: int) -> str:
    digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return str(int.from_bytes(digest, "little") % buckets)


def partition_keys(column: pa.ChunkedArray, spec: PartitionSpec) -> list[str]:
    """The partition key (a string; ``null`` for null values) of every row."""
    col: pa.Array = column.combine_chunks()
    keys: pa.Array
    if spec.transform in ("year", "month", "day"):
        fmt = {"year": "%Y", "month": "%Y-%m", "day": "%Y-%m-%d"}[spec.transform]
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = col.cast(pa.timestamp(col.type.unit))
        keys = pc.strftime(col, format=fmt)
    elif spec.buckets is not None:
        uniques = pc.unique(col)
        mapping = pa.array([None if v is None else _bucket(v, spec.buckets) for v in uniques.to_pylist()], pa.string())
        keys = pc.take(mapping, pc.index_in(col, value_set=uniques))
    else:
        keys = col.cast(pa.string()) if not pa.types.is_string(col.type) else col
    return [k if k is not None else "null" for k in keys.to_pylist()]


def shard(rows: pa.Table, options: TableOptions, workers: int) -> list[Shard]:
    """Balanced shards per partition: at most ``max_rows_per_superfile`` rows each, and enough
    shards to keep the build pool busy when there are plenty of rows."""
    if rows.num_rows == 0:
        return []
    groups: list[tuple[str | None, pa.Table]]
    if options.partition is None:
        groups = [(None, rows)]
    else:
        keys = partition_keys(rows.column(options.partition.column), options.partition)
        key_array = pa.array(keys, pa.string())
        groups = [(key, rows.filter(pc.equal(key_array, pa.scalar(key)))) for key in sorted(set(keys))]
    shards: list[Shard] = []
    for key, table in groups:
        n = math.ceil(table.num_rows / options.max_rows_per_superfile)
        n = max(n, min(workers, table.num_rows // options.min_rows_per_shard), 1)
        bounds = [round(i * table.num_rows / n) for i in range(n + 1)]
        shards.extend(Shard(key, table.slice(a, b - a)) for a, b in itertools.pairwise(bounds))
    return shards
