"""Typed errors: every failure a caller can act on has its own class.

All inherit from :class:`SuperfileError`; input errors also inherit from
``ValueError`` so generic handlers keep working. The gateway maps each class
to one HTTP status (see ``http_status``).
"""

from __future__ import annotations

__all__ = [
    "CacheNodeUnavailableError",
    "CommitStateUnknownError",
    "ContentionError",
    "CorruptSuperfileError",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidPredicateError",
    "InvalidTableNameError",
    "InvalidVectorError",
    "NamespaceExistsError",
    "NamespaceNotEmptyError",
    "NamespaceNotFoundError",
    "ObjectNotFoundError",
    "PreconditionFailedError",
    "QueryLimitError",
    "ReadOnlyTableError",
    "SchemaChangeError",
    "SchemaMismatchError",
    "ShortReadError",
    "SqlError",
    "StorageError",
    "SuperfileError",
    "SuperfileMissingError",
    "TableExistsError",
    "TableNotFoundError",
    "UnknownColumnError",
    "UpgradeRequiredError",
    "VectorDimensionError",
    "VersionNotFoundError",
]


class SuperfileError(Exception):
    """Base class of every error this package raises on purpose."""

    http_status = 500


class InvalidInputError(SuperfileError, ValueError):
    """The caller's input is wrong; nothing was written."""

    http_status = 400


class SchemaMismatchError(InvalidInputError):
    """Appended data does not match the table schema."""


class SchemaChangeError(InvalidInputError):
    """A schema change that cannot be made: a name already taken, a type change that could lose values, a
    column the table needs (``_id``, the partition column). Nothing was committed."""


class UnknownColumnError(InvalidInputError):
    """A column named by the caller does not exist (or is not indexed for the operation)."""


class VectorDimensionError(InvalidInputError):
    """A vector has the wrong number of components for its column."""


class InvalidVectorError(InvalidInputError):
    """A vector holds NaN or infinite values, or is otherwise unusable."""


class InvalidPredicateError(InvalidInputError):
    """A ``where`` predicate could not be parsed or type-checked."""


class InvalidTableNameError(InvalidInputError):
    """A table name is not a safe, single path component."""


class InvalidOptionError(InvalidInputError):
    """A table or search option has an invalid value."""


class SqlError(InvalidInputError):
    """A SQL query could not be parsed, planned or run, or tried something SQL may not do."""


class QueryLimitError(SqlError):
    """A query went past one of its limits (memory, result rows, size of its text); it was stopped and
    nothing it did remains. The message names the limit and its setting."""


class TableNotFoundError(SuperfileError, KeyError):
    """No table of that name exists."""

    http_status = 404

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "table not found"


class TableExistsError(SuperfileError):
    """A table of that name already exists."""

    http_status = 409


class NamespaceNotFoundError(TableNotFoundError):
    """No namespace of that name exists (a table named inside one needs it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "namespace not found"


class NamespaceExistsError(SuperfileError):
    """A namespace of that name already exists."""

    http_status = 409


class NamespaceNotEmptyError(SuperfileError):
    """A namespace still holds tables or namespaces, so it cannot be dropped."""

    http_status = 409


class VersionNotFoundError(SuperfileError):
    """The requested table version does not exist or is no longer retained."""

    http_status = 404


class UpgradeRequiredError(SuperfileError):
    """The table was written in an older format; ``superfile upgrade URI TABLE`` (``Connection.upgrade_table``)
    converts it in one commit."""

    http_status = 409


class ReadOnlyTableError(SuperfileError):
    """A write was attempted on a handle pinned to a past version."""

    http_status = 409


class ContentionError(SuperfileError):
    """A commit lost the publish race more times than its retry bound allows."""

    http_status = 409


class StorageError(SuperfileError):
    """The storage backend failed in a way retries could not hide."""

    http_status = 503


class CacheNodeUnavailableError(StorageError):
    """No cache node answered a query root's leaf request within its deadline (every node in the
    superfile's rendezvous order was tried); retrying later is safe: reads change nothing."""


class ObjectNotFoundError(StorageError):
    """The object does not exist."""

    http_status = 404


class PreconditionFailedError(StorageError):
    """A conditional write lost: the object exists (create-only) or changed (compare-and-swap)."""

    http_status = 409


class CommitStateUnknownError(StorageError):
    """A commit's pointer swap got no usable answer and storage could not be read back to tell whether it
    landed. It may be visible now or later: retry with the same idempotency key (a retry then commits at
    most once), or look for ``manifest`` in the table's history (``versions()``) once storage answers."""

    def __init__(self, message: str, *, table: str = "", manifest: str = "", version: int = 0) -> None:
        super().__init__(message)
        self.table = table  # the table's storage URI
        self.manifest = manifest  # the manifest the commit published, if it landed (the newest attempt)
        self.version = version  # the version it would have been


class SuperfileMissingError(StorageError):
    """A superfile the manifest references is not in storage (removed out of band, or by a cleanup whose
    safety margin was shorter than a reader's snapshot)."""

    def __init__(self, path: str, *, table: str) -> None:
        super().__init__(f"superfile {path!r} of table {table!r} is missing from storage")
        self.path = path


class ShortReadError(StorageError):
    """A range read could not return exactly the bytes asked for."""


class CorruptSuperfileError(StorageError):
    """A superfile's bytes do not match their checksums or structure."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"superfile {path!r} is corrupt: {detail}")
        self.path = path
