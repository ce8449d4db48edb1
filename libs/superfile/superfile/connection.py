"""The Connection: the catalog of tables below one storage root (``connect(uri)``)."""

from __future__ import annotations

import asyncio
import datetime
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from superfile.api import Catalog
from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    ObjectNotFoundError,
    PreconditionFailedError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from superfile.io import Storage
from superfile.io.cache import DEFAULT_BUDGET_BYTES, DiskCache
from superfile.maintenance import AutoMaintenance, MaintenancePolicy
from superfile.manifest.model import HistoryEntry, ManifestList, Pointer, now_ms
from superfile.manifest.store import POINTER
from superfile.options import PartitionSpec
from superfile.remote.async_db import AsyncRemoteConnection
from superfile.remote.db import RemoteConnection
from superfile.schema import table_schema
from superfile.search.fleet import Fleet
from superfile.search.root import RootFanout
from superfile.table import Supertable
from superfile.table.history import upgrade
from superfile.table.snapshot import Snapshot
from superfile.tables import TableRoot
from superfile.threaded import ThreadedCatalog
from superfile.validate import check_name, create_schema, namespace_of, table_options

__all__ = ["Connection", "connect", "connect_async"]

_MANIFEST_PATH = re.compile(r"_manifests/[0-9]{1,20}-[0-9a-f]{8,64}\.json")


