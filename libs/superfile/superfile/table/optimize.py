"""Compaction: merge small superfiles of a partition into target-size ones and materialize deletion vectors.

The plan (``plan``): per partition, the superfiles under half the target
size and those with deleted rows are rewritten into ``ceil(rows / target)``
balanced outputs, in ``_id`` order. The rewrite reads the live rows of the chosen superfiles from one snapshot,
builds new superfiles (rows keep their ``_id``), and publishes them with the
same guarded commit as every write (operation ``optimize``): the change
removes the inputs and adds the outputs. Appends that land meanwhile are
untouched. A delete that lands on an input after it was read is not lost: on
the publish attempt that sees it, the newly deleted offsets are mapped
through ``_id`` to offsets of the new superfiles and carried as their
deletion vector (the change's ``Carry`` holds the outputs' ``_id``s; publish
does the mapping, ``commit/rebase.py``). Only a concurrent rewrite of the same inputs (another
optimize, a restore) makes the publish fail; then the compaction is redone
from the newer snapshot.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from superfile.commit.build import build_shards
from superfile.commit.change import Carry, Change, StaleSuperfileError, id_bytes
from superfile.commit.publish import locate
from superfile.commit.shard import Shard
from superfile.errors import InvalidOptionError
from superfile.evolution import schema_id
from superfile.manifest.model import SuperfileEntry
from superfile.manifest.store import backoff
from superfile.options import TableOptions
from superfile.pools import build_threads
from superfile.schema import ID
from superfile.table.snapshot import Snapshot

if TYPE_CHECKING:
    from superfile.table import Supertable

__all__ = ["Plan", "optimize", "plan", "stale", "unindexed"]

_ATTEMPTS = 5

# Which superfiles to rewrite, per partition, given every superfile and the target rows.
Plan = Callable[[list[SuperfileEntry], int], dict[str | None, list[SuperfileEntry]]]


# Bounds on the target size: a compaction aims at superfiles a reader can still map and search.
MAX_TARGET_ROWS = 1 << 31
MAX_TARGET_BYTES = 1 << 40


def _positive(name: str, value: object, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidOptionError(f"{name} must be a positive integer of at most {maximum}, got {value!r}")
    return value


def all_entries(snap: Snapshot) -> list[SuperfileEntry]:
    """Every superfile of the snapshot, fully deleted ones included (``Snapshot.entries`` skips those)."""
    parts = snap.map(lambda p: snap.files.manifests.load_part(p, snap.schema), list(snap.manifest.parts))
    return [e for entries in parts for e in entries]


def _target_rows(entries: list[SuperfileEntry], snap: Snapshot, rows: int | None, nbytes: int | None) -> int:
    if rows is not None and nbytes is not None:
        raise InvalidOptionError("give target_rows or target_bytes, not both")
    if rows is not None:
        return _positive("target_rows", rows, MAX_TARGET_ROWS)
    if nbytes is not None:
        _positive("target_bytes", nbytes, MAX_TARGET_BYTES)
        total_rows = sum(e.rows for e in entries)
        per_row = sum(e.size for e in entries) / total_rows if total_rows else 1.0
        return max(1, int(nbytes / per_row))
    return snap.manifest.options.max_rows_per_superfile


def plan(entries: list[SuperfileEntry], target: int) -> dict[str | None, list[SuperfileEntry]]:
    """Per partition, the superfiles worth rewriting: the small ones (under half the target; if merging
    reduces their number) and every one with deleted rows.

    Half, because the outputs are balanced: ``n >= 2`` outputs of ``R`` rows hold more than
    ``R / n > target * (n - 1) / n >= target / 2`` rows each, so a later compaction leaves them alone and
    only merges what arrived since (a single small output is merged again, with the next small files).
    """
    by_partition: dict[str | None, list[SuperfileEntry]] = defaultdict(list)
    for e in entries:
        if e.deletes is not None or 2 * e.live_rows < target:
            by_partition[e.partition].append(e)
    plan = {}
    for partition, chosen in by_partition.items():
        outputs = math.ceil(sum(e.live_rows for e in chosen) / target)
        if len(chosen) > outputs or any(e.deletes is not None for e in chosen):
            plan[partition] = sorted(chosen, key=lambda e: (e.id_min, e.path))
    return plan


def unindexed(entry: SuperfileEntry, options: TableOptions) -> bool:
    """Whether the superfile lacks one of the table's full-text or vector indexes (created after it was
    written: its entry has the column's summary exactly when its file holds the current index)."""
    return any(c not in entry.text for c in options.fts_columns) or any(
        c not in entry.vectors for c in options.vector_columns
    )


def stale(options: TableOptions) -> Plan:
    """A selection: per partition, the superfiles with live rows that lack an index of ``options`` (rewriting
    them builds it: ``table/evolve.py``)."""

    def select(entries: list[SuperfileEntry], target: int) -> dict[str | None, list[SuperfileEntry]]:
        chosen: dict[str | None, list[SuperfileEntry]] = {}
        for e in entries:
            if e.live_rows and unindexed(e, options):
                chosen.setdefault(e.partition, []).append(e)
        return {p: sorted(files, key=lambda e: (e.id_min, e.path)) for p, files in chosen.items()}

    return select


