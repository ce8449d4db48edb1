"""Supertable: one table over many immutable superfiles, with SQL, BM25 and vector search.

>>> import superfile
>>> db = superfile.connect("memory://demo")
"""

from superfile.connection import Connection, connect
from superfile.errors import (
    ContentionError,
    CorruptSuperfileError,
    InvalidInputError,
    InvalidPredicateError,
    InvalidTableNameError,
    InvalidVectorError,
    ReadOnlyTableError,
    SchemaMismatchError,
    StorageError,
    SuperfileError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
    VectorDimensionError,
    VersionNotFoundError,
)
from superfile.options import PartitionSpec, TableOptions, VectorColumn
from superfile.table import Supertable, Transaction

__all__ = [
    "Connection",
    "ContentionError",
    "CorruptSuperfileError",
    "InvalidInputError",
    "InvalidPredicateError",
    "InvalidTableNameError",
    "InvalidVectorError",
    "PartitionSpec",
    "ReadOnlyTableError",
    "SchemaMismatchError",
    "StorageError",
    "SuperfileError",
    "Supertable",
    "TableExistsError",
    "TableNotFoundError",
    "TableOptions",
    "Transaction",
    "UnknownColumnError",
    "VectorColumn",
    "VectorDimensionError",
    "VersionNotFoundError",
    "connect",
]
__version__ = "0.1.0"
