"""Publisher stage: commits a batch with the log position it reached, fenced against other builders.

The commit records, atomically with the data, ``log_offsets`` (the next offset
to apply), ``log_sources`` (each source's highest applied seq) and
``log_fences`` (the lease fence of the builder that committed). Its
precondition, run by the engine against the manifest each publish attempt
builds on, requires that this manifest still records the offset the batch
started from and no newer fence, and that the lease is still held. A builder
whose lease expired and was taken over therefore cannot double-apply or
overwrite: the new holder either committed first (the offset moved on) or
commits after (its own precondition then fails and it re-reads). The pointer
swap itself stays guarded by the storage's conditional put.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from superfile.errors import ContentionError
from superfile.events import LOG_PROPERTY, SOURCES_PROPERTY
from superfile.manifest.model import ManifestList

from superfile_builder.indexer import Batch
from superfile_builder.lease import Lease

__all__ = ["FENCE_PROPERTY", "FencedError", "Publisher", "applied_offset"]

# {topic: fence of the lease the last commit was made under}
FENCE_PROPERTY = "log_fences"


class FencedError(ContentionError):
    """The table moved on under this batch (another builder committed, or the lease was lost): nothing committed."""


def applied_offset(properties: Mapping[str, Any], topic: str) -> int:
    """The next offset of ``topic`` a manifest with these commit properties has not applied."""
    return int(properties.get(LOG_PROPERTY, {}).get(topic, 0))


class Publisher:
    """Commits the batches of one table's topic under one lease."""

    def __init__(self, topic: str, lease: Lease) -> None:
        self.topic = topic
        self.lease = lease
        self._logged: dict[str, dict[str, Any]] = {}

    def reset(self, properties: Mapping[str, Any]) -> None:
        """Carry on from a manifest's log properties (other topics' entries are kept as they are)."""
        self._logged = {key: dict(properties.get(key, {})) for key in (LOG_PROPERTY, SOURCES_PROPERTY, FENCE_PROPERTY)}

    def precondition(self, start: int) -> Callable[[ManifestList], None]:
        """The check a batch starting at offset ``start`` commits under (given to its transaction)."""
        fence = self.lease.fence
        return lambda base: self._check(base.properties, start, fence)

    def guard(self, properties: Callable[[], Mapping[str, Any]], start: int) -> Callable[[], None]:
        """The same check against the table's current properties, for a write that cannot carry a
        precondition (a restore): run just before it, it narrows a zombie's window to that one call."""
        fence = self.lease.fence
        return lambda: self._check(properties(), start, fence)

    def _check(self, properties: Mapping[str, Any], start: int, fence: int) -> None:
        applied = applied_offset(properties, self.topic)
        if applied != start:
            raise FencedError(
                f"{self.topic}: the table has applied up to offset {applied}, this batch starts at {start}"
            )
        committed_fence = int(properties.get(FENCE_PROPERTY, {}).get(self.topic, 0))
        if committed_fence > fence:
            raise FencedError(f"{self.topic}: fence {committed_fence} committed, this builder holds {fence}")
        if not self.lease.valid():
            raise FencedError(f"{self.topic}: the lease on table {self.lease.table!r} is no longer held")

    def commit(self, batch: Batch, sources: dict[str, list[int]]) -> int:
        """Publish the batch with its log position; returns the new version. Raises FencedError."""
        if not self.lease.valid():
            raise FencedError(f"{self.topic}: the lease on table {self.lease.table!r} is no longer held")
        # The precondition guarantees no other builder committed since the batch's start, so the log
        # properties as of then (kept by reset() and our own commits) are the ones the commit builds on.
        logged = {
            LOG_PROPERTY: {**self._logged.get(LOG_PROPERTY, {}), self.topic: batch.end},
            SOURCES_PROPERTY: {**self._logged.get(SOURCES_PROPERTY, {}), **sources},
            FENCE_PROPERTY: {**self._logged.get(FENCE_PROPERTY, {}), self.topic: self.lease.fence},
        }
        tx = batch.transaction()
        tx.set_properties(**logged)
        version = tx.commit()
        if batch.keys and batch.table.properties.get(LOG_PROPERTY, {}).get(self.topic) != batch.end:
            # Another writer recorded one of the batch's idempotency keys first: the engine then publishes
            # nothing for the whole transaction. Resuming re-reads the batch, and the key is skipped.
            raise ContentionError(f"{self.topic}: an idempotency key of this batch was committed concurrently")
        self._logged = logged
        return version
