"""A superfile as one snapshot's schema sees it: its columns under their current names and types.

A superfile keeps the column names of the schema it was written under (``SuperfileEntry.schema_id``;
``superfile.evolution``). :class:`FileColumns` maps the snapshot's columns onto them through their field
ids: a renamed column is read under its old name, a widened one is cast, one added after the file was
written reads its default (or null), one dropped since is never read. It also says which of the file's
indexes the snapshot may use: a full-text or vector index created after the file was written (or dropped and
created again) is not there for it, and a scalar index on a widened column holds the old type's values (the
scan decides instead). Vector values live in the vector blob of a file written while the column had a
vector index, and in Parquet otherwise.

Every read of a superfile's rows in the table layer goes through here (``Snapshot.open``), so scans, row
fetches, ``where`` filters and search results all see the snapshot's schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyroaring

from superfile.evolution import filled, physical_names, plain_field, schema_id, since_valid
from superfile.format import SuperfileReader
from superfile.format.fulltext import FullTextIndex
from superfile.format.layout import fts_section, idx_section, vec_section
from superfile.format.scalar_index import ScalarIndex
from superfile.format.vector_index import VectorIndex
from superfile.manifest.model import SuperfileEntry
from superfile.options import TableOptions
from superfile.schema import ID

__all__ = ["FileColumns"]


class FileColumns:
    """One superfile's columns and indexes under a snapshot's schema (see the module docstring)."""

    def __init__(self, reader: SuperfileReader, entry: SuperfileEntry, schema: pa.Schema, options: TableOptions):
        self.reader = reader
        self.entry = entry
        self.schema = schema
        self.options = options
        self.num_rows = reader.num_rows
        self._same = entry.schema_id == schema_id(schema)  # written under this schema: names are the file's
        self._names = None if self._same else physical_names(schema, entry.schema_id)

    def physical(self, column: str) -> str | None:
        """The column's name in the file (None: the file does not hold it)."""
        if self._same or column == ID:
            return column
        assert self._names is not None
        return self._names.get(column)

    # -- where a column's values are ----------------------------------------------------------------------
    def in_blob(self, column: str) -> bool:
        """Whether the column's values are in its vector blob (not in Parquet)."""
        p = self.physical(column)
        return p is not None and p not in self.reader.columns and vec_section(p) in self.reader.sections

    def _in_parquet(self, column: str) -> str | None:
        p = self.physical(column)
        return p if p is not None and p in self.reader.columns else None

    # -- the indexes this snapshot may use --------------------------------------------------------------
    def has_text_index(self, column: str) -> bool:
        """The file holds the column's current full-text index."""
        p = self.physical(column)
        return (
            p is not None
            and column in self.options.fts_columns
            and fts_section(p) in self.reader.sections
            and since_valid(self.schema, column, self.entry.schema_id)
        )

    def has_vector_index(self, column: str) -> bool:
        """The file holds the column's current vector index (same metric, built since it was created)."""
        p = self.physical(column)
        return (
            p is not None
            and column in self.options.vector_columns
            and vec_section(p) in self.reader.sections
            and since_valid(self.schema, column, self.entry.schema_id)
        )

    def has_scalar_index(self, column: str) -> bool:
        """The file holds a scalar index of the column, over values of the column's current type."""
        p = self.physical(column)
        if p is None or idx_section(p) not in self.reader.sections:
            return False
        return self._same or self._written_type(p) == self.schema.field(column).type

    def text_indexed(self, columns: Sequence[str]) -> set[str]:
        """Those of ``columns`` (full-text columns) whose index this file holds."""
        return {c for c in columns if self.has_text_index(c)}

    def fulltext(self, column: str) -> FullTextIndex:
        return self.reader.fulltext(self._must(column))

    def vector_index(self, column: str) -> VectorIndex:
        return self.reader.vector_index(self._must(column))

    def scalar_index(self, column: str) -> ScalarIndex:
        return self.reader.scalar_index(self._must(column))

    def _must(self, column: str) -> str:
        p = self.physical(column)
        assert p is not None, f"{self.reader.name} does not hold column {column!r}"
        return p

    @cached_property
    def _types(self) -> dict[str, pa.DataType]:
        """The file's own column types (of its Parquet columns)."""
        empty = self.reader.read(self.reader.columns, rows=np.zeros(0, np.int64))
        return {f.name: f.type for f in empty.schema}

    def _written_type(self, physical: str) -> pa.DataType | None:
        return self._types.get(physical)

    # -- rows -----------------------------------------------------------------------------------------
    def ids(self, rows: np.ndarray | None = None) -> np.ndarray:
        """``_id`` of the given row offsets (default: all), from the raw id section."""
        return self.reader.ids(rows)

    def read(self, columns: Sequence[str], rows: np.ndarray | None = None, *, use_threads: bool = True) -> pa.Table:
        """Columns (current names, current types; not ``_id``) of every row or of the given offsets in the given
        order: Parquet columns decoded, vector blobs decoded, columns the file lacks filled."""
        cols = list(columns)
        blob = [c for c in cols if self.in_blob(c)]
        if self._same and not blob:
            return self.reader.read(cols, rows=rows, use_threads=use_threads)
        stored = {c: p for c in cols if c not in blob and (p := self._in_parquet(c)) is not None}
        table = self.reader.read(list(dict.fromkeys(stored.values())), rows=rows, use_threads=use_threads)
        n = table.num_rows if stored else (self.num_rows if rows is None else len(rows))
        arrays: list[pa.Array | pa.ChunkedArray] = []
        fields: list[pa.Field] = []
        for c in cols:
            field = plain_field(self.schema.field(c))
            if c in blob:
                arrays.append(self.reader.vectors(self._must(c), rows))
            elif c in stored:
                column = table.column(stored[c])
                arrays.append(column if column.type == field.type else column.cast(field.type))
            else:
                arrays.append(filled(self.schema.field(c), n))
            fields.append(field)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def vectors(self, column: str, rows: np.ndarray | None = None) -> pa.Array:
        """A vector column's values (every row, or the given offsets in order), wherever the file keeps them."""
        if self.in_blob(column):
            return self.reader.vectors(self._must(column), rows)
        return self.read([column], rows).column(0).combine_chunks()

    def vector_rows(self, column: str, allow: pyroaring.AbstractBitMap | None) -> tuple[np.ndarray, np.ndarray]:
        """(row offsets, float32 matrix) of the rows of ``allow`` (default: all) that hold a vector."""
        rows = np.arange(self.num_rows, dtype=np.int64) if allow is None else _offsets(allow, self.num_rows)
        dim = self.schema.field(column).type.list_size
        if self.in_blob(column):
            return rows, np.asarray(self.reader.vector_index(self._must(column)).vectors(rows), np.float32)
        values = self.read([column], rows).column(0).combine_chunks()
        matrix = np.asarray(pc.list_flatten(values).to_numpy(zero_copy_only=False), np.float32)
        if values.null_count:  # flatten leaves null rows out
            valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), bool)
            rows = rows[valid]
        return rows, matrix.reshape(-1, dim)


def _offsets(rows: pyroaring.AbstractBitMap, limit: int) -> np.ndarray:
    found = np.frombuffer(rows.to_array(), np.uint32).astype(np.int64)
    return found[found < limit]