class Connection(Catalog):
    """Creates, opens, lists and drops the tables stored below one URI."""

    def __init__(
        self,
        uri: str,
        *,
        verify_checksums: bool = True,
        cache_dir: str | None = None,
        cache_budget_bytes: int = DEFAULT_BUDGET_BYTES,
        cache_memory_bytes: int | None = None,
        storage: Storage | None = None,
        maintenance: MaintenancePolicy | bool = False,
        cache_nodes: Sequence[str] | None = None,
        cache_dns: str | None = None,
        internal_token: str | None = None,
        **storage_options: Any,
    ):
        """``cache_dir``: where full-text indexes are extracted and, on remote storage, superfiles are cached
        (``cache_budget_bytes`` of them on disk, 0 to read each superfile into memory instead;
        ``cache_memory_bytes`` of their mappings resident, unbounded by default). See docs/storage.md. The
        superfiles open at once, every table's in the process, are bounded by the environment's
        ``SUPERFILE_OPEN_BYTES`` (bytes they hold; default a quarter of memory) and ``SUPERFILE_OPEN_FILES``
        (descriptors plus mappings; default 4096 or lower): docs/storage.md, "Open superfiles".
        ``storage``: the backend to use instead of the one ``uri`` names (a wrapper around it: fault
        injection, instrumentation). ``maintenance``: compact and clean up the tables this connection
        writes, in the background (True: the default :class:`MaintenancePolicy`; see docs/maintenance.md).
        ``cache_nodes`` (URLs) or ``cache_dns`` (``host:port`` of a headless service): run the per-superfile work
        of reads on those cache nodes (``superfile-cache``), sending ``internal_token``; this process becomes a
        query root (docs/query.md)."""
        self.uri = uri
        if isinstance(cache_budget_bytes, bool) or not isinstance(cache_budget_bytes, int) or cache_budget_bytes < 0:
            raise InvalidOptionError(f"cache_budget_bytes must be an integer >= 0, got {cache_budget_bytes!r}")
        self.fleet = (
            Fleet(list(cache_nodes or ()), dns=cache_dns, token=internal_token) if cache_nodes or cache_dns else None
        )
        self._root = TableRoot(
            uri,
            verify_checksums=verify_checksums,
            cache_dir=cache_dir,
            cache_budget_bytes=cache_budget_bytes,
            cache_memory_bytes=cache_memory_bytes,
            storage=storage,
            on_commit=self._committed,
            fanout=None if self.fleet is None else RootFanout(self.fleet),
            **storage_options,
        )
        worker_options = {"cache_dir": cache_dir, "cache_budget_bytes": cache_budget_bytes, **storage_options}
        if maintenance is True:
            maintenance = MaintenancePolicy()
        self.maintenance = (
            AutoMaintenance(uri, maintenance, self.open_table, worker_options)
            if isinstance(maintenance, MaintenancePolicy)
            else None
        )

    @property
    def disk_cache(self) -> DiskCache | None:
        """The cache of this connection's remote superfiles (None for local storage or with a zero budget)."""
        return self._root.disk_cache

    def _committed(self, name: str) -> None:
        if self.maintenance is not None:
            self.maintenance.committed(name)

    def table_names(self, namespace: str | None = None) -> list[str]:
        """Names of every table (``team.docs`` for one in a namespace), or of those directly in ``namespace``."""
        return self._root.table_names(namespace)

    def create_namespace(self, name: str, *, exist_ok: bool = False) -> None:
        """Create a namespace (``team``, or ``team.search`` inside an existing ``team``); tables in it are
        named ``team.docs``."""
        self._root.create_namespace(name, exist_ok=exist_ok)

    def list_namespaces(self, parent: str | None = None) -> list[str]:
        """Every namespace, or those directly inside ``parent``; full dotted names, sorted."""
        return self._root.namespaces(parent)

    def drop_namespace(self, name: str) -> None:
        """Remove an empty namespace (NamespaceNotEmptyError while it holds tables or namespaces)."""
        self._root.drop_namespace(name)

    def create_table(
        self,
        name: str,
        schema: pa.Schema | None = None,
        data: Any = None,
        *,
        fts_columns: Sequence[str] | Mapping[str, str] = (),
        vector_columns: Mapping[str, Any] | None = None,
        tokenizer: str | Mapping[str, str] = "english",
        partition: str | Mapping[str, str] | PartitionSpec | None = None,
        consistency: str = "strong",
        exist_ok: bool = False,
        **options: Any,
    ) -> Supertable:
        """Create a table from a schema (or from ``data``, whose schema it takes and which it appends)."""
        check_name(name)
        self._root.require_namespace(namespace_of(name))
        schema, data = create_schema(schema, data)
        opts = table_options(
            fts_columns=fts_columns,
            vector_columns=vector_columns,
            tokenizer=tokenizer,
            partition=partition,
            consistency=consistency,
            options=options,
        )
        full_schema = table_schema(schema, opts)
        files = self._root.files(name)
        if files.storage.exists(POINTER):
            if exist_ok:
                return self.open_table(name)
            raise TableExistsError(f"table {name!r} already exists")
        store = files.manifests
        store.init_sequence()
        table_uuid = uuid.uuid4().hex
        path = store.new_list_path(1)
        created = now_ms()
        manifest = ManifestList(
            table_uuid=table_uuid,
            version=1,
            parent=None,
            timestamp_ms=created,
            operation="create",
            schema=full_schema,
            options=opts,
            parts=(),
            history_tail=(HistoryEntry(1, path, created, "create", 0, 0, 0),),
        )
        store.write_list(manifest, path)
        try:
            store.create_pointer(Pointer(1, path, table_uuid))
        except PreconditionFailedError:  # another table's pointer (ours, met again after a lost answer, is success)
            if exist_ok:
                return self.open_table(name)
            raise TableExistsError(f"table {name!r} already exists") from None
        table = Supertable(name, files, Snapshot(files, path, manifest))
        if data is not None:
            table.append(data)
        return table

    def open_table(
        self,
        name: str,
        version: int | None = None,
        *,
        as_of: datetime.datetime | int | float | None = None,
        consistency: str | None = None,
    ) -> Supertable:
        """Open a table at its latest version, or read-only at an earlier ``version`` or at the version
        that was current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds)."""
        table = self._root.open(name, consistency)
        if version is None and as_of is None:
            return table
        return table.checkout(version, as_of=as_of)

    def snapshot(self, name: str, manifest: str | None = None) -> Snapshot:
        """A reader of ``name``: at its latest version, or pinned to one of its manifests (a path below
        ``_manifests/``), the version a query root planned a read against, which each of its leaves must
        read. Manifests are immutable, so every leaf reads the same one, whatever has been committed since."""
        check_name(name)
        if manifest is None:
            return self.open_table(name).last_snapshot  # opening read the latest pointer already
        if not _MANIFEST_PATH.fullmatch(manifest):
            raise InvalidInputError(f"{manifest!r} is not a manifest path (_manifests/<version>-<id>.json)")
        files = self._root.files(name)
        try:
            return Snapshot(files, manifest, files.manifests.load_list(manifest))
        except ObjectNotFoundError:
            raise VersionNotFoundError(f"table {name!r} has no manifest {manifest!r} (dropped or cleaned up)") from None

    def warm(self, name: str, superfiles: Sequence[tuple[str, int]]) -> int:
        """Copy the given superfiles (path, size) of ``name`` into the disk cache unless there already, so
        that the first query to need them does not wait for a download (a cache node warming what it owns
        after a commit or a restart). Returns how many were downloaded; 0 without a disk cache."""
        cache = self._root.disk_cache
        if cache is None:
            return 0
        storage = self._root.files(check_name(name)).storage
        before = cache.fetches
        for path, size in superfiles:
            if not cache.resident(storage, path):
                cache.fetch(storage, path, size)
        return cache.fetches - before

    def upgrade_table(self, name: str) -> int:
        """Convert a table written by an older superfile to the current format, in one commit (a table
        already current is left alone); returns its version."""
        check_name(name)
        try:
            return upgrade(self._root.files(name).manifests)
        except TableNotFoundError:
            raise TableNotFoundError(f"table {name!r} does not exist") from None

    def drop_table(self, name: str) -> None:
        """Remove a table: it disappears atomically (pointer first), then its files are deleted."""
        check_name(name)
        files = self._root.files(name)
        if not files.storage.exists(POINTER):
            raise TableNotFoundError(f"table {name!r} does not exist")
        files.storage.delete(POINTER)
        for info in list(files.storage.list("")):
            files.storage.delete(info.path)
        self._root.forget(name)

    def sql(self, query: str, *, memory_limit_bytes: int | None = None, max_rows: int | None = None) -> pa.Table:
        """Run one read-only SQL query over every table (pinned snapshots) and the search table functions.
        ``memory_limit_bytes`` bounds DataFusion's memory (operators spill to disk where they can; otherwise
        :class:`QueryLimitError`); ``max_rows`` bounds the result (more is a ``QueryLimitError``)."""
        from superfile.sql import SqlLimits, run_sql

        for name, value in (("memory_limit_bytes", memory_limit_bytes), ("max_rows", max_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
        return run_sql(self, query, SqlLimits(memory_bytes=memory_limit_bytes, max_rows=max_rows))

    def close(self) -> None:
        """Stop background maintenance (after its current run); the connection's tables stay usable."""
        if self.maintenance is not None:
            self.maintenance.close()
        if self.fleet is not None:
            self.fleet.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.uri!r})"


