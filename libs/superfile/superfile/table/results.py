"""A search's ranked ``_id`` and ``score`` columns, cut from Arrow tables made once per thread.

Every pyarrow constructor validates what it makes, and each validation lets the interpreter lock go. With a
second query thread waiting for the lock, each of those is a context switch each way: an answer made of two
arrays and a table cost three, where tantivy's own search costs one. An answer is small (``k`` rows), so its
two columns are written into the next free rows of a table this thread made for the answer's schema, and the
answer is a slice of that table; a slice validates nothing.

The rows an answer was given are never written again, so an answer is as immutable as any Arrow table. It
keeps its arena's buffers alive: an answer of k rows held costs an arena of ``max(_ROWS, 8 k)`` rows (3-4 KB
for k up to 32), not its own 120 bytes or so. Answers of more than ``_MOST_ROWS`` are made as they are.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

__all__ = ["ranked_ids", "ranked_table", "result_column"]

_ROWS = 256  # rows of an arena at least: a k=10 answer makes one every 25 answers
_MOST_ROWS = 1024  # the largest answer cut from an arena (hybrid's retrievers take 100 rows each)
_SCHEMAS = 4  # arenas a thread keeps (one per result schema in use: a snapshot's, and a new one's)


class _Arena:
    """A table of ``schema`` over two numpy arrays, of which rows ``used`` onwards are free."""

    __slots__ = ("ids", "schema", "scores", "table", "used")

    def __init__(self, schema: pa.Schema, rows: int) -> None:
        self.schema = schema
        self.ids = np.empty(rows, schema.field(0).type.to_pandas_dtype())
        self.scores = np.empty(rows, schema.field(1).type.to_pandas_dtype())
        self.table = _table(schema, self.ids, self.scores)  # over the arrays' memory: writes show through
        self.used = 0


class _Arenas(threading.local):
    def __init__(self) -> None:
        self.by_schema: dict[int, _Arena] = {}


_arenas = _Arenas()


def result_column(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """A fixed-width column over a fresh numpy array's memory: one validation, where ``pa.array`` makes two."""
    data = np.ascontiguousarray(values, dtype.to_pandas_dtype())
    return pa.Array.from_buffers(dtype, len(data), [None, pa.py_buffer(data.data)])


def ranked_table(schema: pa.Schema, ids: np.ndarray, scores: np.ndarray) -> pa.Table:
    """``ids`` and ``scores`` as a table of ``schema``: two fixed-width fields, the values not null."""
    n = len(ids)
    if n > _MOST_ROWS:
        return _table(schema, ids, scores)
    arenas = _arenas.by_schema
    arena = arenas.get(id(schema))
    if arena is None or arena.schema is not schema or arena.used + n > len(arena.ids):
        if len(arenas) >= _SCHEMAS and id(schema) not in arenas:
            arenas.clear()
        arena = arenas[id(schema)] = _Arena(schema, max(_ROWS, 8 * n))
    start = arena.used
    arena.ids[start : start + n] = ids
    arena.scores[start : start + n] = scores
    arena.used = start + n
    return arena.table.slice(start, n)


def _table(schema: pa.Schema, ids: np.ndarray, scores: np.ndarray) -> pa.Table:
    """``ids`` and ``scores`` as a table of ``schema``, over their memory (copied only to the field's type)."""
    arrays = [result_column(values, schema.field(i).type) for i, values in enumerate((ids, scores))]
    return pa.Table.from_arrays(arrays, schema=schema)


def ranked_ids(table: pa.Table) -> np.ndarray:
    """A search answer's ``_id`` column (its first; never null) as numpy, read from its buffers: ``to_numpy``
    lets the interpreter lock go four times."""
    parts = []
    for chunk in table.column(0).chunks:
        data = chunk.buffers()[1]
        if data is not None and len(chunk):
            parts.append(np.frombuffer(memoryview(data), np.uint64, len(chunk), chunk.offset * 8))
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.uint64)
