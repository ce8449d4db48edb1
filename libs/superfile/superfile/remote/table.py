"""``RemoteTable``: a table behind a gateway, with the methods, arguments and result types of ``Supertable``.

Writes wait for visibility by default and return the version, like embedded
ones. ``wait=False`` returns as soon as the gateway accepted the write (in
suite mode: once the event log acknowledged it) and returns None; the handle
then remembers the write's position and passes it as ``wait_for`` on its next
read, so that read sees the write (read-your-writes) without every write
paying for the wait.
"""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from superfile.api import Table
from superfile.errors import InvalidOptionError, ReadOnlyTableError
from superfile.options import TableOptions
from superfile.remote.client import GatewayClient
from superfile.remote.wire import ARROW_STREAM, schema_from_b64, to_ipc
from superfile.schema import to_arrow_table, user_schema
from superfile.search.request import HybridSearch, SearchRequest
from superfile.validate import DEFAULT_RETENTION, check_key, check_version, to_ms

__all__ = ["RemoteTable"]


class RemoteTable(Table):
    """A table served by a gateway. Obtain one from :class:`superfile.remote.RemoteConnection`."""

    def __init__(
        self,
        client: GatewayClient,
        name: str,
        schema: pa.Schema,
        options: TableOptions,
        *,
        pinned: int | None = None,
    ) -> None:
        self.name = name
        self._client = client
        self._schema = schema
        self._options = options
        self._pinned = pinned
        self._path = f"/tables/{name}"
        self._position: str | None = None  # the last unwaited write's position token
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: GatewayClient, info: Mapping[str, Any], version: int | None = None) -> RemoteTable:
        """The table a gateway described (``GET /tables/{name}``), pinned at ``version`` if given."""
        schema = schema_from_b64(info["schema_ipc"])
        return cls(client, info["name"], schema, TableOptions.from_dict(info["options"]), pinned=version)

    @classmethod
    def open(
        cls,
        client: GatewayClient,
        name: str,
        version: int | None = None,
        as_of: datetime.datetime | int | float | None = None,
    ) -> RemoteTable:
        """A handle on ``name`` at its latest version, or pinned at ``version`` or at the one current at
        ``as_of`` (the gateway resolves it once; the handle then stays there)."""
        if version is not None and as_of is not None:
            raise InvalidOptionError("give exactly one of version and as_of")
        params: dict[str, Any] = {}  # checked and converted as the engine does, so both name the same version
        if version is not None:
            params["version"] = check_version(version)
        if as_of is not None:
            params["as_of"] = to_ms(as_of)
        info = client.json("GET", f"/tables/{name}", params=params)
        return cls.of(client, info, int(info["version"]) if params else None)

    # -- plumbing -------------------------------------------------------------------------
    def _read_params(self) -> tuple[dict[str, Any], str | None]:
        if self._pinned is not None:
            return {"version": self._pinned}, None
        with self._lock:
            position = self._position
        return ({"wait_for": position} if position else {}), position

    def _seen(self, position: str | None) -> None:
        """A read that waited for ``position`` succeeded: later reads need not wait for it again."""
        if position is not None:
            with self._lock:
                if self._position == position:
                    self._position = None

    def _search(self, kind: str, body: Mapping[str, Any]) -> pa.Table:
        params, position = self._read_params()
        result = self._client.arrow(f"{self._path}/search/{kind}", body, params)
        self._seen(position)
        return result

    def _writable(self) -> None:
        if self._pinned is not None:
            raise ReadOnlyTableError(
                f"table {self.name!r} is open at version {self._pinned}; open it without a version to write"
            )

    def _write(
        self,
        op: str,
        wait: bool,
        key: str | None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> int | None:
        """POST one write with its request key (the caller's idempotency key, else a fresh one), so the
        transport may repeat it after a lost answer and the gateway still commits it at most once."""
        self._writable()
        result = self._client.json(
            "POST",
            f"{self._path}/{op}",
            params={"wait": str(wait).lower(), **(params or {})},
            headers={**(headers or {}), "idempotency-key": check_key(key) if key is not None else uuid.uuid4().hex},
            idempotent=True,
            **kwargs,
        )
        if result.get("position") and not wait:
            with self._lock:
                self._position = result["position"]
            return None
        return int(result["version"]) if result.get("version") is not None else None

    def _ipc_rows(self, data: Any) -> bytes:
        rows = to_arrow_table(data, user_schema(self._schema) if isinstance(data, list) else None)
        return to_ipc(rows)

    # -- metadata -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        if self._pinned is not None:
            return self._pinned
        params, position = self._read_params()
        version = int(self._client.json("GET", f"{self._path}/version", params=params)["version"])
        self._seen(position)
        return version

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def options(self) -> TableOptions:
        return self._options

    def stats(self) -> dict[str, Any]:
        """Snapshot facts from the manifest, plus the gateway process's memory."""
        params = {"version": self._pinned} if self._pinned is not None else {}
        return dict(self._client.json("GET", f"{self._path}/stats", params=params))

    @property
    def properties(self) -> dict[str, Any]:
        """Properties commits recorded (e.g. the event-log offsets the builder applied)."""
        params = {"version": self._pinned} if self._pinned is not None else {}
        return dict(self._client.json("GET", f"{self._path}/properties", params=params)["properties"])

    def idempotency_version(self, idempotency_key: str) -> int | None:
        """The version whose commit recorded this idempotency key (None if none retained does)."""
        params: dict[str, Any] = {"key": idempotency_key}
        if self._pinned is not None:
            params["version"] = self._pinned
        version = self._client.json("GET", f"{self._path}/idempotency", params=params)["version"]
        return None if version is None else int(version)

    def versions(self) -> list[dict[str, Any]]:
        """Every retained version (up to this handle's, if it is on a past one): number, time, operation, rows."""
        params = {"version": self._pinned} if self._pinned is not None else {}
        return list(self._client.json("GET", f"{self._path}/versions", params=params)["versions"])

    def checkout(
        self, version: int | None = None, *, as_of: datetime.datetime | int | float | None = None
    ) -> RemoteTable:
        """A read-only handle on an earlier version (while it is retained), or on the version that was
        current at ``as_of`` (a datetime, naive meaning UTC, or epoch milliseconds)."""
        if (version is None) == (as_of is None):
            raise InvalidOptionError("give exactly one of version and as_of")
        return RemoteTable.open(self._client, self.name, version, as_of)

    def changes(
        self, from_version: int, to_version: int | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows inserted and deleted between two retained versions (default to: the latest, or this handle's
        version), with ``_change`` ("insert"/"delete") and ``_id``; an update shows as both."""
        params: dict[str, Any] = {"from": check_version(from_version)}
        position = None
        if to_version is not None:
            params["to"] = check_version(to_version)
        elif self._pinned is not None:
            params["to"] = self._pinned
        if self._pinned is None:
            read, position = self._read_params()
            params.update(read)
        if columns is not None:
            params["columns"] = ",".join(columns)
        result = self._client.arrow(f"{self._path}/changes", None, params)
        self._seen(position)
        return result

    # -- reads ----------------------------------------------------------------------------
    def to_arrow(self, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        params, position = self._read_params()
        result = self._client.arrow(f"{self._path}/scan", {"columns": columns, "where": where}, params)
        self._seen(position)
        return result

    def count_rows(self, where: str | None = None) -> int:
        params, position = self._read_params()
        count = int(self._client.json("POST", f"{self._path}/count", payload={"where": where}, params=params)["count"])
        self._seen(position)
        return count

    def search(self, request: SearchRequest) -> pa.Table:
        """Run one search on the gateway (``POST /tables/{name}/search/{kind}`` with the request's JSON)."""
        if isinstance(request, HybridSearch) and self._pinned is not None:
            raise ReadOnlyTableError("hybrid_search runs on the latest version; use sql() on a pinned version")
        body = request.to_json()
        del body["kind"]
        return self._search(request.kind, body)

    # -- writes ---------------------------------------------------------------------------
    def append(self, data: Any, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Add rows; returns the version that includes them (None with ``wait=False`` in suite mode).
        A repeated ``idempotency_key`` adds nothing (embedded mode returns the first append's version).
        Every write travels with a request key (this one, or a fresh one per call), so the SDK's own retries
        after a lost answer never commit twice; give a key to make *your* retries safe too."""
        rows = self._ipc_rows(data)
        return self._write("append", wait, idempotency_key, content=rows, headers={"content-type": ARROW_STREAM})

    def delete(self, where: str, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Delete every row matching the SQL predicate; returns the version (see ``append`` for ``wait`` and
        ``idempotency_key``)."""
        return self._write("delete", wait, idempotency_key, payload={"where": where})

    def update(self, where: str, data: Any, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Replace the rows matching ``where`` 1:1 by ``data``, keeping their ``_id``; returns the version."""
        return self._write(
            "update",
            wait,
            idempotency_key,
            content=self._ipc_rows(data),
            headers={"content-type": ARROW_STREAM},
            params={"where": where},
        )

    def restore(self, version: int, *, wait: bool = True, idempotency_key: str | None = None) -> int | None:
        """Publish a retained version's contents as the newest version; returns that version (see ``append``
        for ``wait``; in suite mode the builder applies it in log order)."""
        return self._write("restore", wait, idempotency_key, payload={"version": check_version(version)})

    # -- maintenance ----------------------------------------------------------------------
    def optimize(self, target_rows: int | None = None, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Compact: merge small superfiles per partition into ones of about ``target_rows`` rows (or sized from
        ``target_bytes``) and drop deleted rows; the gateway runs it. Returns counts and the version published."""
        self._writable()
        body = {"target_rows": target_rows, "target_bytes": target_bytes}
        return dict(self._client.json("POST", f"{self._path}/optimize", payload=body))

    def cleanup(
        self,
        older_than: datetime.timedelta | float = DEFAULT_RETENTION,
        *,
        dry_run: bool = False,
        safety_margin: datetime.timedelta | float | None = None,
    ) -> dict[str, Any]:
        """Delete files no version of the last ``older_than`` (a timedelta or seconds) needs; returns files and
        bytes removed. Files younger than ``safety_margin`` (default: the window) are kept; the gateway refuses
        a margin below its minimum (``SUPERFILE_CLEANUP_MIN_AGE_S``)."""
        self._writable()
        body = {
            "older_than": _seconds("older_than", older_than),
            "safety_margin": None if safety_margin is None else _seconds("safety_margin", safety_margin),
            "dry_run": dry_run,
        }
        return dict(self._client.json("POST", f"{self._path}/cleanup", payload=body))

    def __repr__(self) -> str:
        at = f", version={self._pinned}" if self._pinned is not None else ""
        return f"RemoteTable({self.name!r}{at}, gateway={self._client.uri!r})"


def _seconds(name: str, value: Any) -> Any:
    """A duration as JSON seconds; the gateway (the engine) checks the number."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise InvalidOptionError(f"{name} must be a non-negative timedelta or seconds, got {value!r}")
