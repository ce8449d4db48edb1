"""``df.writeStream.foreachBatch(ForeachBatchSink(...))``: the same publishing, as a ``foreachBatch`` function.

Spark calls the function on the driver with the micro-batch and its id; the
query id is the local property the stream execution sets on the calling
thread. The batch's Spark schema is checked as the data source checks it at
query start (once per schema), the batch collected with ``DataFrame.toArrow()``
(``TIMESTAMP`` columns tagged UTC), converted with the session time zone
(:mod:`superfile_ingest.convert`) and published exactly as the data source
publishes it, so both sinks give a batch the same rows and event identities.
"""

from __future__ import annotations

from typing import Any

from superfile.errors import InvalidInputError

from superfile_ingest.convert import SESSION_TIME_ZONE, check_stream, conform
from superfile_ingest.datasource import QUERY_ID_PROPERTY
from superfile_ingest.publish import Target, publish_batch

__all__ = ["ForeachBatchSink"]


class ForeachBatchSink:
    """Publishes each micro-batch to a table's topic; opens the table up front (a missing table fails here)."""

    def __init__(self, *, table: str, storage: str, bootstrap: str, topic_prefix: str = "superfile") -> None:
        self.target = Target(table, storage, bootstrap, topic_prefix)
        opened = self.target.open()
        self._schema, self._options = opened.schema, opened.options
        self._checked: Any = None  # the last Spark schema check_stream accepted

    def __call__(self, df: Any, batch_id: int) -> None:
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise InvalidInputError("ForeachBatchSink runs only as a streaming query's foreachBatch function")
        if df.schema != self._checked:
            check_stream(df.schema, self._schema, self._options)
            self._checked = df.schema
        time_zone = df.sparkSession.conf.get(SESSION_TIME_ZONE)
        rows = conform(df.toArrow(), self._schema, self._options, time_zone)
        if not rows.num_rows:
            return
        log = self.target.event_log()  # per batch, like the data source: nothing to close when the query ends
        try:
            publish_batch(log, self.target.table, query_id, batch_id, rows)
        finally:
            log.close()
