"""End-to-end ingest through the service suite: producer -> Kafka -> builder -> superfiles on S3, searchable.

    .venv/bin/python bench/ingest_bench.py --rows 200000 --event-rows 1000 --steady-seconds 30

Starts the real servers on 127.0.0.1 (tansu, moto's S3 server, Redis) and
one builder as a subprocess (``python -m superfile_builder``, default
settings unless given). The table has a full-text column and a 384-d vector
column (Cranfield/Vaswani rows repeated, vectors jittered).

1. Throughput: ``--rows`` rows published as fast as the producer gets
   acknowledgements (events of ``--event-rows`` rows), timed from the first
   publish until the manifest records the last event's offset (then both
   indexes answer for those rows: a commit publishes superfiles with their
   indexes built).
2. Latency: a steady ``--steady-rate`` rows/s for ``--steady-seconds``
   (one event every 100 ms); for each event, the time from calling publish
   until a reader's fresh look at the table sees it (``Position.visible_in``
   on the current manifest, polled every ``--poll-ms``). The CPU seconds each
   process (builder, S3 server, broker, Redis, this one) used meanwhile are
   recorded: on 2 shared cores they say who competes with the commits.

Saves bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import percentile, repeated, save
from superfile.events import Event, EventLog, Position
from superfile_suite import free_port, start_moto, start_redis, start_tansu

_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def _wait_visible(table: superfile.Supertable, position: Position, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not position.visible_in(table.properties):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{position.token} not visible after {timeout} s")
        time.sleep(0.01)
    return time.perf_counter()


_SCRAPED = ("commit_seconds_", "compaction_seconds_", "compaction_wait_seconds_")


def scrape(port: int) -> dict[str, float]:
    """The builder's own numbers: commits, compactions and the waits for them, with their total seconds,
    as /metrics reports them."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        name = name.split("{")[0].removeprefix("superfile_builder_")
        if name.startswith(_SCRAPED) and not name.endswith("_bucket"):
            values[name] = float(value)
    return values


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # fields from the state on


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) each process (with its live child processes, but for this one) has used so
    far, from /proc (Linux): the builder's includes its compaction process."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
    out = {}
    for name, pid in pids.items():
        family = {pid}
        if pid != os.getpid():  # this process's children are the servers, counted on their own
            family |= {child for child, parent in parents.items() if parent == pid}
        total = 0
        for member in family:
            with contextlib.suppress(OSError):
                fields = _stat(member)
                total += int(fields[11]) + int(fields[12])  # utime, stime
        out[name] = total / ticks
    return out


def throughput(log: EventLog, table: superfile.Supertable, rows: int, event_rows: int) -> dict[str, Any]:
    batches = list(repeated(rows, event_rows, seed=1))  # generated before the clock starts
    version = table.version
    start = time.perf_counter()
    last = None
    for i, batch in enumerate(batches):
        last = log.publish(Event("append", table.name, "bench-throughput", (i,), batch))
    published = time.perf_counter()
    assert last is not None
    done = _wait_visible(table, last, 600)
    elapsed = done - start
    assert table.count_rows() == rows + 1  # + the warm-up row
    probe = batches[-1]
    hits = table.bm25_search("text", str(probe["text"][0])[:60], k=5)
    near = table.vector_search("embedding", probe["embedding"][0].values.to_numpy(), k=5)
    assert hits.num_rows and near.num_rows
    return {
        "rows": rows,
        "event_rows": event_rows,
        "events": len(batches),
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "publish_seconds": published - start,
        "publish_rows_per_s": rows / (published - start),
        "commits": table.version - version,
        "superfiles": table.stats()["superfile_count"],
    }


