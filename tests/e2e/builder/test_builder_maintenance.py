"""Maintenance in the suite: the builder compacts by policy, applies restores in log order, and the gateway's
maintenance and history endpoints work against a table the builder writes."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pyarrow as pa
import pytest
import superfile
from builder_support import SCHEMA, BuilderProcess, create_table, gauge, rows, wait_until
from superfile.events import Event, EventLog, Position
from superfile.maintenance import CompactionPolicy, Compactor
from superfile.table.optimize import optimize
from superfile_builder.__main__ import parse_args
from superfile_gateway import BackgroundServer, Settings
from superfile_suite import Server, free_port

TARGET = 40  # rows per compacted superfile: small enough that 300 rows make several
SMALL_FILES = 4


def _keys(table: superfile.Supertable) -> list[str]:
    return sorted(table.to_arrow(["key"]).column("key").to_pylist())


def _applied(table: superfile.Supertable, position: Position) -> bool:
    return position.visible_in(table.properties)


def test_compaction_keeps_the_superfile_count_bounded_and_every_row_once(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = superfile.connect(s3_uri).create_table(
        table_name, SCHEMA, fts_columns=["body"], max_rows_per_superfile=TARGET
    )
    port = free_port()
    # Each 5-row append is its own commit (its own superfile); deletes and an update travel in between.
    builder = builders([table_name], commit_rows=5, compact_small_files=SMALL_FILES, metrics_port=port)
    expected: set[str] = set()
    log = EventLog(kafka.url)
    seq = 0

    def publish(event: Callable[[int], Event]) -> Position:
        nonlocal seq
        seq += 1
        return log.publish(event(seq))

    try:
        for i in range(60):
            keys = [f"k{i:02d}-{j}" for j in range(5)]
            publish(lambda s, keys=keys: Event("append", table_name, "p", (s,), rows(keys)))  # type: ignore[misc]
            expected |= set(keys)
            if i % 12 == 11:
                victim = f"k{i - 6:02d}-0"
                publish(lambda s, v=victim: Event("delete", table_name, "p", (s,), where=f"key = '{v}'"))  # type: ignore[misc]
                expected.discard(victim)
        last = publish(lambda s: Event("update", table_name, "p", (s,), rows(["k03-1"], n=9), where="key = 'k03-1'"))
    finally:
        log.close()
    wait_until(lambda: _applied(table, last), 120, f"the builder to apply {last.token}:\n{builder.output()}")

    got = table.to_arrow(["_id", "key", "n"])
    keys = got.column("key").to_pylist()
    assert len(keys) == len(set(keys)) == len(expected) and set(keys) == expected  # every row exactly once
    assert len(set(got.column("_id").to_pylist())) == len(keys)
    assert table.to_arrow(["n"], where="key = 'k03-1'").column("n").to_pylist() == [9]
    assert table.bm25_search("body", "k59-4", k=1, projection=["key"]).column("key").to_pylist() == ["k59-4"]

    history = table.versions()
    compactions = [h for h in history if h["operation"] == "optimize"]
    assert len(compactions) >= 5, [h["operation"] for h in history]
    assert all(h["rows_added"] == 0 and h["rows_deleted"] == 0 for h in compactions)  # contents unchanged
    counts = [table.checkout(h["version"]).stats()["superfile_count"] for h in history]
    writes = sum(1 for h in history if h["operation"] in ("append", "update", "transaction"))
    # Superfiles of at least half the target, plus fewer than the policy's stop count of smaller ones and the
    # one a commit adds (commits wait for the compaction there); without compaction there would be one per write.
    bound = CompactionPolicy(SMALL_FILES).stop_files + 1 + math.ceil((len(expected) + 6) / (TARGET / 2))
    assert max(counts) <= bound < writes, (max(counts), bound, writes)
    assert counts[-1] <= bound
    assert (gauge(port, "superfile_builder_compactions_total", table_name) or 0) >= len(compactions) > 0
    # cleanup by retention runs by itself too (on the first commit, then hourly; it keeps this young table whole)
    assert (gauge(port, "superfile_builder_cleanups_total", table_name) or 0) >= 1
    # A compaction may still publish beside the last commit; the gauge follows the newest version.
    wait_until(
        lambda: gauge(port, "superfile_builder_superfiles", table_name) == table.stats()["superfile_count"],
        30,
        "the superfile gauge to show the current version",
    )
    # The compaction process dies with its builder, even one killed by SIGKILL (which cannot stop it).
    assert builder.proc is not None
    workers = _children(builder.proc.pid)
    assert workers, "the builder's compaction process"
    builder.kill()
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 10, "the workers to exit")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_restore_events_apply_in_log_order(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    table = create_table(s3_uri, table_name)
    port = free_port()
    builder = builders([table_name], metrics_port=port)
    log = EventLog(kafka.url)
    try:
        first = log.publish(Event("append", table_name, "p", (1,), rows(["a", "b"])))
        wait_until(lambda: _applied(table, first), 30, f"the first append:\n{builder.output()}")
        v_ab = table.version
        # Staged in one go: the appends and the delete before the restore commit first, the restore undoes
        # them, and what follows it lands on the restored contents.
        log.publish(Event("append", table_name, "p", (2,), rows(["c"])))
        log.publish(Event("delete", table_name, "p", (3,), where="key = 'a'"))
        log.publish(Event("restore", table_name, "p", (4,), version=v_ab))
        log.publish(Event("append", table_name, "p", (5,), rows(["d"])))
        log.publish(Event("restore", table_name, "p", (6,), version=999))  # not a version: rejected
        log.publish(Event("restore", table_name, "p", (4,), version=1))  # a replayed seq: dropped
        last = log.publish(Event("append", table_name, "p", (7,), rows(["e"])))
    finally:
        log.close()
    wait_until(lambda: _applied(table, last), 30, f"the builder to apply {last.token}:\n{builder.output()}")
    assert _keys(table) == ["a", "b", "d", "e"]
    ops = [h["operation"] for h in table.versions()]
    assert ops.count("restore") == 1 and ops[0] == "create"
    restore_at = ops.index("restore")
    assert "delete" in ops[:restore_at] or "transaction" in ops[:restore_at]  # committed before the restore
    assert table.checkout(restore_at + 1).to_arrow(["key"]).column("key").to_pylist() == ["a", "b"]
    metrics = _metrics(port)
    assert any('reason="rejected"' in k and f'table="{table_name}"' in k and v == 1 for k, v in metrics.items())
    assert any('reason="duplicate"' in k and f'table="{table_name}"' in k and v == 1 for k, v in metrics.items())


def _metrics(port: int) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_sdk_through_the_suite(
    s3_uri: str, kafka: Server, builders: Callable[..., BuilderProcess], table_name: str
) -> None:
    """SDK -> gateway (suite mode) -> broker -> builder -> S3: restore waits for the builder, history reads and
    compaction run against the table the builder writes, and every row stays exactly once."""
    settings = Settings(storage=s3_uri, auth=False, kafka=kafka.url, wait_timeout_s=30)
    with BackgroundServer(settings) as server, superfile.connect(server.url) as db:
        table = db.create_table(table_name, SCHEMA, fts_columns=["body"])
        builder = builders([table_name])
        v_ab = table.append(rows(["a", "b"]))
        assert v_ab is not None and v_ab > 1, builder.output()
        table.append(rows(["c"]))
        v_del = table.delete("key = 'a'")
        assert v_del is not None and _keys(table) == ["b", "c"]
        restored = table.restore(v_ab)  # an event; returns the version the builder made it visible in
        assert restored is not None and restored > v_del
        assert _keys(table) == ["a", "b"]
        assert table.changes(v_ab).num_rows == 0  # the same contents again
        feed = table.changes(v_del, columns=["key"])
        assert [(r["_change"], r["key"]) for r in feed.to_pylist()] == [("insert", "a"), ("delete", "c")]
        history = table.versions()
        assert "restore" in [h["operation"] for h in history]
        when = next(h["timestamp_ms"] for h in history if h["version"] == v_del)
        at = db.open_table(table_name, as_of=when)
        assert at.version >= v_del and _keys(at) == ["b", "c"]
        for i in range(3):  # a commit (a superfile) each
            table.append(rows([f"x{i}"]))
        # Compaction runs in the gateway while the builder keeps applying writes.
        for i in range(3, 6):
            table.append(rows([f"x{i}"]), wait=False)
        result = table.optimize()
        assert result["superfiles_removed"] >= 4, result
        for i in range(6, 9):
            table.append(rows([f"x{i}"]), wait=False)
        assert table.count_rows() == 11  # waits for the last write
        assert _keys(table) == ["a", "b", *(f"x{i}" for i in range(9))]
        assert table.cleanup(7200)["files_removed"] == 0  # everything is younger: nothing of the builder's goes
    engine = superfile.connect(s3_uri).open_table(table_name)
    assert engine.count_rows() == 11 and len(set(engine.to_arrow(["_id"]).column("_id").to_pylist())) == 11


def test_compaction_leaves_compacted_superfiles_alone(s3_uri: str, table_name: str) -> None:
    """What the builder's policy relies on: a later compaction merges the new small superfiles and leaves the
    outputs of an earlier one (at least half the target each) as they are, so compacting often stays cheap."""
    table = superfile.connect(s3_uri).create_table(table_name, SCHEMA, max_rows_per_superfile=TARGET)
    for i in range(25):  # 250 rows in 10-row commits
        table.append(rows([f"a{i}-{j}" for j in range(10)]))
    first = table.optimize()
    assert first["superfiles_added"] == 7  # balanced: about 36 rows each, all at least half the target
    for i in range(5):
        table.append(pa.Table.from_pylist([{"key": f"b{i}", "n": 0, "body": "x"}], schema=SCHEMA))
    second = table.optimize()
    assert (second["superfiles_removed"], second["rows_rewritten"]) == (5, 5), second  # only the new rows


def test_one_compaction_run_is_bounded_and_takes_the_smallest_first(table_name: str) -> None:
    """The builder's selection: a backlog of nearly-half-target superfiles does not make one run rewrite the
    whole partition; the freshest, smallest superfiles go first, and the run stops once the target is reached."""
    table = superfile.connect(f"memory://{table_name}").create_table(table_name, SCHEMA, max_rows_per_superfile=TARGET)
    for i in range(6):  # the backlog: 19 rows each, just under half the target
        table.append(rows([f"b{i}-{j}" for j in range(19)]))
    for i in range(20):
        table.append(rows([f"s{i}"]))
    policy = CompactionPolicy(SMALL_FILES)
    assert policy.due(table._snapshot.entries(), TARGET) and policy.stalled(table._snapshot.entries(), TARGET)
    result = optimize(table, select=policy.select, parallel=False)
    # The 20 one-row superfiles reach half the target (20 rows): one output that is no longer small, and the
    # backlog is left for the next run.
    assert (result["superfiles_removed"], result["rows_rewritten"], result["superfiles_added"]) == (20, 20, 1)
    assert table.count_rows() == 6 * 19 + 20 and table.stats()["superfile_count"] == 6 + 1
    assert policy.due(table._snapshot.entries(), TARGET)  # 6 small superfiles left: more than 4, run again
    result = optimize(table, select=policy.select, parallel=False)
    assert (result["superfiles_removed"], result["rows_rewritten"], result["superfiles_added"]) == (2, 38, 1)
    assert not policy.due(table._snapshot.entries(), TARGET)  # 4 small superfiles left


def test_compaction_process_runs_and_a_crashed_one_is_replaced(tmp_path: Path, table_name: str) -> None:
    """The builder's compaction process: a run happens there (the table changes under this process's handle),
    a killed process fails only the run it had, and the next run gets a new process."""
    uri = f"file://{tmp_path}"
    table = superfile.connect(uri).create_table(table_name, SCHEMA, max_rows_per_superfile=TARGET)
    for i in range(6):
        table.append(rows([f"a{i}"]))
    compactor = Compactor(uri, CompactionPolicy(2))
    try:
        result = compactor.run(table_name)
        assert result is not None and result["superfiles_removed"] == 6, result
        assert table.stats()["superfile_count"] == 1 and table.count_rows() == 6
        assert compactor.run(table_name) is None  # nothing due
        pool = compactor._pool
        assert pool is not None
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            compactor.run(table_name)
        for i in range(3):
            table.append(rows([f"b{i}"]))
        result = compactor.run(table_name)  # a new process
        assert result is not None and result["superfiles_removed"] == 4, result
        assert sorted(_keys(table)) == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(3)])
    finally:
        compactor.close()


def test_compaction_process_reads_s3_superfiles_through_the_given_cache(
    s3_uri: str, tmp_path: Path, table_name: str
) -> None:
    """The builder's cache options reach its compaction process: the superfiles it compacts on S3 are read
    through copies in the given directory."""
    table = superfile.connect(s3_uri).create_table(table_name, SCHEMA, max_rows_per_superfile=TARGET)
    for i in range(4):
        table.append(rows([f"a{i}"]))
    args = parse_args(["--storage", s3_uri, "--kafka", "k:1", "--redis", "redis://r", "--cache-dir", str(tmp_path)])
    options = {"cache_dir": args.cache_dir, "cache_budget_bytes": args.cache_budget_bytes}
    inputs = sum(e.size for e in table.snapshot().entries())
    compactor = Compactor(s3_uri, CompactionPolicy(2), options)
    try:
        result = compactor.run(table_name)
        assert result is not None and result["superfiles_removed"] == 4, result
    finally:
        compactor.close()
    assert result["bytes_downloaded"] == inputs  # it read the four through copies in the given directory
    assert not list((tmp_path / "superfiles").iterdir())  # released once the compaction replaced them
    with pytest.raises(SystemExit):
        parse_args(["--storage", s3_uri, "--kafka", "k:1", "--redis", "redis://r", "--cache-budget-bytes", "-1"])


def test_retention_below_the_cleanup_floor_is_refused() -> None:
    """--retention-s is also the safety margin for files of commits in flight: it may not go below
    --cleanup-min-age-s (an hour unless lowered, as the soak does for a 30-minute run)."""
    base = ["--storage", "file:///x", "--kafka", "k:1", "--redis", "redis://r"]
    with pytest.raises(SystemExit):
        parse_args([*base, "--retention-s", "600"])
    with pytest.raises(SystemExit):
        parse_args([*base, "--retention-s", "100", "--cleanup-min-age-s", "120"])
    with pytest.raises(SystemExit):
        parse_args([*base, "--cleanup-min-age-s", "0"])
    args = parse_args([*base, "--retention-s", "180", "--cleanup-min-age-s", "120"])
    assert (args.retention_s, args.cleanup_min_age_s) == (180, 120)
