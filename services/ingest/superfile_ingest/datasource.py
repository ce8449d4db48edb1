"""``df.writeStream.format("superfile")``: a Spark 4 Python streaming data source.

Spark runs the pieces in different processes:

- at query start and when each micro-batch is planned (driver),
  :meth:`SuperfileDataSource.streamWriter` opens the table and checks the
  stream's schema against it, so a missing table or a mismatched schema fails
  the query before any data moves;
- on executors, :meth:`_StreamWriter.write` converts its partition's Arrow
  batches to the table's schema (:mod:`superfile_ingest.convert`: Spark tags
  ``TIMESTAMP`` columns with the session time zone) and returns them, with
  the query id read from the task's local properties (the writer is not told
  it), as the commit message; a batch that cannot be converted fails the task,
  so the query fails and nothing of the batch is published;
- once every task of the micro-batch succeeded (driver),
  :meth:`_StreamWriter.commit` gets the messages in partition order and the
  batch id, and publishes the batch as events with ``seq = (batch id, chunk)``;
  a message that is not a task's rows fails the batch (it never passes as an
  empty batch).

Publishing on the driver keeps one producer per batch, so the batch's seqs
reach the topic in increasing order, which the builder's per-source
de-duplication relies on (parallel tasks publishing to the one partition
would interleave). A failed task publishes nothing: ``abort`` has nothing to
undo.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType
from superfile.errors import InvalidInputError, InvalidOptionError
from superfile.options import TableOptions
from superfile.schema import user_schema

from superfile_ingest.convert import check_stream, conform
from superfile_ingest.publish import Target, publish_batch

__all__ = ["QUERY_ID_PROPERTY", "SuperfileDataSource"]

# The local property Spark's stream execution sets on every job of a query (StreamExecution.QUERY_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class _Rows(WriterCommitMessage):
    """One task's rows, already in the table's schema, and the query they belong to."""

    query_id: str
    rows: pa.Table


class _StreamWriter(DataSourceStreamArrowWriter):
    """Pickled to the executors with the table's schema and options, so tasks need no storage access."""

    def __init__(self, target: Target, schema: pa.Schema, options: TableOptions) -> None:
        self.target = target
        self.schema = schema
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Rows:  # type: ignore[override]  # pyspark narrows it
        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        if not query_id:
            raise InvalidInputError("the superfile sink runs only in a streaming query (no query id in the task)")
        parts = [conform(batch, self.schema, self.options) for batch in iterator if batch.num_rows]
        rows = pa.concat_tables(parts) if parts else user_schema(self.schema).empty_table()
        return _Rows(query_id, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, _Rows)]
        if len(done) != len(messages):
            odd = sorted({type(m).__name__ for m in messages if not isinstance(m, _Rows)})
            raise InvalidInputError(
                f"micro-batch {batchId}: {len(messages) - len(done)} of {len(messages)} tasks returned no rows "
                f"(commit message {', '.join(odd)}); nothing of the batch was published"
            )
        if not done:
            return  # a micro-batch of no partitions
        rows = pa.concat_tables([m.rows for m in done])
        log = self.target.event_log()
        try:
            publish_batch(log, self.target.table, done[0].query_id, batchId, rows)
        finally:
            log.close()


class SuperfileDataSource(DataSource):
    """Streaming sink ``superfile``; options ``table``, ``storage``, ``bootstrap``, ``topic_prefix``.

    Register it once per session: ``spark.dataSource.register(SuperfileDataSource)``.
    """

    @classmethod
    def name(cls) -> str:
        return "superfile"

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        if overwrite:
            raise InvalidOptionError("the superfile sink only appends; use outputMode('append'), not 'complete'")
        target = Target.from_options(self.options)
        table = target.open()
        check_stream(schema, table.schema, table.options)
        return _StreamWriter(target, table.schema, table.options)
