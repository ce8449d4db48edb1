"""What the SDK sends for each method, once for the sync and the async SDK: a remote table's state (its name,
schema, options, pinned version and the position of its last unwaited write) and the :class:`Call` each of its
methods makes, and the catalog's calls. ``RemoteTable``/``AsyncRemoteTable`` and
``RemoteConnection``/``AsyncRemoteConnection`` differ only in how they send a call (``client.call(...)``, or
``await client.call(...)``).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, TypeVar
from urllib.parse import quote

import pyarrow as pa

from superfile.errors import InvalidInputError, InvalidOptionError, ReadOnlyTableError
from superfile.evolution import columns_to_add
from superfile.options import PartitionSpec, TableOptions
from superfile.remote.client import Call
from superfile.remote.wire import ARROW_STREAM, schema_from_b64, schema_to_b64, to_ipc
from superfile.schema import rows_schema, to_arrow_table
from superfile.search.request import SearchRequest
from superfile.validate import check_key, check_name, check_version, create_schema, table_options, to_ms

__all__ = [
    "RemoteHandle",
    "create_namespace_call",
    "create_table_call",
    "drop_call",
    "drop_namespace_call",
    "namespaces_call",
    "open_call",
    "open_table_call",
    "sql_call",
    "tables_call",
]

T = TypeVar("T")


def _same(value: Any) -> Any:
    return value


# -- the catalog ---------------------------------------------------------------------------------------------
def tables_call(namespace: str | None = None) -> Call[list[str]]:
    """``table_names``: every table the API key can see (or those directly in ``namespace``)."""
    params = {"namespace": check_name(namespace, "namespace")} if namespace is not None else None
    return Call("GET", "/tables", params=params, then=lambda body: list(body["tables"]))


def create_namespace_call(name: str, exist_ok: bool) -> Call[Any]:
    """``create_namespace`` (never repeated: a repeat after a lost answer would meet the namespace)."""
    return Call("POST", "/namespaces", payload={"name": check_name(name, "namespace"), "exist_ok": exist_ok})


def namespaces_call(parent: str | None) -> Call[list[str]]:
    """``list_namespaces``: every namespace the API key can see (or those directly inside ``parent``)."""
    params = {"parent": check_name(parent, "namespace")} if parent is not None else None
    return Call("GET", "/namespaces", params=params, then=lambda body: list(body["namespaces"]))


def drop_namespace_call(name: str) -> Call[Any]:
    """``drop_namespace`` (never repeated, as ``drop_table``)."""
    return Call("DELETE", f"/namespaces/{check_name(name, 'namespace')}")


def create_table_call(
    name: str,
    schema: pa.Schema | None,
    data: Any,
    *,
    fts_columns: Sequence[str] | Mapping[str, str],
    vector_columns: Mapping[str, Any] | None,
    tokenizer: str | Mapping[str, str],
    partition: str | Mapping[str, str] | PartitionSpec | None,
    consistency: str,
    exist_ok: bool,
    options: Mapping[str, Any],
) -> tuple[Call[dict[str, Any]], Any]:
    """``create_table``: checked here as the engine checks them (no request for a bad one), then sent as the
    engine reads them; and the data to append once the table is ``created`` (a one-shot stream whose schema
    was read comes back reopened). The answer describes the table."""
    check_name(name)
    schema, data = create_schema(schema, data)
    opts = table_options(
        fts_columns=fts_columns,
        vector_columns=vector_columns,
        tokenizer=tokenizer,
        partition=partition,
        consistency=consistency,
        options=options,
    )
    body = {
        "name": name,
        "schema_ipc": schema_to_b64(schema),
        "fts_columns": dict(opts.fts_columns),
        "vector_columns": {
            k: {"dim": v.dim, "metric": v.metric, "index": dict(v.index)} for k, v in opts.vector_columns.items()
        },
        "partition": asdict(opts.partition) if opts.partition is not None else None,
        "consistency": consistency,
        "exist_ok": exist_ok,
        "options": dict(options),
    }
    return Call("POST", "/tables", payload=body), data


def drop_call(name: str) -> Call[Any]:
    """``drop_table`` (never repeated: a second drop after a lost answer would report a missing table)."""
    return Call("DELETE", f"/tables/{check_name(name)}")


def sql_call(query: str, memory_limit_bytes: int | None, max_rows: int | None) -> Call[pa.Table]:
    """``sql``: one read-only query, within the gateway's limits tightened by the caller's."""
    body: dict[str, object] = {"query": query}
    if memory_limit_bytes is not None:
        body["memory_limit_bytes"] = memory_limit_bytes
    if max_rows is not None:
        body["max_rows"] = max_rows
    return Call("POST", "/sql", payload=body, idempotent=True, arrow=True)


def open_call(
    name: str, version: int | None = None, as_of: datetime.datetime | int | float | None = None
) -> Call[tuple[dict[str, Any], int | None]]:
    """Opening ``name``: at its latest version, or pinned at ``version`` or at the one current at ``as_of``
    (the gateway resolves it once; the handle then stays there). The answer is the table's description and
    the version to pin, if any."""
    if version is not None and as_of is not None:
        raise InvalidOptionError("give exactly one of version and as_of")
    params: dict[str, Any] = {}  # checked and converted as the engine does, so both name the same version
    if version is not None:
        params["version"] = check_version(version)
    if as_of is not None:
        params["as_of"] = to_ms(as_of)
    return Call(
        "GET",
        f"/tables/{check_name(name)}",
        params=params,
        then=lambda info: (info, int(info["version"]) if params else None),
    )


def open_table_call(
    name: str, version: int | None, as_of: datetime.datetime | int | float | None, consistency: str | None
) -> Call[tuple[dict[str, Any], int | None]]:
    """``open_table``: ``consistency`` is not taken, the gateway reads with the table's own policy (and
    ``wait_for`` positions give read-your-writes)."""
    if consistency is not None:
        raise InvalidOptionError("a remote table reads with the table's own consistency policy; omit consistency")
    return open_call(name, version, as_of)


# -- a table ---------------------------------------------------------------------------------------------------
class RemoteHandle:
    """A table behind a gateway as the gateway described it (``GET /tables/{name}``), pinned at ``pinned`` if
    given, and the call each of its methods sends."""

    def __init__(self, info: Mapping[str, Any], pinned: int | None = None) -> None:
        self.name: str = info["name"]
        self._schema = schema_from_b64(info["schema_ipc"])
        self._options = TableOptions.from_dict(info["options"])
        self._pinned = pinned
        self._path = f"/tables/{self.name}"
        self._position: str | None = None  # the last unwaited write's position token
        self._lock = threading.Lock()

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema, ``_id`` first."""
        return self._schema

    @property
    def options(self) -> TableOptions:
        """What the table was created with: full-text and vector columns, partitioning, consistency."""
        return self._options

    # -- reads: each passes the last unwaited write's position, and forgets it once a read has seen it ---------
    def _read(
        self,
        method: str,
        op: str,
        params: Mapping[str, Any] | None = None,
        *,
        payload: Any = None,
        arrow: bool = False,
        then: Callable[[Any], T] = _same,
    ) -> Call[T]:
        """A read (repeatable: POST ones too) at the pinned version, or waiting for this handle's last
        unwaited write and forgetting it once the read has seen it."""
        if self._pinned is not None:
            read: dict[str, Any] = {"version": self._pinned}
            position = None
        else:
            with self._lock:
                position = self._position
            read = {"wait_for": position} if position else {}

        def seen(value: Any) -> T:
            if position is not None:
                with self._lock:
                    if self._position == position:
                        self._position = None
            return then(value)

        path = f"{self._path}{op}"
        return Call(method, path, {**read, **(params or {})}, payload, idempotent=True, arrow=arrow, then=seen)

    def _at_version(self, op: str, params: Mapping[str, Any] | None = None, *, then: Callable[[Any], T]) -> Call[T]:
        """A GET of facts as of this handle's version (the latest unless pinned; no wait for a write)."""
        pinned = {"version": self._pinned} if self._pinned is not None else {}
        return Call("GET", f"{self._path}{op}", {**(params or {}), **pinned}, then=then)

    def _version_call(self) -> Call[int]:
        return self._read("GET", "/version", then=lambda body: int(body["version"]))

    def _stats_call(self) -> Call[dict[str, Any]]:
        return self._at_version("/stats", then=dict)

    def _properties_call(self) -> Call[dict[str, Any]]:
        return self._at_version("/properties", then=lambda body: dict(body["properties"]))

    def _idempotency_call(self, idempotency_key: str) -> Call[int | None]:
        return self._at_version(
            "/idempotency",
            {"key": idempotency_key},
            then=lambda body: None if body["version"] is None else int(body["version"]),
        )

    def _versions_call(self) -> Call[list[dict[str, Any]]]:
        return self._at_version("/versions", then=lambda body: list(body["versions"]))

    def _checkout_call(
        self, version: int | None, as_of: datetime.datetime | int | float | None
    ) -> Call[tuple[dict[str, Any], int | None]]:
        if (version is None) == (as_of is None):
            raise InvalidOptionError("give exactly one of version and as_of")
        return open_call(self.name, version, as_of)

    def _changes_call(self, from_version: int, to_version: int | None, columns: list[str] | None) -> Call[pa.Table]:
        params: dict[str, Any] = {"from": check_version(from_version)}
        if to_version is not None:
            params["to"] = check_version(to_version)
        elif self._pinned is not None:
            params["to"] = self._pinned
        if columns is not None:
            params["columns"] = ",".join(columns)
        if self._pinned is not None:  # the range ends at the pinned version: nothing to wait for
            return Call("GET", f"{self._path}/changes", params, arrow=True)
        return self._read("GET", "/changes", params, arrow=True)

    def _scan_call(self, columns: list[str] | None, where: str | None) -> Call[pa.Table]:
        return self._read("POST", "/scan", payload={"columns": columns, "where": where}, arrow=True)

    def _count_call(self, where: str | None) -> Call[int]:
        return self._read("POST", "/count", payload={"where": where}, then=lambda body: int(body["count"]))

    def _search_call(self, request: SearchRequest) -> Call[pa.Table]:
        """``POST /tables/{name}/search/{kind}`` with the request's JSON."""
        body = request.to_json()
        del body["kind"]
        return self._read("POST", f"/search/{request.kind}", payload=body, arrow=True)

    # -- writes -------------------------------------------------------------------------------------------------
    def _writable(self) -> None:
        if self._pinned is not None:
            raise ReadOnlyTableError(
                f"table {self.name!r} is open at version {self._pinned}; open it without a version to write"
            )

    def _write_call(
        self,
        op: str,
        wait: bool,
        key: str | None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        payload: Any = None,
        content: bytes | None = None,
    ) -> Call[int | None]:
        """POST one write with its request key (the caller's idempotency key, else a fresh one), so the
        transport may repeat it after a lost answer and the gateway still commits it at most once."""
        self._writable()

        def done(result: Mapping[str, Any]) -> int | None:
            if result.get("position") and not wait:
                with self._lock:
                    self._position = result["position"]
                return None
            return int(result["version"]) if result.get("version") is not None else None

        return Call(
            "POST",
            f"{self._path}/{op}",
            params={"wait": str(wait).lower(), **(params or {})},
            payload=payload,
            content=content,
            headers={**(headers or {}), "idempotency-key": check_key(key) if key is not None else uuid.uuid4().hex},
            idempotent=True,
            then=done,
        )

    def _rows(self, data: Any) -> bytes:
        rows = to_arrow_table(data, rows_schema(self._schema, data) if isinstance(data, list) else None)
        return to_ipc(rows)

    def _append_call(self, data: Any, wait: bool, key: str | None) -> Call[int | None]:
        rows = self._rows(data)
        return self._write_call("append", wait, key, headers={"content-type": ARROW_STREAM}, content=rows)

    def _delete_call(self, where: str, wait: bool, key: str | None) -> Call[int | None]:
        return self._write_call("delete", wait, key, payload={"where": where})

    def _update_call(self, where: str, data: Any, wait: bool, key: str | None) -> Call[int | None]:
        rows = self._rows(data)
        return self._write_call(
            "update", wait, key, {"where": where}, headers={"content-type": ARROW_STREAM}, content=rows
        )

    def _restore_call(self, version: int, wait: bool, key: str | None) -> Call[int | None]:
        return self._write_call("restore", wait, key, payload={"version": check_version(version)})

    # -- schema evolution: committed by the gateway (never repeated: a repeat would meet its own change), which
    # answers the table's new description; the handle takes its schema and options from it ----------------
    def _evolved(self, info: Mapping[str, Any]) -> int:
        schema, options = schema_from_b64(info["schema_ipc"]), TableOptions.from_dict(info["options"])
        with self._lock:
            self._schema, self._options = schema, options
        return int(info["version"])

    def _schema_call(
        self, method: str, op: str, payload: Any = None, params: Mapping[str, Any] | None = None
    ) -> Call[int]:
        self._writable()
        return Call(method, f"{self._path}{op}", params=params, payload=payload, then=self._evolved)

    def _add_columns_call(
        self, fields: pa.Schema | pa.Field | Sequence[pa.Field], defaults: Mapping[str, Any] | None
    ) -> Call[int]:
        """``POST /tables/{name}/columns`` with the columns as an Arrow IPC schema, defaults in their metadata."""
        columns = pa.schema(columns_to_add(fields, defaults))
        return self._schema_call("POST", "/columns", {"schema_ipc": schema_to_b64(columns)})

    def _rename_column_call(self, old: str, new: str) -> Call[int]:
        return self._schema_call("PATCH", f"/columns/{_segment(old)}", {"name": new})

    def _drop_columns_call(self, names: str | Sequence[str]) -> Call[int]:
        columns = [names] if isinstance(names, str) else list(names)
        if not all(isinstance(c, str) for c in columns):
            raise InvalidInputError("names must be a column name or a list of them")
        return self._schema_call("POST", "/columns/drop", {"columns": columns})

    def _alter_column_type_call(self, name: str, new_type: pa.DataType) -> Call[int]:
        if not isinstance(new_type, pa.DataType):
            raise InvalidInputError(f"new_type must be a pyarrow.DataType, got {new_type!r}")
        typed = schema_to_b64(pa.schema([pa.field(name, new_type)]))
        return self._schema_call("PATCH", f"/columns/{_segment(name)}", {"type_ipc": typed})

    def _create_fts_index_call(self, column: str, tokenizer: str) -> Call[int]:
        return self._schema_call("POST", "/indexes", {"column": column, "kind": "fts", "tokenizer": tokenizer})

    def _create_vector_index_call(self, column: str, metric: str, index: Mapping[str, Any] | None) -> Call[int]:
        body = {"column": column, "kind": "vector", "metric": metric, "index": dict(index or {})}
        return self._schema_call("POST", "/indexes", body)

    def _drop_index_call(self, column: str) -> Call[int]:
        return self._schema_call("DELETE", f"/indexes/{_segment(column)}")

    # -- maintenance: never repeated (the gateway runs them; a second run after a lost answer is another) ------
    def _optimize_call(self, target_rows: int | None, target_bytes: int | None) -> Call[dict[str, Any]]:
        self._writable()
        body = {"target_rows": target_rows, "target_bytes": target_bytes}
        return Call("POST", f"{self._path}/optimize", payload=body, then=dict)

    def _cleanup_call(
        self,
        older_than: datetime.timedelta | float,
        dry_run: bool,
        safety_margin: datetime.timedelta | float | None,
    ) -> Call[dict[str, Any]]:
        self._writable()
        body = {
            "older_than": _seconds("older_than", older_than),
            "safety_margin": None if safety_margin is None else _seconds("safety_margin", safety_margin),
            "dry_run": dry_run,
        }
        return Call("POST", f"{self._path}/cleanup", payload=body, then=dict)

    def _where(self) -> str:
        """For ``repr``: the pinned version, if any."""
        return f", version={self._pinned}" if self._pinned is not None else ""


def _segment(column: str) -> str:
    """A column name as one URL path segment."""
    if not isinstance(column, str):
        raise InvalidInputError(f"a column name must be a string, got {column!r}")
    return quote(column, safe="")


def _seconds(name: str, value: Any) -> Any:
    """A duration as JSON seconds; the gateway (the engine) checks the number."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise InvalidOptionError(f"{name} must be a non-negative timedelta or seconds, got {value!r}")
