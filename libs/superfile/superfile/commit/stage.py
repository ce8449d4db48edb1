"""Stage: the write buffer where a writer's rows wait, ``_id`` already assigned, until commit or flush."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["WriteBuffer"]


class WriteBuffer:
    """Staged rows of one writer. ``nbytes`` lets the writer flush when the buffer grows past its threshold."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._tables: list[pa.Table] = []
        self.nbytes = 0
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self._tables.append(table)
            self.nbytes += table.nbytes
            self.rows += table.num_rows

    def table(self) -> pa.Table:
        if not self._tables:
            return self.schema.empty_table()
        return pa.concat_tables(self._tables).combine_chunks()

    def replace(self, table: pa.Table) -> None:
        """Swap the staged rows for ``table`` (after a staged delete removed some)."""
        self._tables = []
        self.nbytes = self.rows = 0
        self.add(table)

    def take(self) -> pa.Table:
        table = self.table()
        self.replace(self.schema.empty_table())
        return table