def _shards(snap: Snapshot, partition: str | None, chosen: list[SuperfileEntry], target: int) -> Iterator[Shard]:
    """Balanced shards (ceil(rows / target) of them) streamed from the inputs, each sorted by ``_id``."""
    total = sum(e.live_rows for e in chosen)
    if not total:
        return
    n = math.ceil(total / target)
    sizes = [round((i + 1) * total / n) - round(i * total / n) for i in range(n)]
    columns = list(snap.schema.names)
    buffered: list[pa.Table] = []
    have = 0
    for e in chosen:
        offsets = snap.live_offsets(e)
        if len(offsets):
            buffered.append(snap.read_rows(e, offsets, columns))
            have += len(offsets)
        while sizes and have >= sizes[0]:
            rows = pa.concat_tables(buffered).combine_chunks()
            cut = sizes.pop(0)
            yield Shard(partition, rows.slice(0, cut).sort_by(ID))
            buffered, have = [rows.slice(cut)], rows.num_rows - cut


class _Rewrite:
    """One compaction's outputs, and the ``_id``s of their rows (what publish needs to carry deletes that land
    on the inputs meanwhile onto them: a :class:`~superfile.commit.change.Carry`)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.added: list[SuperfileEntry] = []
        self._ids: dict[str, bytes] = {}  # per added superfile: the _id of each row, in offset order (ascending)

    def add(self, shards: list[Shard]) -> None:
        if not shards:
            return
        built = build_shards(shards, self.snap.manifest.options, self.snap.files.storage, schema_id(self.snap.schema))
        self.added.extend(built)
        for entry, s in zip(built, shards, strict=True):
            self._ids[entry.path] = id_bytes(np.asarray(s.rows.column(ID).to_numpy(), np.uint64))

    def carry(self) -> Carry:
        return Carry(dict(self._ids))


def _once(
    table: Supertable, target_rows: int | None, target_bytes: int | None, select: Plan, parallel: bool
) -> dict[str, Any]:
    snap, pointer = table.writable_snapshot()
    entries = all_entries(snap)
    target = _target_rows(entries, snap, target_rows, target_bytes)
    chosen_by_partition = select(entries, target)
    if select is plan:  # a full optimize also builds indexes created since some superfiles were written
        for partition, files in stale(snap.manifest.options)(entries, target).items():
            have = {e.path for e in chosen_by_partition.get(partition, [])}
            merged = chosen_by_partition.get(partition, []) + [e for e in files if e.path not in have]
            chosen_by_partition[partition] = sorted(merged, key=lambda e: (e.id_min, e.path))
    rewrite = _Rewrite(snap)
    batch: list[Shard] = []
    workers = build_threads() if parallel else 1
    for partition, chosen in chosen_by_partition.items():
        for s in _shards(snap, partition, chosen, target):
            batch.append(s)
            if len(batch) >= workers:
                rewrite.add(batch)
                batch = []
    rewrite.add(batch)
    removed = {e.path: e for chosen in chosen_by_partition.values() for e in chosen}
    result = {
        "version": snap.version,
        "target_rows": target,
        "superfiles_removed": len(removed),
        "superfiles_added": len(rewrite.added),
        "rows_rewritten": sum(e.rows for e in rewrite.added),
        "deletes_carried": 0,
    }
    if not removed:
        return result
    change = Change(
        table_uuid=snap.manifest.table_uuid,
        operation="optimize",
        added=tuple(rewrite.added),
        removed=removed,
        carry=rewrite.carry(),
    )
    _, manifest = table.commit(change, base=pointer)
    table.files.release(removed)  # the inputs: this process reads the outputs from now on
    # the outputs start without deletes: any they have in the version published were carried onto them
    outputs = locate(manifest, table.files.manifests, rewrite.added).values()
    carried = sum(e.deletes.count for _, e in outputs if e.deletes is not None)
    return {**result, "version": manifest.version, "deletes_carried": carried}


def optimize(
    table: Supertable,
    target_rows: int | None = None,
    target_bytes: int | None = None,
    *,
    select: Plan = plan,
    parallel: bool = True,
) -> dict[str, Any]:
    """Compact ``table`` (see the module docstring); returns what was done and the version it published.

    ``select`` narrows what is rewritten (a background compactor bounds its work per run with it);
    ``parallel=False`` builds the outputs one at a time on the calling thread, leaving the build pool to
    the writes it runs beside."""
    for attempt in range(_ATTEMPTS):
        try:
            return _once(table, target_rows, target_bytes, select, parallel)
        except StaleSuperfileError:  # a concurrent rewrite replaced our inputs: redo on the newer snapshot
            if attempt == _ATTEMPTS - 1:
                raise
            backoff(attempt, base=0.05)
    raise AssertionError("unreachable")
