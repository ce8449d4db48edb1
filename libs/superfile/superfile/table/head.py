"""The first rows of a scan without the whole scan: a ``LIMIT`` pushed down to the superfiles a snapshot reads."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from superfile.errors import InvalidInputError, UnknownColumnError
from superfile.manifest.model import SuperfileEntry
from superfile.pools import query_threads
from superfile.table.snapshot import Snapshot

__all__ = ["head"]


def head(snap: Snapshot, limit: int, columns: Sequence[str] | None = None, where: str | None = None) -> pa.Table:
    """The first ``limit`` rows ``Snapshot.scan`` returns for ``columns`` and the SQL predicate ``where``
    (what ``Table.to_arrow`` reads), reading superfiles in the scan's order only until ``limit`` of them are
    gathered: one superfile first, then waves of twice as many (up to the query threads) read in parallel,
    so a selective ``where`` still reads no more than it must. Always in this process: a snapshot with a
    fan-out to cache nodes reads its few superfiles here too."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}")
    names = list(columns) if columns is not None else list(snap.schema.names)
    unknown = [c for c in names if c not in snap.schema.names]
    if unknown:
        raise UnknownColumnError(f"unknown columns {unknown}; the table has {snap.schema.names}")
    predicate = snap.predicate(where)
    entries = sorted(snap.entries(predicate), key=lambda e: (e.id_min, e.path))
    if not entries:
        return snap.scan(names, predicate)  # no superfile to read: the typed empty result

    def read(wave: list[SuperfileEntry]) -> list[pa.Table]:
        threads = len(wave) == 1  # a single superfile decodes on Arrow's threads; a wave uses one per file
        return snap.map(lambda e: snap.read_matching(e, names, predicate, use_threads=threads), wave)

    tables: list[pa.Table] = []
    found, start, size = 0, 0, 1
    while start < len(entries) and found < limit:
        wave = entries[start : start + size]
        start += len(wave)
        for table in read(wave):
            tables.append(table)
            found += table.num_rows
        size = min(2 * size, max(1, query_threads()))
    return pa.concat_tables(tables).slice(0, limit).combine_chunks()
