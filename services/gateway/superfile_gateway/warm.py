"""Warm on commit: each table this gateway used lately is looked at every ``warm_interval_s``; a new version's
superfiles and their indexes are opened in the background (``Searcher.warm``: downloads into the disk cache,
checksums, full-text extraction), so the search right after a commit does not wait for them (docs/gateway.md,
"Warm on commit"). A query service warms its cache nodes instead (``superfile_query.app.Warmer``); a gateway
that forwards its reads warms nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from superfile.errors import SuperfileError
from superfile.table import Supertable
from superfile.table.search import Searcher

from superfile_gateway.instruments import WARM_SECONDS

__all__ = ["WarmOnCommit"]

log = logging.getLogger("superfile_gateway.warm")


class WarmOnCommit:
    """A thread warming the newest version of the tables ``tables()`` names, one table after another."""

    def __init__(self, tables: Callable[[], list[Supertable]], interval_s: float) -> None:
        self._tables = tables
        self._interval_s = interval_s
        self._warmed: dict[str, str] = {}  # table name -> the manifest of the version last warmed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="superfile-warm-on-commit", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.once()

    def once(self) -> None:
        """Warm each table whose version changed since it was last warmed."""
        tables = self._tables()
        for gone in set(self._warmed) - {t.name for t in tables}:  # dropped, or idle: warmed afresh if used again
            del self._warmed[gone]
        for table in tables:
            if self._stop.is_set():
                break
            try:
                snap = table.snapshot()
                if self._warmed.get(table.name) == snap.path:
                    continue
                start = time.perf_counter()
                Searcher(snap).warm()
                WARM_SECONDS.observe(time.perf_counter() - start)
                self._warmed[table.name] = snap.path
            except SuperfileError as e:  # a table dropped, storage away: a search reports it; the next look retries
                log.warning("warming %s: %s", table.name, e)
            except Exception:
                log.exception("warming %s failed", table.name)

    def close(self) -> None:
        self._stop.set()
