"""Requirements: what the manifest a commit builds on must say, as values (after pyiceberg's ``AssertTableUUID``,
``AssertRefSnapshotId``).

A change carries a tuple of them (``Change.requires``). ``publish`` checks every one against the manifest
each publish attempt builds on, before it builds anything, so a requirement holds for the version the
commit lands on top of: the pointer swap is conditional on that manifest still being current. One that
fails raises :class:`RequirementFailedError` and nothing is committed. Being data, a requirement can be
logged, compared and sent with its change (``to_json`` / :func:`requirement_from_json`).

- :class:`AssertTableUUID`: the table is the one the change was staged on (not dropped and re-created).
- :class:`AssertVersion`: nothing committed since the version the change was staged on.
- :class:`AssertPropertyEquals` / :class:`AssertPropertyAtMost`: a commit property (a path into the
  manifest's ``properties``, missing meaning ``default``) equals a value / is a number at most a bound.
  The builder's fencing: its topic's ``log_offsets`` equals the offset its batch started from, and its
  topic's ``log_fences`` is at most its own lease's fence.
- :class:`AssertSchemaId`: the table's schema is the one a schema change was staged against.
- :class:`AssertBefore`: the attempt starts before a wall-clock deadline (epoch milliseconds). The builder
  puts its lease's deadline here (``Lease.deadline_ms``): a commit attempt made after the lease ran out is
  refused. It narrows a zombie's window; the offset and fence requirements are what make a late commit
  safe (see docs/builder.md).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from superfile.errors import ContentionError
from superfile.evolution import schema_id
from superfile.manifest.model import ManifestList

__all__ = [
    "AssertBefore",
    "AssertPropertyAtMost",
    "AssertPropertyEquals",
    "AssertSchemaId",
    "AssertTableUUID",
    "AssertVersion",
    "Requirement",
    "RequirementFailedError",
    "check_all",
    "requirement_from_json",
]


class RequirementFailedError(ContentionError):
    """The manifest a commit attempt built on does not meet one of the change's requirements: nothing
    was committed. ``requirement`` is the one that failed, ``actual`` what the manifest said instead."""

    def __init__(self, requirement: Requirement, actual: Any) -> None:
        super().__init__(f"commit refused: {requirement.describe()}, but the table has {actual!r}")
        self.requirement = requirement
        self.actual = actual


class Requirement(ABC):
    """A check of the manifest a commit builds on. Subclasses are frozen dataclasses named by ``TYPE``."""

    TYPE: ClassVar[str]

    @abstractmethod
    def check(self, manifest: ManifestList) -> None:
        """Raise :class:`RequirementFailedError` unless ``manifest`` meets the requirement."""

    @abstractmethod
    def describe(self) -> str:
        """What is required, in words (for errors and logs)."""

    @abstractmethod
    def fields(self) -> dict[str, Any]:
        """The requirement's fields, as JSON values."""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **self.fields()}


@dataclass(frozen=True)
class AssertTableUUID(Requirement):
    """The table is the one with this uuid."""

    TYPE: ClassVar[str] = "assert-table-uuid"
    uuid: str

    def check(self, manifest: ManifestList) -> None:
        if manifest.table_uuid != self.uuid:
            raise RequirementFailedError(self, manifest.table_uuid)

    def describe(self) -> str:
        return f"table uuid {self.uuid!r} required"

    def fields(self) -> dict[str, Any]:
        return {"uuid": self.uuid}


@dataclass(frozen=True)
class AssertVersion(Requirement):
    """The manifest built on is this version: no commit landed since."""

    TYPE: ClassVar[str] = "assert-version"
    version: int

    def check(self, manifest: ManifestList) -> None:
        if manifest.version != self.version:
            raise RequirementFailedError(self, manifest.version)

    def describe(self) -> str:
        return f"version {self.version} required"

    def fields(self) -> dict[str, Any]:
        return {"version": self.version}


