"""Schema changes in suite mode (docs/schema.md, "Suite mode"): the gateway commits them directly, as it does
``optimize``; the builder's batches around them still apply every event, whichever schema it was checked
against."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import superfile
from builder_support import BuilderProcess, create_table, gauge, rows, wait_until
from superfile.events import Event, EventLog
from superfile_suite import Server, free_port


def test_a_schema_change_lands_inside_a_builders_batch(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)  # key, n, body (full-text)
    port = free_port()
    # thresholds no test reaches: one batch stays open across the schema change, the stop commits it
    builder = builders([table_name], freshness_ms=600_000, commit_rows=10**9, lease_ms=60_000, metrics_port=port)
    log = EventLog(kafka.url)
    try:
        log.publish(Event("append", table_name, "p", (1,), rows(["old-1"], n=1)))
        log.publish(Event("delete", table_name, "p", (2,), where="n = 5"))  # opens the batch's transaction
        wait_until(lambda: gauge(port, "superfile_builder_consumed_offset", table_name) == 2, 30, "staged")
        # what POST/PATCH/DELETE /tables/{name}/columns do in suite mode: one direct commit each
        table.rename_column("body", "text")
        table.add_columns([pa.field("tag", pa.string(), nullable=False)], defaults={"tag": "none"})
        table.drop_columns("n")
        # an append a gateway checked before it read the change (old names), and one of the new schema
        log.publish(Event("append", table_name, "p", (3,), rows(["old-2"], n=2)))
        new = pa.table({"key": ["new-1"], "text": ["fresh words here"], "tag": ["t"]})
        log.publish(Event("append", table_name, "p", (4,), new))
        log.publish(Event("delete", table_name, "p", (5,), where="tag = 'gone'"))
        wait_until(lambda: gauge(port, "superfile_builder_consumed_offset", table_name) == 5, 30, "consumed")
    finally:
        log.close()
    builder.stop()
    assert builder.proc is not None and builder.proc.returncode == 0, builder.output()
    after = superfile.connect(s3_uri).open_table(table_name)
    assert after.schema.names == ["_id", "key", "text", "tag"]
    got = {r["key"]: (r["text"], r["tag"]) for r in after.to_arrow(["key", "text", "tag"]).to_pylist()}
    assert got == {
        "old-1": ("row old-1 text", "none"),
        "old-2": ("row old-2 text", "none"),
        "new-1": ("fresh words here", "t"),
    }, builder.output()
    assert after.bm25_search("text", "fresh", k=3, projection=["key"]).column("key").to_pylist() == ["new-1"]
    assert [h["operation"] for h in after.versions()][1:4] == ["rename_column", "add_columns", "drop_columns"]