def latency(log: EventLog, table: superfile.Supertable, rate: int, seconds: float, poll_ms: int) -> dict[str, Any]:
    per_event = max(1, rate // 10)  # one event every 100 ms
    batches = list(repeated(per_event * int(seconds * 10), per_event, seed=2))
    sent: list[tuple[float, Position]] = []
    seen: dict[int, float] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def watch() -> None:
        while not stop.is_set():
            applied = int(table.properties.get("log_offsets", {}).get(log.topic(table.name), 0))
            now = time.perf_counter()
            with lock:
                for _, pos in sent:
                    if pos.offset < applied and pos.offset not in seen:
                        seen[pos.offset] = now
            time.sleep(poll_ms / 1000)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        due = t0 + i * 0.1
        time.sleep(max(0.0, due - time.perf_counter()))
        called = time.perf_counter()
        pos = log.publish(Event("append", table.name, "bench-steady", (i,), batch))
        with lock:
            sent.append((called, pos))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if len(seen) == len(sent):
                break
        time.sleep(0.05)
    stop.set()
    watcher.join(timeout=5)
    lat = [seen[pos.offset] - called for called, pos in sent if pos.offset in seen]
    return {
        "rate_rows_per_s": per_event * 10,
        "seconds": seconds,
        "events": len(sent),
        "visible": len(lat),
        "poll_ms": poll_ms,
        "p50_s": percentile(lat, 50),
        "p95_s": percentile(lat, 95),
        "p99_s": percentile(lat, 99),
        "max_s": float(np.max(lat)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--event-rows", type=int, default=1000)
    p.add_argument("--steady-rate", type=int, default=2000)
    p.add_argument("--steady-seconds", type=float, default=30)
    p.add_argument("--poll-ms", type=int, default=20)
    p.add_argument("--builder-args", default="", help="extra builder flags, e.g. '--freshness-ms 500'")
    p.add_argument("--name", default="ingest")
    args = p.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    with (
        start_moto(log_path=str(workdir / "s3.log")) as s3,
        start_tansu(log_path=str(workdir / "kafka.log")) as kafka,
        start_redis(log_path=str(workdir / "redis.log")) as redis,
    ):
        os.environ.update({**_AWS, "AWS_ENDPOINT_URL": s3.url})
        boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1").create_bucket(Bucket="bench")
        uri = f"s3://bench/tables?endpoint_url={s3.url}"
        sample = next(repeated(1, 1))
        table = superfile.connect(uri).create_table(
            "ingest", sample.schema, fts_columns=["text"], vector_columns={"embedding": {"dim": 384}}
        )
        argv = [sys.executable, "-m", "superfile_builder", "--storage", uri, "--kafka", kafka.url]
        metrics_port = free_port()
        argv += ["--redis", redis.url, "--tables", "ingest", "--metrics-port", str(metrics_port)]
        argv += args.builder_args.split()
        with open(workdir / "builder.log", "wb") as out:
            builder = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        log = EventLog(kafka.url)
        try:
            warmup = log.publish(Event("append", "ingest", "bench-warmup", (0,), sample))
            _wait_visible(table, warmup, 120)  # the builder is up and holds the lease before any clock starts
            results: dict[str, Any] = {
                "config": {
                    "builder_args": args.builder_args or "(defaults)",
                    "storage": "moto S3 server on 127.0.0.1",
                    "broker": "tansu (memory storage) on 127.0.0.1",
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
                    "load_average_at_start": os.getloadavg()[0],
                },
                "throughput": throughput(log, table, args.rows, args.event_rows),
            }
            results["throughput"]["builder_commits"] = scrape(metrics_port)
            print(results["throughput"], flush=True)
            pids = {"builder (+ its compaction process)": builder.pid, "s3 (moto)": s3.proc.pid}
            pids |= {"broker (tansu)": kafka.proc.pid, "redis": redis.proc.pid, "bench (producer, reader)": os.getpid()}
            cpu_before = cpu_seconds(pids)
            results["latency"] = latency(log, table, args.steady_rate, args.steady_seconds, args.poll_ms)
            cpu_after = cpu_seconds(pids)
            results["latency"]["cpu_seconds"] = {k: round(cpu_after[k] - cpu_before[k], 1) for k in pids}
            before, after = results["throughput"]["builder_commits"], scrape(metrics_port)
            window = {k: after[k] - before.get(k, 0.0) for k in after}  # the steady phase's share
            count = window["commit_seconds_count"]
            results["latency"]["builder_commits"] = {
                "count": count,
                "mean_commit_s": window["commit_seconds_sum"] / max(count, 1),
                "compactions": window.get("compaction_seconds_count", 0.0),
                "compaction_s": window.get("compaction_seconds_sum", 0.0),
                "commits_waiting_for_compaction": window.get("compaction_wait_seconds_count", 0.0),
            }
            print(results["latency"], flush=True)
        finally:
            log.close()
            builder.terminate()
            try:
                builder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                builder.kill()
    print(save(args.name, results))


if __name__ == "__main__":
    main()