def _property(properties: Mapping[str, Any], path: tuple[str, ...], default: Any) -> Any:
    node: Any = properties
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def _path(value: Iterable[str]) -> tuple[str, ...]:
    path = tuple(value)
    if not path or not all(isinstance(k, str) for k in path):
        raise ValueError(f"a property path is one or more names, got {value!r}")
    return path


@dataclass(frozen=True)
class AssertPropertyEquals(Requirement):
    """The commit property at ``path`` (``properties[path[0]][path[1]]...``; ``default`` when missing)
    equals ``value`` (a JSON value, compared exactly)."""

    TYPE: ClassVar[str] = "assert-property-equals"
    path: tuple[str, ...]
    value: Any
    default: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _path(self.path))

    def check(self, manifest: ManifestList) -> None:
        actual = _property(manifest.properties, self.path, self.default)
        if actual != self.value or type(actual) is not type(self.value):  # exact: 1 is not True, nor 1.0
            raise RequirementFailedError(self, actual)

    def describe(self) -> str:
        return f"property {'.'.join(self.path)} == {self.value!r} required"

    def fields(self) -> dict[str, Any]:
        return {"path": list(self.path), "value": self.value, "default": self.default}


@dataclass(frozen=True)
class AssertPropertyAtMost(Requirement):
    """The commit property at ``path`` (``default`` when missing) is an integer at most ``value``."""

    TYPE: ClassVar[str] = "assert-property-at-most"
    path: tuple[str, ...]
    value: int
    default: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _path(self.path))

    def check(self, manifest: ManifestList) -> None:
        actual = _property(manifest.properties, self.path, self.default)
        if isinstance(actual, bool) or not isinstance(actual, int) or actual > self.value:
            raise RequirementFailedError(self, actual)

    def describe(self) -> str:
        return f"property {'.'.join(self.path)} <= {self.value} required"

    def fields(self) -> dict[str, Any]:
        return {"path": list(self.path), "value": self.value, "default": self.default}


@dataclass(frozen=True)
class AssertBefore(Requirement):
    """The commit attempt starts before ``deadline_ms`` (wall clock, epoch milliseconds)."""

    TYPE: ClassVar[str] = "assert-before"
    deadline_ms: int

    def check(self, manifest: ManifestList) -> None:
        now = int(time.time() * 1000)
        if now >= self.deadline_ms:
            raise RequirementFailedError(self, f"time {now}")

    def describe(self) -> str:
        return f"a commit before {self.deadline_ms} (epoch ms) required"

    def fields(self) -> dict[str, Any]:
        return {"deadline_ms": self.deadline_ms}


@dataclass(frozen=True)
class AssertSchemaId(Requirement):
    """The table's current schema is the one with this id (pyiceberg's ``AssertCurrentSchemaId``): a schema
    change staged against schema ``schema_id`` publishes only over it, never over a concurrent one."""

    TYPE: ClassVar[str] = "assert-current-schema-id"
    schema_id: int

    def check(self, manifest: ManifestList) -> None:
        actual = schema_id(manifest.schema)
        if actual != self.schema_id:
            raise RequirementFailedError(self, actual)

    def describe(self) -> str:
        return f"schema {self.schema_id} required"

    def fields(self) -> dict[str, Any]:
        return {"schema_id": self.schema_id}


_TYPES: dict[str, type[Requirement]] = {
    t.TYPE: t
    for t in (AssertTableUUID, AssertVersion, AssertPropertyEquals, AssertPropertyAtMost, AssertBefore, AssertSchemaId)
}


def requirement_from_json(d: Mapping[str, Any]) -> Requirement:
    """The requirement ``Requirement.to_json`` wrote."""
    fields = dict(d)
    kind = _TYPES.get(fields.pop("type", None))
    if kind is None:
        raise ValueError(f"unknown requirement {d!r}")
    if "path" in fields:
        fields["path"] = tuple(fields["path"])
    return kind(**fields)


def check_all(requirements: Iterable[Requirement], manifest: ManifestList) -> None:
    """Check each requirement in turn; the first that fails raises :class:`RequirementFailedError`."""
    for requirement in requirements:
        requirement.check(manifest)
