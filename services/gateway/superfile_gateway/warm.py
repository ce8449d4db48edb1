"""Warm on commit: a serving process follows the tables it serves and prepares each new version before its
searches meet it (docs/gateway.md, "Warm on commit").

:class:`FollowCommits` is the loop: every ``interval_s`` it reads each table's newest version, hands a new
one to an action, and then moves the table's handle to it (``Supertable.serve``), so a ``bounded`` read is
served a version that is already warm, as a search engine serves its last refreshed reader. A gateway's action
opens the version's superfiles and indexes here (:func:`warm`: downloads into the disk cache, checksums,
full-text extraction); a query service's has its cache nodes fetch them (``superfile_query.app.Warmer``); a
gateway that forwards its reads follows nothing."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Hashable

from superfile.errors import SuperfileError
from superfile.table import Supertable
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot

from superfile_gateway.instruments import WARM_SECONDS

__all__ = ["FollowCommits", "warm"]

log = logging.getLogger("superfile_gateway.warm")

_MIN_WAIT_S = 0.05  # a bounded table with a tiny staleness is not looked at in a busy loop


def warm(name: str, snapshot: Snapshot) -> None:
    """Open what the first search of ``snapshot`` would wait for, in this process (``Searcher.warm``)."""
    start = time.perf_counter()
    Searcher(snapshot).warm()
    WARM_SECONDS.observe(time.perf_counter() - start)


def _manifest(snapshot: Snapshot) -> Hashable:
    return snapshot.path


class FollowCommits:
    """A thread following the tables ``tables()`` names, one after another: for each, ``act(name, snapshot)``
    once per new version (``key`` tells versions apart), then the handle moves to that version.

    A ``bounded`` table is looked at every half of its ``max_staleness_s`` when that is sooner than
    ``interval_s``: each look renews the handle's staleness clock, so its reads neither wait for a pointer
    read nor meet a version that is not warm yet, while the action keeps up (else a read refreshes itself,
    as without this)."""

    def __init__(
        self,
        tables: Callable[[], list[Supertable]],
        act: Callable[[str, Snapshot], None],
        interval_s: float,
        *,
        key: Callable[[Snapshot], Hashable] = _manifest,
        forget: Callable[[str], None] | None = None,
    ) -> None:
        """``forget(name)``: called when a table drops out of ``tables()`` (dropped, or no longer used)."""
        self._tables = tables
        self._act = act
        self._key = key
        self._forget = forget
        self._interval_s = interval_s
        self._wait_s = interval_s
        self._seen: dict[str, Hashable] = {}  # table name -> key of the version last acted on
        self._followed: list[Supertable] = []
        self._listed = -math.inf  # when tables() was last asked (monotonic): once per interval_s, not per look
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="superfile-warm-on-commit", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._wait_s):
            try:
                self.once()
            except SuperfileError as e:  # listing the tables failed: storage away, say; the next look retries
                log.warning("warm on commit: %s", e)
            except Exception:
                log.exception("warm on commit failed")

    def once(self) -> None:
        """Act on each table whose version changed since the last look, and move its handle there. The tables
        are listed again once ``interval_s`` has passed (a query service lists the storage for them)."""
        if time.monotonic() - self._listed >= self._interval_s:
            self._followed = self._tables()
            self._listed = time.monotonic()
            for gone in set(self._seen) - {t.name for t in self._followed}:  # dropped, or idle: acted on afresh
                del self._seen[gone]
                if self._forget is not None:
                    self._forget(gone)
        wait = self._interval_s
        for table in self._followed:
            if self._stop.is_set():
                break
            if table.consistency == "bounded":
                staleness = table.last_snapshot.manifest.options.max_staleness_s
                wait = min(wait, max(_MIN_WAIT_S, staleness / 2))
            try:
                snapshot, checked = table.newest()
                seen = self._key(snapshot)
                if self._seen.get(table.name) != seen:
                    self._act(table.name, snapshot)
                    self._seen[table.name] = seen
                table.serve(snapshot, checked)
            except SuperfileError as e:  # a table dropped, storage away: a search reports it; the next look retries
                log.warning("warming %s: %s", table.name, e)
            except Exception:
                log.exception("warming %s failed", table.name)
        self._wait_s = wait

    def close(self) -> None:
        self._stop.set()
