"""What the ``superfile`` command reads: rows from a Parquet, CSV or JSON-lines file (or stdin) as a stream of
record batches, and text arguments that may come from stdin (``-``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from superfile.errors import InvalidInputError

__all__ = ["INPUT_FORMATS", "Rows", "open_rows", "text_argument"]

INPUT_FORMATS = ("parquet", "csv", "jsonl")
_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}
_PARQUET_BATCH_ROWS = 65_536


def text_argument(value: str, what: str) -> str:
    """``value``, or all of stdin when it is ``-`` (a query or a vector too long or awkward for the shell)."""
    if value != "-":
        return value
    text = sys.stdin.read().strip()
    if not text:
        raise InvalidInputError(f"the {what} read from stdin is empty")
    return text


@dataclass
class Rows:
    """A file's rows as a stream: its schema, its batches (read lazily, once) and, when the file says (Parquet),
    how many rows it has."""

    name: str
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    total: int | None

    def reader(self, on_batch: Callable[[int], None] | None = None) -> pa.RecordBatchReader:
        """The rows as a record batch reader (what ``Table.append`` streams in bounded memory); ``on_batch`` is
        told each batch's row count as it is read. A file that cannot be read further (a malformed row, a value
        of the wrong type) raises :class:`InvalidInputError` naming the file and how many rows were read."""

        def counted() -> Iterator[pa.RecordBatch]:
            read = 0
            try:
                for batch in self.batches:
                    read += batch.num_rows
                    if on_batch is not None:
                        on_batch(batch.num_rows)
                    yield batch
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                raise InvalidInputError(f"{self.name}: {_one_line(e)} (after {read} rows)") from None

        return pa.RecordBatchReader.from_batches(self.schema, counted())


def open_rows(path: str, fmt: str | None = None, types: dict[str, pa.DataType] | None = None) -> Rows:
    """The rows of ``path`` (``-``: stdin) as a stream. ``fmt`` is ``parquet``, ``csv`` or ``jsonl``; without it
    the file's extension tells, else its first bytes. ``types``: the columns' types, for a CSV file (whose text
    would otherwise be guessed at; an empty field is null); the engine converts other inputs to the table's
    types itself.
    Parquet from stdin is read into memory first (its footer, which says where the rows are, comes last)."""
    name = "stdin" if path == "-" else path
    source: Any
    try:
        if path == "-":
            source = sys.stdin.buffer
            head = source.peek(64)[:64] if hasattr(source, "peek") else b""
        else:
            if not Path(path).is_file():
                raise InvalidInputError(f"no such file: {path}")
            source = path
            with open(path, "rb") as f:
                head = f.read(64)
        fmt = fmt or _EXTENSIONS.get(Path(path).suffix.lower()) or _sniff(head)
        if fmt == "parquet":
            return _parquet(name, source)
        if fmt == "csv":
            return _csv(name, source, types or {})
        return _jsonl(name, source)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"{name}: not a readable {fmt} file: {_one_line(e)}") from None


def _sniff(head: bytes) -> str:
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.lstrip().startswith(b"{"):
        return "jsonl"
    return "csv"


def _parquet(name: str, source: str | IO[bytes]) -> Rows:
    f = pq.ParquetFile(source if isinstance(source, str) else pa.BufferReader(source.read()))
    return Rows(name, f.schema_arrow, f.iter_batches(batch_size=_PARQUET_BATCH_ROWS), f.metadata.num_rows)


def _csv(name: str, source: str | IO[bytes], types: dict[str, pa.DataType]) -> Rows:
    options = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)  # an empty field: null
    reader = pacsv.open_csv(source, convert_options=options)
    return Rows(name, reader.schema, iter(reader), None)


def _jsonl(name: str, source: str | IO[bytes]) -> Rows:
    reader = pajson.open_json(source)
    return Rows(name, reader.schema, iter(reader), None)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
