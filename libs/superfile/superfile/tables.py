"""The tables below one storage root, as the engine reads them: the storage, the caches shared by its tables,
each table's files, opening a handle on the latest version, and namespaces.

A namespace (``team``) is a marker object under ``_namespaces/``; a table in it is named ``team.docs`` and
keeps its files at that full name, one path component, so a namespace's tables never share a prefix
with any other table's.

``Connection`` is the catalog built on it (create, drop, SQL, maintenance, a fleet); the compaction process
opens its tables through it too, so maintenance never imports the connection that runs it.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from superfile.errors import (
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    PreconditionFailedError,
    TableNotFoundError,
    UpgradeRequiredError,
)
from superfile.format.reader import DEFAULT_CACHE_DIR
from superfile.io import Storage, from_uri, write_new
from superfile.io.cache import DEFAULT_BUDGET_BYTES, DiskCache
from superfile.manifest.model import FORMAT_VERSION, now_ms
from superfile.manifest.store import POINTER
from superfile.table import Supertable
from superfile.table.snapshot import Fanout, Snapshot, TableFiles
from superfile.validate import check_name, is_name, namespace_of

__all__ = ["NAMESPACES", "TableRoot"]

# One object per namespace below this prefix ('_' cannot begin a table name, so no table's files are here).
NAMESPACES = "_namespaces/"


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

    def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table (full dotted names), or of the tables directly in ``namespace``; sorted."""
        if namespace is not None:
            self.require_namespace(check_name(namespace, "namespace"))
        return sorted(n for n in self._tables() if namespace is None or namespace_of(n) == namespace)

    # -- namespaces: a marker object each; a table's files stay at its full dotted name ------------------
    def namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace (full dotted names), or the ones directly inside ``parent``; sorted."""
        if parent is not None:
            self.require_namespace(check_name(parent, "namespace"))
        return sorted(n for n in self._namespaces() if parent is None or namespace_of(n) == parent)

    def require_namespace(self, name: str | None) -> None:
        """Raise NamespaceNotFoundError unless ``name`` (None: the root) exists."""
        if name is not None and not self.storage.exists(NAMESPACES + name):
            raise NamespaceNotFoundError(f"namespace {name!r} does not exist")

    def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create ``name``; its parent (``team`` for ``team.docs``) must exist."""
        check_name(name, "namespace")
        self.require_namespace(namespace_of(name))
        try:
            # a marker of its own (a fresh id): write_new takes an object holding exactly its bytes for its own
            # create whose answer was lost, so two creates in one millisecond must not write the same bytes
            marker = {"name": name, "created_ms": now_ms(), "id": uuid.uuid4().hex}
            write_new(self.storage, NAMESPACES + name, json.dumps(marker).encode())
        except PreconditionFailedError:
            if not exist_ok:
                raise NamespaceExistsError(f"namespace {name!r} already exists") from None

    def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace (no tables, no namespaces inside)."""
        self.require_namespace(check_name(name, "namespace"))
        inside = [n for n in (*self._tables(), *self._namespaces()) if namespace_of(n) == name]
        if inside:
            raise NamespaceNotEmptyError(f"namespace {name!r} is not empty: it holds {sorted(inside)[:5]}")
        self.storage.delete(NAMESPACES + name)

    def _tables(self) -> list[str]:
        """The folders at the root holding a table pointer: one listing of folder names and a look-up per
        folder, never a listing of every table's files (a builder looks for new tables every few seconds)."""
        return [name for name in self.storage.folders() if is_name(name) and self.storage.exists(f"{name}/{POINTER}")]

    def _namespaces(self) -> list[str]:
        return [info.path[len(NAMESPACES) :] for info in self.storage.list(NAMESPACES)]

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
