"""The SDK's surface as a user's tools see it: every public method documented (``help()``, an editor's hover),
the package marked typed (PEP 561), and ``connect``/``connect_async`` annotated with what they return."""

from __future__ import annotations

import asyncio
import inspect
import typing
from importlib import resources

import pytest
import superfile
from superfile import api
from superfile.remote import AsyncRemoteConnection, AsyncRemoteTable, RemoteConnection, RemoteTable
from superfile.threaded import ThreadedCatalog, ThreadedTable

PUBLIC_CLASSES = [
    superfile.Connection,
    superfile.Supertable,
    RemoteConnection,
    RemoteTable,
    AsyncRemoteConnection,
    AsyncRemoteTable,
    ThreadedCatalog,
    ThreadedTable,
    api.Catalog,
    api.Table,
    api.AsyncCatalog,
    api.AsyncTable,
    api.Searches,
]


def _public_members(cls: type) -> list[str]:
    names = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property | classmethod | staticmethod) or inspect.isfunction(static):
            names.append(name)
    return names


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda c: c.__name__)
def test_every_public_method_has_a_docstring(cls: type) -> None:
    """Own or inherited from the protocol it implements (``inspect.getdoc``, as ``help()`` shows it)."""
    undocumented = [name for name in _public_members(cls) if not inspect.getdoc(getattr(cls, name))]
    undocumented += [] if inspect.getdoc(cls) else ["(the class)"]
    assert not undocumented, f"{cls.__name__}: {undocumented}"


def test_the_package_is_typed() -> None:
    assert (resources.files("superfile") / "py.typed").is_file()


def test_connect_and_connect_async_name_both_sides() -> None:
    hints = typing.get_type_hints(superfile.connect)
    assert hints["return"] == superfile.Connection | RemoteConnection
    assert inspect.iscoroutinefunction(superfile.connect_async)
    assert typing.get_type_hints(superfile.connect_async)["return"] == ThreadedCatalog | AsyncRemoteConnection


def test_connect_async_on_memory() -> None:
    """An embedded URI gets the same async API, run in worker threads."""

    async def main() -> list[int]:
        async with await superfile.connect_async("memory://async-unit") as db:
            table = await db.create_table("t", data=[{"key": 1, "text": "a b"}], fts_columns=["text"])
            versions = await asyncio.gather(*(table.append([{"key": k, "text": "c d"}]) for k in range(2, 6)))
            found = await table.bm25_search("text", "c", k=10, projection=["key"])
            assert sorted(found.column("key").to_pylist()) == [2, 3, 4, 5]
            return sorted(typing.cast(list[int], versions))

    assert asyncio.run(main()) == [3, 4, 5, 6]  # four appends gathered, four commits
