"""The superfile format: one Parquet file that also carries its full-text, vector and scalar index blobs.

Any Parquet reader reads the columns; this package also reads the blobs. The
byte layout is documented in ``docs/format.md`` and :mod:`superfile.format.layout`.
"""

from superfile.format.fulltext import TOKENIZERS, FullTextIndex
from superfile.format.layout import (
    FORMAT,
    VERSION,
    BuiltSuperfile,
    Section,
    SuperfileSpec,
    VectorColumnSpec,
)
from superfile.format.reader import SuperfileReader
from superfile.format.scalar_index import BITMAP_CARDINALITY_LIMIT, ScalarIndex
from superfile.format.writer import build_superfile

__all__ = [
    "BITMAP_CARDINALITY_LIMIT",
    "FORMAT",
    "TOKENIZERS",
    "VERSION",
    "BuiltSuperfile",
    "FullTextIndex",
    "ScalarIndex",
    "Section",
    "SuperfileReader",
    "SuperfileSpec",
    "VectorColumnSpec",
    "build_superfile",
]
