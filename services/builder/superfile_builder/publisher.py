"""Publisher stage: commits a batch with the log position it reached, fenced against other builders.

The commit records, atomically with the data, ``log_offsets`` (the next offset
to apply), ``log_sources`` (each source's highest applied seq) and
``log_fences`` (the lease fence of the builder that committed). It carries
requirements (values of ``superfile.commit.requirements``) that the engine
checks against the manifest each publish attempt builds on: this manifest
still records the offset the batch started from
(``AssertPropertyEquals(("log_offsets", topic), start)``) and no newer fence
(``AssertPropertyAtMost(("log_fences", topic), fence)``), and the attempt
starts while the lease is held (``AssertBefore(deadline)``: the lease's
deadline as of the moment the batch's superfiles are built and uploaded, just
before the metadata commit). A builder whose lease expired and was taken over
therefore cannot double-apply or overwrite: the new holder either committed
first (the offset moved on) or commits after (its own offset requirement then
fails and it re-reads). The pointer swap itself stays guarded by the storage's
conditional put. A failed requirement surfaces as :class:`FencedError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from superfile.commit.requirements import (
    AssertBefore,
    AssertPropertyAtMost,
    AssertPropertyEquals,
    Requirement,
    RequirementFailedError,
)
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

    def precondition(self, start: int) -> tuple[Requirement, ...]:
        """The requirements a batch starting at offset ``start`` commits under (given to its transaction): the
        table still records ``start`` as this topic's applied offset, and no fence newer than this builder's
        lease committed. The lease's own deadline is added at commit (:meth:`commit`)."""
        return (
            AssertPropertyEquals((LOG_PROPERTY, self.topic), start, default=0),
            AssertPropertyAtMost((FENCE_PROPERTY, self.topic), self.lease.fence, default=0),
        )

    def guard(self, manifest: Callable[[], ManifestList], start: int) -> Callable[[], None]:
        """The same check against the table's current manifest, for a write that cannot carry requirements
        (a restore): run just before it, it narrows a zombie's window to that one call."""
        requires = self.precondition(start)

        def check() -> None:
            current = manifest()
            for requirement in requires:
                try:
                    requirement.check(current)
                except RequirementFailedError as exc:
                    raise self._fenced(exc) from exc
            if not self.lease.valid():
                raise self._lost()

        return check

    def _fenced(self, failed: RequirementFailedError) -> FencedError:
        """The builder's reading of a requirement that failed."""
        requirement = failed.requirement
        if isinstance(requirement, AssertPropertyEquals):
            return FencedError(
                f"{self.topic}: the table has applied up to offset {failed.actual}, "
                f"this batch starts at {requirement.value}"
            )
        if isinstance(requirement, AssertPropertyAtMost):
            return FencedError(f"{self.topic}: fence {failed.actual} committed, this builder holds {requirement.value}")
        if isinstance(requirement, AssertBefore):
            return self._lost()
        return FencedError(f"{self.topic}: {failed}")

    def _lost(self) -> FencedError:
        return FencedError(f"{self.topic}: the lease on table {self.lease.table!r} is no longer held")

    def commit(self, batch: Batch, sources: dict[str, list[int]]) -> int:
        """Publish the batch with its log position; returns the new version. Raises FencedError."""
        if not self.lease.valid():
            raise self._lost()
        # The requirements guarantee no other builder committed since the batch's start, so the log
        # properties as of then (kept by reset() and our own commits) are the ones the commit builds on.
        logged = {
            LOG_PROPERTY: {**self._logged.get(LOG_PROPERTY, {}), self.topic: batch.end},
            SOURCES_PROPERTY: {**self._logged.get(SOURCES_PROPERTY, {}), **sources},
            FENCE_PROPERTY: {**self._logged.get(FENCE_PROPERTY, {}), self.topic: self.lease.fence},
        }
        tx = batch.transaction()
        tx.set_properties(**logged)
        tx.flush()  # the batch's superfiles are built and uploaded: what is left is the metadata commit
        deadline = self.lease.deadline_ms()
        if deadline is None:
            raise self._lost()
        tx.require(AssertBefore(deadline))
        try:
            version = tx.commit()
        except RequirementFailedError as exc:
            raise self._fenced(exc) from exc
        if batch.keys and batch.table.properties.get(LOG_PROPERTY, {}).get(self.topic) != batch.end:
            # Another writer recorded one of the batch's idempotency keys first: the engine then publishes
            # nothing for the whole transaction. Resuming re-reads the batch, and the key is skipped.
            raise ContentionError(f"{self.topic}: an idempotency key of this batch was committed concurrently")
        self._logged = logged
        return version
