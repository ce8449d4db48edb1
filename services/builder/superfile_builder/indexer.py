"""Indexer stage: accumulates one batch of events into an engine transaction, in log order.

Consecutive appends are validated one by one (a bad one is rejected alone)
and concatenated, then staged as one ``Transaction.append`` (each append
reserves ids with a storage round trip, so per-event appends would cost a
round trip per event). A delete or update first stages the appends before it,
so it sees them, exactly as the log orders them. The engine builds superfiles
as the transaction's buffer fills and at commit (sharding, indexes,
summaries).

An event carrying an ``idempotency_key`` (a caller's
``append(..., idempotency_key=...)``, or the gateway's ``Idempotency-Key`` of
any write, sent through the log) is skipped as a ``duplicate`` when the table
already recorded the key (or this batch staged it); otherwise it is staged
with its key, which the commit records. The check happens here, per event,
after the commit in flight has landed, so a known key never touches the rest
of the batch. A keyed restore records its key in its own commit.

An event the engine rejects (schema mismatch, bad predicate, an update whose
replacement rows do not match the row count) is skipped as ``rejected``: the
engine validates before it stages anything, so the transaction is unchanged.

A restore cannot join a transaction (``Supertable.restore`` is its own
commit). The pipeline starts a new batch at a restore, so the restore runs
first in its batch, once the commit before it has landed and the publisher's
fencing check has passed against the table's current properties; the events
after it are staged on top of the restored contents. The restore keeps the
commit properties, so the table still records the batch's start offset: a
builder that dies before the batch commits re-reads the restore and repeats
it, which changes nothing (the contents already are that version's). A
restore of a version no longer retained is ``rejected``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import pyarrow as pa
from superfile.commit.requirements import Requirement
from superfile.errors import InvalidInputError, VersionNotFoundError
from superfile.events import Event
from superfile.schema import coerce
from superfile.table import Supertable, Transaction

from superfile_builder.processor import DUPLICATE, Processed

__all__ = ["REJECTED", "Batch"]

log = logging.getLogger(__name__)

REJECTED = "rejected"


class Batch:
    """The events of one commit: a contiguous offset range of the table's log starting at ``start``."""

    def __init__(
        self,
        table: Supertable,
        start: int,
        requires: Sequence[Requirement] = (),
        *,
        ready: Callable[[], None] | None = None,
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.table = table
        self.start = start
        self._requires = tuple(requires)  # what the table must still say when the batch commits (fencing)
        self._ready = ready  # called before the table is consulted (the batch before must be in it by then)
        self._guard = guard  # raises if this builder may no longer write the table (before a restore)
        self.end = start  # next offset to consume: the log_offsets this batch commits
        self.rows = 0  # rows staged by appends and updates
        self.nbytes = 0  # record bytes consumed
        self.events = 0  # events applied
        self.first_at: float | None = None  # monotonic time of the first record
        self.skipped: dict[str, int] = {}
        self._tx: Transaction | None = None
        self._pending: list[pa.Table] = []
        self.keys: set[str] = set()  # idempotency keys this batch's commit records

    @property
    def empty(self) -> bool:
        return self.end == self.start

    @property
    def staged(self) -> bool:
        """Whether a commit of this batch would write something besides the log position."""
        return self._tx is not None or bool(self._pending)

    def transaction(self) -> Transaction:
        """The transaction (opened on the latest snapshot at the first event, or now), with everything staged."""
        if self._tx is None:
            self._tx = self.table.transaction(requires=self._requires)
        self._stage_appends()
        return self._tx

    def add(self, processed: Processed) -> str | None:
        """Take one record's outcome; returns the skip reason, if it was not applied."""
        if processed.offset < self.end:
            raise ValueError(f"offset {processed.offset} is behind the batch end {self.end}")
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.end = processed.offset + 1
        self.nbytes += processed.nbytes
        reason = processed.skipped
        if processed.event is not None:
            try:
                reason = self._apply(processed.event)
                if reason is None:
                    self.events += 1
            except InvalidInputError as exc:
                log.error("table %s: rejecting event at offset %d: %s", self.table.name, processed.offset, exc)
                reason = REJECTED
        if reason is not None:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
        return reason

    def _apply(self, event: Event) -> str | None:
        if event.op == "restore":
            return self._restore(event)
        if event.op == "append":
            assert event.data is not None
            # rows the gateway checked against a newer schema than this handle's are checked against the table's
            # latest; rows checked against an older one still fit (coerce follows renames and drops)
            rows = self.table.coerce(event.data)
            key = event.idempotency_key
            if key is None:
                self._pending.append(rows)
            else:
                self._await_previous()
                if key in self.keys or self.table.idempotency_version(key) is not None:
                    return DUPLICATE
                self.transaction().append(rows, idempotency_key=key)
                self.keys.add(key)
            self.rows += rows.num_rows
            return None
        assert event.where is not None
        self._await_previous()  # the predicate resolves against the table: the batch before must be in it
        key = event.idempotency_key  # a gateway request key: a retried request's second event is skipped
        if key is not None:
            if key in self.keys or self.table.idempotency_version(key) is not None:
                return DUPLICATE
            self.keys.add(key)
        if event.op == "delete":
            self.transaction().delete(event.where, idempotency_key=key)
        else:
            assert event.data is not None
            self.transaction().update(event.where, event.data, idempotency_key=key)
            self.rows += event.data.num_rows
        return None

    def _restore(self, event: Event) -> str | None:
        assert event.version is not None
        if self.staged:
            raise ValueError(f"a restore must come first in its batch (offset {self.start})")
        self._await_previous()
        if self._guard is not None:
            self._guard()
        try:
            self.table.restore(event.version, idempotency_key=event.idempotency_key)
        except VersionNotFoundError as exc:
            log.error("table %s: rejecting a restore: %s", self.table.name, exc)
            return REJECTED
        return None

    def _await_previous(self) -> None:
        if self._tx is None and self._ready is not None:
            self._ready()

    def _stage_appends(self) -> None:
        """Hand the accumulated appends to the transaction as one append (in the latest schema, when a schema
        change landed between them; the transaction follows it: ``Transaction._move_up``)."""
        if self._pending:
            assert self._tx is not None
            if any(not t.schema.equals(self._pending[-1].schema) for t in self._pending):
                latest = self.table.snapshot()
                self._pending = [coerce(t, latest.schema, latest.manifest.options) for t in self._pending]
            rows = pa.concat_tables(self._pending)
            self._pending = []
            self._tx.append(rows)
