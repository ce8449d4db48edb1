"""The tables below one storage root, as the engine reads them: the storage, the caches shared by its tables,
each table's files, and opening a handle on the latest version.

``Connection`` is the catalog built on it (create, drop, SQL, maintenance, a fleet); the compaction process
opens its tables through it too, so maintenance never imports the connection that runs it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from superfile.errors import TableNotFoundError, UpgradeRequiredError
from superfile.format.reader import DEFAULT_CACHE_DIR
from superfile.io import Storage, from_uri
from superfile.io.cache import DEFAULT_BUDGET_BYTES, DiskCache
from superfile.manifest.model import FORMAT_VERSION
from superfile.manifest.store import POINTER
from superfile.table import Supertable
from superfile.table.snapshot import Fanout, Snapshot, TableFiles
from superfile.validate import check_name

__all__ = ["TableRoot"]


class TableRoot:
    """The storage at ``uri`` and what its tables share (see ``Connection`` for the options)."""

    def __init__(
        self,
        uri: str,
        *,
        verify_checksums: bool = True,
        cache_dir: str | None = None,
        cache_budget_bytes: int = DEFAULT_BUDGET_BYTES,
        cache_memory_bytes: int | None = None,
        storage: Storage | None = None,
        on_commit: Callable[[str], None] | None = None,
        fanout: Fanout | None = None,
        **storage_options: Any,
    ) -> None:
        self.uri = uri
        self.storage: Storage = storage if storage is not None else from_uri(uri, **storage_options)
        self._verify = verify_checksums
        self._cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self.disk_cache = (
            DiskCache(os.path.join(self._cache_dir, "superfiles"), cache_budget_bytes, cache_memory_bytes)
            if self.storage.remote and cache_budget_bytes
            else None
        )
        self._on_commit = on_commit
        self._fanout = fanout
        self._files: dict[str, TableFiles] = {}
        self._lock = threading.Lock()

    def files(self, name: str) -> TableFiles:
        """Table ``name``'s files (one object per table, shared by all its handles and snapshots)."""
        with self._lock:
            files = self._files.get(name)
            if files is None:
                on_commit = self._on_commit
                files = TableFiles(
                    self.storage.child(name),
                    verify=self._verify,
                    cache_dir=self._cache_dir,
                    disk_cache=self.disk_cache,
                    on_commit=None if on_commit is None else (lambda: on_commit(name)),
                    fanout=self._fanout,
                    name=name,
                )
                self._files[name] = files
            return files

    def forget(self, name: str) -> None:
        """Drop what is held for ``name`` (the table was dropped)."""
        with self._lock:
            self._files.pop(name, None)

    def table_names(self) -> list[str]:
        """Names of every table, sorted."""
        suffix = "/" + POINTER
        return sorted(
            info.path[: -len(suffix)]
            for info in self.storage.list("")
            if info.path.endswith(suffix) and info.path.count("/") == 1
        )

    def open(self, name: str, consistency: str | None = None) -> Supertable:
        """A handle on ``name`` at its latest version; a table in an older format is refused with the
        command that upgrades it."""
        check_name(name)
        files = self.files(name)
        try:
            pointer, _ = files.manifests.read_pointer()
        except TableNotFoundError:
            raise TableNotFoundError(f"table {name!r} does not exist") from None
        manifest = files.manifests.load_list(pointer.manifest)
        if manifest.format_version < FORMAT_VERSION:
            raise UpgradeRequiredError(
                f"table {name!r} is in format {manifest.format_version}, this version of superfile reads format "
                f"{FORMAT_VERSION}: run `superfile upgrade {self.uri} {name}` (or Connection.upgrade_table) once"
            )
        return Supertable(name, files, Snapshot(files, pointer.manifest, manifest), consistency=consistency)
