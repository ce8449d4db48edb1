"""Supertable: one table over many immutable superfiles, with SQL, BM25 and vector search.

>>> import superfile
>>> db = superfile.connect("memory://demo")

``superfile.connect_async`` gives the same API as coroutines (``db = await superfile.connect_async(uri)``).
"""

from superfile.api import AsyncCatalog, AsyncTable, Catalog, Table
from superfile.connection import Connection, connect, connect_async
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
from superfile.search.request import (
    Bm25Search,
    ExactMatch,
    HybridSearch,
    PrefixSearch,
    SearchRequest,
    TokenMatch,
    VectorSearch,
)
from superfile.table import Supertable, Transaction

__all__ = [
    "AsyncCatalog",
    "AsyncTable",
    "Bm25Search",
    "Catalog",
    "Connection",
    "ContentionError",
    "CorruptSuperfileError",
    "ExactMatch",
    "HybridSearch",
    "InvalidInputError",
    "InvalidPredicateError",
    "InvalidTableNameError",
    "InvalidVectorError",
    "PartitionSpec",
    "PrefixSearch",
    "ReadOnlyTableError",
    "SchemaMismatchError",
    "SearchRequest",
    "StorageError",
    "SuperfileError",
    "Supertable",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TableOptions",
    "TokenMatch",
    "Transaction",
    "UnknownColumnError",
    "VectorColumn",
    "VectorDimensionError",
    "VectorSearch",
    "VersionNotFoundError",
    "connect",
    "connect_async",
]
__version__ = "0.1.0"