def connect(uri: str, **options: Any) -> Connection | RemoteConnection:
    """Open the catalog at ``uri``: ``memory://name``, ``file:///dir`` (or a plain path), ``s3://bucket/prefix``
    (a :class:`Connection`), or a gateway at ``http(s)://host:port`` with ``api_key=...`` (default:
    ``SUPERFILE_API_KEY`` from the environment; a :class:`superfile.remote.RemoteConnection`, same methods and
    result types: both are a :class:`superfile.api.Catalog`)."""
    if _is_gateway(uri):
        return RemoteConnection(uri, **options)
    return Connection(uri, **options)


async def connect_async(uri: str, **options: Any) -> ThreadedCatalog | AsyncRemoteConnection:
    """:func:`connect` for asyncio: the same catalog and options, every method a coroutine (an
    :class:`superfile.api.AsyncCatalog`). A gateway is spoken to with httpx (a
    :class:`superfile.remote.AsyncRemoteConnection`: many requests in flight from one event loop); any other
    URI opens a :class:`Connection` whose calls run in worker threads (:class:`superfile.threaded.ThreadedCatalog`).
    Await it in the event loop that will use the connection."""
    if _is_gateway(uri):
        return AsyncRemoteConnection(uri, **options)
    return ThreadedCatalog(await asyncio.to_thread(Connection, uri, **options))


def _is_gateway(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))
