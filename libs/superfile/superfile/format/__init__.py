"""The superfile format: one Parquet file that also carries its full-text and vector index blobs.

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
from superfile.format.writer import build_superfile

__all__ = [
    "FORMAT",
    "TOKENIZERS",
    "VERSION",
    "BuiltSuperfile",
    "FullTextIndex",
    "Section",
    "SuperfileReader",
    "SuperfileSpec",
    "VectorColumnSpec",
    "build_superfile",
]
