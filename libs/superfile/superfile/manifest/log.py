"""The version history, off the commit path: a short tail in each manifest list, older entries in segments.

A table that commits every second for months has millions of versions; a
manifest list that carried them all was rewritten and parsed on every commit
and open (54 ms per 1-row append at 3,000 versions, 205 ms to open). So each
manifest list carries only its newest ``TAIL`` entries (its own last). When
the tail is full, the commit writes it out as an immutable *segment*
(``_manifests/history/``, create-only, linked to the previous segment) and
starts a new tail; every ``CHECKPOINT_EVERY``-th segment is a *checkpoint*
instead: every retained entry up to it, linked to nothing. Reading the whole
history is then one checkpoint, at most ``CHECKPOINT_EVERY - 1`` segments and
the tail; commit and open read and write a bounded amount whatever the
history's length (the checkpoint, once every ``TAIL * CHECKPOINT_EVERY``
commits, is the one write that grows with the retained history).

Segments are immutable and written before the manifest list that names them,
so a writer killed while writing one leaves an unreferenced file (``cleanup``
removes it) and the table at its last commit. A checkpoint leaves out versions
below the retention mark (``_retention.json``): that is how ``cleanup`` trims
the history.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from superfile._lru import LRU
from superfile.errors import ObjectNotFoundError, PreconditionFailedError
from superfile.io import Storage, write_new
from superfile.manifest.model import HistoryEntry, ManifestList, now_ms

__all__ = [
    "CHECKPOINT_EVERY",
    "RETENTION",
    "SEGMENTS",
    "TAIL",
    "Segment",
    "full_history",
    "newest_first",
    "next_history",
    "oldest_retained",
    "segment_paths",
    "set_oldest_retained",
]

TAIL = 64  # history entries a manifest list carries
CHECKPOINT_EVERY = 16  # every 16th segment holds the whole retained history
SEGMENTS = "_manifests/history/"
RETENTION = "_retention.json"
_CACHE = LRU(256)  # segments are immutable: shared by every handle in the process, keyed by storage and path


@dataclass(frozen=True)
class Segment:
    """Entries written out of manifest lists, oldest first; ``previous`` is the segment before (None: this
    is a checkpoint, or the first segment)."""

    entries: tuple[HistoryEntry, ...]
    previous: str | None

    def to_bytes(self) -> bytes:
        body = {"entries": [e.to_json() for e in self.entries], "previous": self.previous}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Segment:
        d = json.loads(data)
        return cls(tuple(HistoryEntry.from_json(e) for e in d["entries"]), d["previous"])


def oldest_retained(storage: Storage) -> int:
    """The oldest version cleanup has not expired (1 if cleanup never ran)."""
    try:
        return int(json.loads(storage.read(RETENTION))["oldest_version"])
    except ObjectNotFoundError:
        return 1


def set_oldest_retained(storage: Storage, version: int) -> None:
    """Raise the retention mark, never lower it (a slower concurrent cleanup may have computed less):
    a compare-and-swap, so two cleanups cannot interleave a read and a write."""
    body = json.dumps({"oldest_version": version, "at_ms": now_ms()}).encode()
    while True:
        try:
            data, etag = storage.read_with_etag(RETENTION)
        except ObjectNotFoundError:
            try:
                storage.write_if_absent(RETENTION, body)
                return
            except PreconditionFailedError:
                continue  # another cleanup created it first: compare with its mark
        if int(json.loads(data)["oldest_version"]) >= version:
            return
        try:
            storage.write_if_match(RETENTION, body, etag)
            return
        except PreconditionFailedError:
            continue


def _load(storage: Storage, path: str) -> Segment:
    seg, _ = _CACHE.get_or_load(f"{storage.uri}\0{path}", lambda: Segment.from_bytes(storage.read(path)))
    return seg


def next_history(
    storage: Storage, current: ManifestList, entry: HistoryEntry
) -> tuple[tuple[HistoryEntry, ...], str | None, int]:
    """The history fields of the version after ``current`` (tail, segment, segments since the checkpoint):
    ``entry`` appended to the tail, or, when the tail is full, the tail written out first."""
    if len(current.history_tail) < TAIL:
        return (*current.history_tail, entry), current.history_segment, current.history_depth
    if current.history_depth + 1 >= CHECKPOINT_EVERY or len(current.history_tail) > TAIL:
        # a checkpoint: everything retained so far (an old-format list's tail is its whole history)
        oldest = oldest_retained(storage)
        everything = [e for e in full_history(storage, current) if e.version >= oldest]
        segment, depth = Segment(tuple(everything), None), 0
    else:
        segment, depth = Segment(current.history_tail, current.history_segment), current.history_depth + 1
    first, last = segment.entries[0].version, segment.entries[-1].version
    path = f"{SEGMENTS}{first:020d}-{last:020d}-{uuid.uuid4().hex}.json"
    write_new(storage, path, segment.to_bytes())
    return (entry,), path, depth


def segment_paths(storage: Storage, newest: str | None) -> Iterator[str]:
    """The paths of the segment ``newest`` and of those before it, newest first (read as far as iterated)."""
    path = newest
    while path is not None:
        yield path
        path = _load(storage, path).previous


def newest_first(storage: Storage, ml: ManifestList) -> Iterator[HistoryEntry]:
    """``ml``'s history from its own version back, reading segments only as far as the caller iterates."""
    yield from reversed(ml.history_tail)
    for path in segment_paths(storage, ml.history_segment):
        yield from reversed(_load(storage, path).entries)


def full_history(storage: Storage, ml: ManifestList) -> tuple[HistoryEntry, ...]:
    """``ml``'s whole recorded history, oldest first."""
    return tuple(reversed(list(newest_first(storage, ml))))
