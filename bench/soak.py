"""A soak of the service suite: streaming ingest for ``--minutes`` with compaction and cleanup on.

    flock /tmp/supertable-bench.lock .venv/bin/python bench/soak.py --minutes 30 --rate 2000

Starts the real servers on 127.0.0.1 (tansu, moto's S3 server, Redis), one
builder (``python -m superfile_builder``: automatic compaction at its default
policy, cleanup every ``--cleanup-interval-s`` keeping ``--retention-s``) and
the gateway in suite mode (``python -m superfile_gateway``). The table has a
full-text column and a 384-d vector column (the ingest bench's rows, each with
a unique ``doc_id``).

This process is the producer: one event of ``rate / 10`` rows every 100 ms
straight to the broker (as the Spark ingest job does). A watcher thread times
each event from calling publish until a fresh look at the table's manifest
records its offset (publish-to-visible); a reader thread sends a BM25 search,
a vector search or a count through the gateway every 2 s. Every 5 s the RSS
of each process is sampled (anonymous and file-backed memory apart: the
superfile caches map files); every minute, the bytes in the bucket, the bytes
of the current version's superfiles, the current and retained versions, the
superfile count and the builder's counters.

At the end: the table must hold every published row exactly once (distinct
``doc_id`` count = rows published); verdicts on p95 (first vs last minutes),
RSS slope per process over the second half, and whether the bytes not in the
current version stay bounded. Writes bench/results/soak.json, a Markdown table
to bench/results/soak.md and the plot to docs/soak.svg.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import secrets
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
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import ROOT, corpus, percentile, save
from superfile.events import Event, EventLog, Position
from superfile_suite import free_port, start_moto, start_redis, start_tansu

_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
_MB = 1 << 20
_SAMPLE_S = 5.0  # RSS sampling period
_SCRAPED = (
    "commits_total",
    "compactions_total",
    "superfiles_compacted_total",
    "cleanups_total",
    "files_removed_total",
    "errors_total",
    "compaction_wait_seconds_count",
    "compaction_wait_seconds_sum",
    "commit_seconds_count",
    "commit_seconds_sum",
)


class Rows:
    """The ingest bench's rows (Cranfield and Vaswani text, 384-d vectors jittered) made on demand, each
    with the next ``doc_id``: 30 minutes at 2,000 rows/s is 3.6M rows, too many to make ahead."""

    def __init__(self, seed: int = 7) -> None:
        base = corpus()
        self.text = base["text"].combine_chunks()
        self.vectors = np.asarray(pc.list_flatten(base["embedding"]).to_numpy(), np.float32).reshape(-1, 384)
        self.rng = np.random.default_rng(seed)
        self.made = 0

    def batch(self, n: int) -> pa.Table:
        idx = (np.arange(self.made, self.made + n) % len(self.vectors)).astype(np.int64)
        vec = self.vectors[idx] + self.rng.normal(0, 0.01, (n, 384)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        out = pa.table(
            {
                "doc_id": pa.array(np.arange(self.made, self.made + n), pa.int64()),
                "text": self.text.take(idx),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 384),
            }
        )
        self.made += n
        return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                kids[int(stat[1])].append(int(entry.name))
    return kids


def _memory(pid: int) -> tuple[float, float, float] | None:
    """(RSS, anonymous, file-backed) MB of one process, from /proc (Linux); None once it is gone."""
    fields: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0]) / 1024
    except OSError:
        return None
    return (
        fields.get("VmRSS", 0.0),
        fields.get("RssAnon", 0.0),
        fields.get("RssFile", 0.0) + fields.get("RssShmem", 0.0),
    )


def _cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far, from /proc; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def sample_rss(roots: dict[str, int]) -> dict[str, dict[str, float]]:
    """Memory of each named process and, as ``<name> (children)``, of all its descendants together (the
    builder's compaction process, the gateway's SQL workers); this process's children are the servers,
    measured on their own, so its own line is itself alone."""
    kids = _children()
    out: dict[str, dict[str, float]] = {}
    for name, pid in roots.items():
        mem, cpu = _memory(pid), _cpu(pid)
        if mem is not None and cpu is not None:
            out[name] = {"rss": mem[0], "anon": mem[1], "file": mem[2], "cpu": cpu}
        if pid == os.getpid():
            continue
        family, todo = [], list(kids.get(pid, []))
        while todo:
            child = todo.pop()
            family.append(child)
            todo.extend(kids.get(child, []))
        mems = [m for m in map(_memory, family) if m is not None]
        if mems:
            out[f"{name} (children)"] = {k: sum(m[i] for m in mems) for i, k in enumerate(("rss", "anon", "file"))}
            out[f"{name} (children)"]["cpu"] = sum(c for c in map(_cpu, family) if c is not None)
    return out


def deleted_mapped_mb(pid: int) -> float:
    """Resident MB of files the process still maps after they were deleted (a cache evicted them, or
    cleanup removed them, while a reader held them open)."""
    total, deleted = 0, False
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                deleted = line.endswith("(deleted)")
            elif deleted and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total / 1024


def scrape(port: int) -> dict[str, float]:
    """The builder's counters (commits, compactions, cleanups, files removed, errors) from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        name = name.split("{")[0].removeprefix("superfile_builder_")
        if name in _SCRAPED:
            values[name] += float(value)
    return dict(values)


def storage_bytes(s3: Any, bucket: str) -> dict[str, int]:
    """Objects and bytes in the bucket, and bytes by kind (the top folder under the table)."""
    total = count = 0
    kinds: dict[str, int] = collections.defaultdict(int)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            total += obj["Size"]
            count += 1
            parts = obj["Key"].split("/")
            kinds[parts[2] if len(parts) > 3 else "other"] += obj["Size"]
    return {"bytes": total, "objects": count, **{f"bytes_{k}": v for k, v in sorted(kinds.items())}}


def cache_usage(directory: Path) -> dict[str, int]:
    """A process's local cache directory: its bytes (links not followed), and how many superfiles have their
    full-text indexes extracted there (one directory each beside ``superfiles/``, the disk cache's copies,
    and ``unions/``)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    skip = ("superfiles", "unions")
    with contextlib.suppress(OSError):
        extractions = sum(1 for e in os.scandir(directory) if e.is_dir() and e.name not in skip and e.name[0] != ".")
        return {"bytes": total, "extractions": extractions}
    return {"bytes": total, "extractions": 0}


def slope(ys: list[float]) -> float:
    """Least-squares slope per step (per minute here)."""
    if len(ys) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(ys), dtype=float), np.asarray(ys, float), 1)[0])


def trend(ys: list[float], floor: float, share: float) -> dict[str, Any]:
    """Fit a line over ``ys`` (the second half's minutes); it trends upward when the fitted rise over them
    exceeds both ``floor`` and ``share`` of their mean."""
    s = slope(ys)
    rise = s * max(len(ys) - 1, 0)
    mean = float(np.mean(ys)) if ys else 0.0
    return {
        "slope_per_min": s,
        "rise": rise,
        "mean": mean,
        "upward": bool(rise > max(floor, share * mean)),
    }


class Soak:
    """The measurement threads around the producer: visibility watcher, gateway reader, samplers."""

    def __init__(self, table: superfile.Supertable, log: EventLog, args: argparse.Namespace) -> None:
        self.table, self.log, self.args = table, log, args
        self.topic = log.topic(table.name)
        self.pending: collections.deque[tuple[float, int, int]] = collections.deque()  # (called, offset, minute)
        self.lock = threading.Lock()
        self.latency: dict[int, list[float]] = collections.defaultdict(list)
        self.queries: dict[int, list[float]] = collections.defaultdict(list)
        self.query_errors: dict[int, int] = collections.defaultdict(int)
        self.rss: dict[int, list[dict[str, dict[str, float]]]] = collections.defaultdict(list)
        self.sampled_at: dict[int, list[float]] = collections.defaultdict(list)  # each RSS sample's time
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self.bytes_published = 0  # Arrow bytes of the rows sent: what the broker's in-memory log holds

    def minute(self) -> int:
        return int((time.perf_counter() - self.t0) // 60)

    def watch(self) -> None:
        """Mark events visible as the manifest's recorded offset passes them (events are in offset order)."""
        while not self.stop.is_set():
            applied = int(self.table.properties.get("log_offsets", {}).get(self.topic, 0))
            now = time.perf_counter()
            with self.lock:
                while self.pending and self.pending[0][1] < applied:
                    called, _, minute = self.pending.popleft()
                    self.latency[minute].append(now - called)
            time.sleep(self.args.poll_ms / 1000)

    def read(self, gateway: str, key: str, probe: pa.Table) -> None:
        """A BM25 search, a vector search or a count through the gateway every 2 s."""
        remote = superfile.connect(gateway, api_key=key).open_table(self.table.name)
        words = [str(t)[:60] for t in probe["text"].to_pylist()]
        vectors = [np.asarray(v, np.float32) for v in probe["embedding"].to_pylist()]
        i = 0
        while not self.stop.wait(2.0):
            minute, started = self.minute(), time.perf_counter()
            try:
                if i % 3 == 0:
                    remote.bm25_search("text", words[i % len(words)], k=10)
                elif i % 3 == 1:
                    remote.vector_search("embedding", vectors[i % len(vectors)], k=10)
                else:
                    remote.count_rows()
                with self.lock:
                    self.queries[minute].append(time.perf_counter() - started)
            except Exception:  # counted and reported: the soak goes on
                with self.lock:
                    self.query_errors[minute] += 1
            i += 1

    def sample(self, roots: dict[str, int]) -> None:
        while not self.stop.wait(_SAMPLE_S):
            now, sample = time.perf_counter(), sample_rss(roots)
            self.rss[self.minute()].append(sample)
            self.sampled_at[self.minute()].append(now)

    def produce(self, rows: Rows) -> int:
        """One event of rate/10 rows every 100 ms for the run's minutes; returns the rows published."""
        per_event = max(1, self.args.rate // 10)
        events = int(self.args.minutes * 600)
        published = 0
        for i in range(events):
            due = self.t0 + i * 0.1
            time.sleep(max(0.0, due - time.perf_counter()))
            batch = rows.batch(per_event)
            called = time.perf_counter()
            pos = self.log.publish(Event("append", self.table.name, "soak", (i,), batch))
            published += batch.num_rows
            self.bytes_published += batch.nbytes
            with self.lock:
                self.pending.append((called, pos.offset, int((called - self.t0) // 60)))
        return published

    def drain(self, timeout: float) -> int:
        """Wait (bounded) until every published event is visible; returns how many are still not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self.pending:
                    return 0
            time.sleep(0.1)
        with self.lock:
            return len(self.pending)


def _wait_visible(table: superfile.Supertable, position: Position, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not position.visible_in(table.properties):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{position.token} not visible after {timeout} s")
        time.sleep(0.05)


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(url, timeout=1).status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def snapshot_facts(table: superfile.Supertable) -> dict[str, Any]:
    """What the current version holds: version, retained versions, superfiles, rows, bytes of superfiles."""
    snap = table.snapshot()
    entries = list(snap.entries())
    return {
        "version": snap.version,
        "retained_versions": len(table.versions()),
        "superfiles": len(entries),
        "rows": sum(e.live_rows for e in entries),
        "live_superfile_bytes": sum(e.size for e in entries),
    }


def per_minute(soak: Soak, minutes: list[dict[str, Any]]) -> None:
    """Fold the latencies (by the minute of their publish), queries and RSS samples into the minute records."""
    for rec in minutes:
        m = rec["minute"]
        lat = soak.latency.get(m, [])
        rec["events_visible"] = len(lat)
        rec["p50_s"] = percentile(lat, 50) if lat else None
        rec["p95_s"] = percentile(lat, 95) if lat else None
        rec["max_s"] = max(lat) if lat else None
        q = soak.queries.get(m, [])
        rec["gateway_queries"] = len(q)
        rec["gateway_query_p95_s"] = percentile(q, 95) if q else None
        rec["gateway_query_errors"] = soak.query_errors.get(m, 0)
        samples = soak.rss.get(m, [])
        names = sorted({n for s in samples for n in s})
        rec["rss_mb"] = {
            n: {
                k: float(np.median([s[n][k] for s in samples if n in s])) for k in ("rss", "anon", "file")
            }  # the minute's median sample: a compaction's peak is in max_rss_mb
            | {"max_rss": max(s[n]["rss"] for s in samples if n in s)}
            # the least: a process whose memory swings with its work (the compaction process between runs)
            | {"min_anon": min(s[n]["anon"] for s in samples if n in s)}
            for n in names
        }
        # cores each process used over the minute's samples (a process that restarted in it is left out)
        times = soak.sampled_at.get(m, [])
        rec["cpu_cores"] = {
            n: (samples[-1][n]["cpu"] - samples[0][n]["cpu"]) / (times[-1] - times[0])
            for n in names
            if len(times) > 1 and n in samples[0] and n in samples[-1] and samples[-1][n]["cpu"] >= samples[0][n]["cpu"]
        }


def verdicts(minutes: list[dict[str, Any]], soak: Soak) -> dict[str, Any]:
    n = len(minutes)
    k = 3 if n >= 9 else 1
    first = [x for m in range(k) for x in soak.latency.get(m, [])]
    last = [x for m in range(n - k, n) for x in soak.latency.get(m, [])]
    p95_first = percentile(first, 95) if first else float("inf")
    p95_last = percentile(last, 95) if last else float("inf")
    out: dict[str, Any] = {
        "p95": {
            "minutes_compared": k,
            "first_s": p95_first,
            "last_s": p95_last,
            "under_2s": bool(p95_first < 2.0 and p95_last < 2.0),
        }
    }
    half = minutes[n // 2 :]
    names = sorted({name for rec in half for name in rec["rss_mb"]})
    rss: dict[str, Any] = {}
    for name in names:
        series = [rec["rss_mb"][name]["rss"] for rec in half if name in rec["rss_mb"]]
        anon = [rec["rss_mb"][name]["anon"] for rec in half if name in rec["rss_mb"]]
        least = [rec["rss_mb"][name]["min_anon"] for rec in half if name in rec["rss_mb"]]
        rss[name] = trend(series, floor=10.0, share=0.05) | {
            "anon": trend(anon, floor=10.0, share=0.05),
            "anon_min": trend(least, floor=10.0, share=0.05),  # the minute's least sample: between runs
            "minutes": len(series),
        }
    published = [rec["mb_published_total"] for rec in half]
    out["mb_published_per_min_second_half"] = slope(published)
    out["rss_mb_second_half"] = rss
    other = [rec["storage"]["bytes"] - rec["live_superfile_bytes"] for rec in half]
    out["storage_not_in_current_version_mb"] = trend([x / _MB for x in other], floor=64.0, share=0.10) | {
        "max": max(other) / _MB,
    }
    # the gateway's full-text extractions of superfiles the current version does not name: those of the
    # previous version and those released within the grace period; without their removal, every superfile
    # the table ever had
    beyond = [
        float(rec["local_cache"]["gateway"]["extractions"] - rec["superfiles"]) for rec in half if "local_cache" in rec
    ]
    if beyond:
        out["gateway_extractions_not_in_current_version"] = trend(beyond, floor=10.0, share=0.10) | {"max": max(beyond)}
    out["retained_versions_second_half"] = trend(
        [float(rec["retained_versions"]) for rec in half], floor=10.0, share=0.10
    ) | {"max": max(rec["retained_versions"] for rec in half)}
    return out


def markdown(result: dict[str, Any]) -> str:
    minutes = result["minutes"]
    names = sorted({n for rec in minutes for n in rec["rss_mb"]})
    head = ["min", "p50 s", "p95 s", "rows/s", "commits (mean s)", "compaction waits", "load"]
    head += ["versions (retained)", "superfiles", "storage MB (current)"]
    head += [f"{n} MB (anon)" for n in names]
    head += ["deleted files mapped MB", "CPU cores"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    prev: dict[str, float] = {}
    for rec in minutes:
        b = rec["builder"]
        d = {k: b.get(k, 0.0) - prev.get(k, 0.0) for k in _SCRAPED}
        prev = b
        commits = d["commit_seconds_count"]
        row = [
            str(rec["minute"]),
            f(rec["p50_s"]),
            f(rec["p95_s"]),
            f(rec["rows_published"] / 60, ".0f"),
            f"{commits:.0f} ({d['commit_seconds_sum'] / max(commits, 1):.2f})",
            f"{d['compaction_wait_seconds_count']:.0f} ({d['compaction_wait_seconds_sum']:.0f} s)",
            f(rec["load_average"], ".1f"),
            f"{rec['version']} ({rec['retained_versions']})",
            str(rec["superfiles"]),
            f"{rec['storage']['bytes'] / _MB:.0f} ({rec['live_superfile_bytes'] / _MB:.0f})",
        ]
        row += [
            f"{f(rec['rss_mb'].get(n, {}).get('rss'), '.0f')} ({f(rec['rss_mb'].get(n, {}).get('anon'), '.0f')})"
            for n in names
        ]
        mapped = rec.get("deleted_files_mapped_mb", {})
        row.append(", ".join(f"{n.split()[0]} {mb:.0f}" for n, mb in mapped.items() if mb >= 1) or "0")
        cores = rec.get("cpu_cores", {})
        row.append(", ".join(f"{n} {c:.2f}" for n, c in sorted(cores.items(), key=lambda x: -x[1]) if c >= 0.05) or "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def svg(result: dict[str, Any], path: Path) -> None:
    """Four panels by minute, drawn by hand (no plotting package in the environment): publish-to-visible
    p50/p95, RSS per process, storage (all bytes and the current version's), versions and superfiles."""
    minutes = result["minutes"]
    xs = [rec["minute"] + 1 for rec in minutes]  # a minute's record is taken at its end
    names = sorted({n for rec in minutes for n in rec["rss_mb"]})
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]

    def get(fn: Any) -> list[float | None]:
        return [fn(rec) for rec in minutes]

    panels: list[tuple[str, list[tuple[str, list[float | None]]], float | None]] = [
        ("publish-to-visible (s)", [("p95", get(lambda r: r["p95_s"])), ("p50", get(lambda r: r["p50_s"]))], 2.0),
        (
            "RSS (MB), median sample of each minute",
            [(n, get(lambda r, n=n: r["rss_mb"].get(n, {}).get("rss"))) for n in names],
            None,
        ),
        (
            "storage (MB)",
            [
                ("bucket", get(lambda r: r["storage"]["bytes"] / _MB)),
                ("current version's superfiles", get(lambda r: r["live_superfile_bytes"] / _MB)),
                (
                    "the rest (awaiting cleanup)",
                    get(lambda r: (r["storage"]["bytes"] - r["live_superfile_bytes"]) / _MB),
                ),
            ],
            None,
        ),
        (
            "versions and superfiles",
            [
                ("retained versions", get(lambda r: r["retained_versions"])),
                ("superfiles", get(lambda r: r["superfiles"])),
            ],
            None,
        ),
    ]
    w, h, left, top, gap = 760, 230, 60, 30, 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + 280}" height="{len(panels) * (h + gap) + 40}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="18" font-size="14">{result["title"]}</text>',
    ]
    xmax = max(xs) if xs else 1
    for p, (title, series, limit) in enumerate(panels):
        y0 = top + p * (h + gap)
        vals = [v for _, ys in series for v in ys if v is not None] + ([limit] if limit else [])
        ymax = max(vals) * 1.1 if vals and max(vals) > 0 else 1.0
        out.append(f'<text x="{left}" y="{y0 + 12}" font-size="12">{title}</text>')
        base = y0 + h
        out.append(f'<line x1="{left}" y1="{base}" x2="{left + w}" y2="{base}" stroke="black"/>')
        out.append(f'<line x1="{left}" y1="{y0 + 20}" x2="{left}" y2="{base}" stroke="black"/>')

        def px(x: float) -> float:
            return left + w * x / xmax

        def py(y: float, base: float = base, ymax: float = ymax) -> float:
            return base - (h - 20) * y / ymax

        for t in range(5):
            yv = ymax * t / 4
            label = f"{yv:,.0f}" if ymax >= 20 else f"{yv:.2g}"
            out.append(f'<text x="{left - 5}" y="{py(yv) + 4:.1f}" text-anchor="end">{label}</text>')
        for x in range(0, xmax + 1, max(1, xmax // 10)):
            out.append(f'<text x="{px(x):.1f}" y="{base + 14}" text-anchor="middle">{x}</text>')
        if limit:
            out.append(
                f'<line x1="{left}" y1="{py(limit):.1f}" x2="{left + w}" y2="{py(limit):.1f}" '
                'stroke="grey" stroke-dasharray="4 3"/>'
            )
        for i, (label, ys) in enumerate(series):
            color = colors[i % len(colors)]
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True) if y is not None)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
            out.append(f'<text x="{left + w + 10}" y="{y0 + 30 + 14 * i}" fill="{color}">{label}</text>')
    out.append(f'<text x="{left + w / 2}" y="{len(panels) * (h + gap) + 30}" text-anchor="middle">minute</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def _checkout() -> tuple[str, list[str]]:
    """HEAD and the modified tracked files of the checkout the run imports."""

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False).stdout

    return git("rev-parse", "--short", "HEAD").strip(), git("diff", "--name-only", "HEAD").split()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--rate", type=int, default=2000, help="rows per second (one event every 100 ms)")
    p.add_argument("--retention-s", type=float, default=180.0, help="the builder's cleanup retention")
    p.add_argument("--cleanup-interval-s", type=float, default=60.0, help="how often the builder cleans up")
    p.add_argument(
        "--cache-budget-bytes",
        type=int,
        default=12 << 30,
        help="builder's and gateway's disk cache (holds 30 minutes of the table)",
    )
    p.add_argument(
        "--consistency",
        choices=("strong", "bounded"),
        default="strong",
        help="the table's consistency: bounded lets the gateway serve each version once warm (docs/gateway.md)",
    )
    p.add_argument("--poll-ms", type=int, default=20)
    p.add_argument("--name", default="soak")
    p.add_argument("--plot", default=str(ROOT / "docs" / "soak.svg"))
    args = p.parse_args()
    if args.minutes <= 0 or args.rate < 10:
        p.error("--minutes must be positive and --rate at least 10")

    # what runs is the checkout as it is now (the servers import it at start), commits and uncommitted files
    commit, dirty = _checkout()
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    # moto keeps objects under this size in memory, others in temporary files: with 256 KB its RSS is the
    # server's own, not the bucket's contents (which the storage columns count), as for S3 itself
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(256 << 10))
    rows = Rows()
    probe = rows.batch(20)
    rows.made = 0  # the probe's rows are not published
    with (
        start_moto(log_path=str(workdir / "s3.log")) as s3,
        start_tansu(log_path=str(workdir / "kafka.log")) as kafka,
        start_redis(log_path=str(workdir / "redis.log")) as redis,
    ):
        os.environ.update({**_AWS, "AWS_ENDPOINT_URL": s3.url})
        client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
        client.create_bucket(Bucket="soak")
        uri = f"s3://soak/tables?endpoint_url={s3.url}"
        warm = pa.table(
            {"doc_id": pa.array([-1], pa.int64()), "text": probe["text"][:1], "embedding": probe["embedding"][:1]}
        )
        table = superfile.connect(uri).create_table(
            "soak",
            warm.schema,
            fts_columns=["text"],
            vector_columns={"embedding": {"dim": 384}},
            consistency=args.consistency,
        )
        # the soak's own looks (publish-to-visible, the minute's figures, the final count) see every commit at
        # once whatever the table's policy: they measure the commit, not a reader's allowed staleness
        table = superfile.connect(uri).open_table("soak", consistency="strong")
        metrics_port = free_port()
        builder_args = ["--tables", "soak", "--metrics-port", str(metrics_port), "--compact-small-files", "16"]
        builder_args += ["--cleanup-interval-s", str(args.cleanup_interval_s), "--retention-s", str(args.retention_s)]
        builder_args += ["--cleanup-min-age-s", str(min(args.retention_s, 3600.0))]
        builder_args += [
            "--cache-dir",
            str(workdir / "builder-cache"),
            "--cache-budget-bytes",
            str(args.cache_budget_bytes),
        ]
        argv = [sys.executable, "-m", "superfile_builder", "--storage", uri, "--kafka", kafka.url, "--redis", redis.url]
        with open(workdir / "builder.log", "wb") as out:
            builder = subprocess.Popen(
                [*argv, *builder_args], stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        key = secrets.token_urlsafe(12)
        gateway_port = free_port()
        gateway_env = {
            **os.environ,
            "SUPERFILE_STORAGE": uri,
            "SUPERFILE_KAFKA": kafka.url,
            "SUPERFILE_API_KEYS": f"{key}:*:rw",
            "SUPERFILE_PORT": str(gateway_port),
            "SUPERFILE_CACHE_DIR": str(workdir / "gateway-cache"),
            "SUPERFILE_CACHE_BUDGET_BYTES": str(args.cache_budget_bytes),
        }
        with open(workdir / "gateway.log", "wb") as out:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "superfile_gateway"], stdout=out, stderr=subprocess.STDOUT, env=gateway_env
            )
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        log = EventLog(kafka.url)
        try:
            _wait_http(f"{gateway_url}/readyz", gateway, 60)
            _wait_visible(table, log.publish(Event("append", "soak", "soak-warmup", (0,), warm)), 120)
            roots = {
                "builder": builder.pid,
                "gateway": gateway.pid,
                "broker (tansu)": kafka.proc.pid,
                "redis": redis.proc.pid,
                "s3 (moto)": s3.proc.pid,
                "soak (producer, watcher, gateway client)": os.getpid(),
            }
            soak = Soak(table, log, args)
            threads = [
                threading.Thread(target=soak.watch, daemon=True),
                threading.Thread(target=soak.read, args=(gateway_url, key, probe), daemon=True),
                threading.Thread(target=soak.sample, args=(roots,), daemon=True),
            ]
            minutes: list[dict[str, Any]] = []
            published = {"rows": 0}

            def every_minute() -> None:  # the per-minute facts, taken at each minute's end
                total = int(args.minutes + 0.999)
                for m in range(total):
                    if soak.stop.wait(max(0.0, soak.t0 + (m + 1) * 60 - time.perf_counter())):
                        return
                    rec: dict[str, Any] = {"minute": m, "t_s": time.perf_counter() - soak.t0}
                    rec["rows_published_total"] = rows.made
                    rec["rows_published"] = rows.made - published["rows"]
                    published["rows"] = rows.made
                    rec["mb_published_total"] = soak.bytes_published / _MB
                    rec |= snapshot_facts(table)
                    rec["storage"] = storage_bytes(client, "soak")
                    rec["builder"] = scrape(metrics_port)
                    rec["load_average"] = os.getloadavg()[0]
                    rec["builder_alive"] = builder.poll() is None
                    rec["deleted_files_mapped_mb"] = {n: deleted_mapped_mb(pid) for n, pid in roots.items()}
                    rec["local_cache"] = {n: cache_usage(workdir / f"{n}-cache") for n in ("gateway", "builder")}
                    minutes.append(rec)
                    print(
                        f"minute {m}: v{rec['version']} ({rec['retained_versions']} retained), "
                        f"{rec['superfiles']} superfiles, {rec['storage']['bytes'] / _MB:.0f} MB in the bucket "
                        f"({rec['live_superfile_bytes'] / _MB:.0f} MB current), builder {rec['builder']}",
                        flush=True,
                    )

            clock = threading.Thread(target=every_minute, daemon=True)
            for t in threads:
                t.start()
            soak.t0 = time.perf_counter()
            clock.start()
            total_rows = soak.produce(rows)
            not_visible = soak.drain(300)
            clock.join(timeout=120)
            soak.stop.set()
            for t in threads:
                t.join(timeout=30)
            ids = table.to_arrow(columns=["doc_id"])["doc_id"]
            correctness = {
                "rows_published": total_rows,
                "events_not_visible_after_300s": not_visible,
                "rows_in_table": len(ids) - 1,  # less the warm-up row
                "distinct_doc_ids": pc.count_distinct(ids).as_py() - 1,
                "doc_id_min_max": [pc.min(ids).as_py(), pc.max(ids).as_py()],
            }
            correctness["exactly_once"] = (
                correctness["rows_in_table"] == total_rows
                and correctness["distinct_doc_ids"] == total_rows
                and correctness["doc_id_min_max"] == [-1, total_rows - 1]
            )
            per_minute(soak, minutes)
            result: dict[str, Any] = {
                "title": f"Soak: {args.minutes:g} minutes at {args.rate:,} rows/s through the service suite",
                "config": {
                    "command": "bench/soak.py " + " ".join(sys.argv[1:]),
                    "rate_rows_per_s": args.rate,
                    "rows_per_event": max(1, args.rate // 10),
                    "builder_args": " ".join(builder_args[4:]),
                    "retention_s": args.retention_s,
                    "cleanup_interval_s": args.cleanup_interval_s,
                    "storage": "moto S3 server on 127.0.0.1",
                    "broker": "tansu (memory storage: it keeps the whole log in memory) on 127.0.0.1",
                    "moto_key_buffer_bytes": int(os.environ["MOTO_S3_DEFAULT_KEY_BUFFER_SIZE"]),
                    "cache_budget_bytes": args.cache_budget_bytes,
                    "consistency": args.consistency,
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
                    "commit": commit,
                    "uncommitted_at_start": dirty,
                },
                "correctness": correctness,
                "minutes": minutes,
            }
            result["verdicts"] = verdicts(minutes, soak)
        finally:
            log.close()
            _stop(gateway)
            _stop(builder)
    result["markdown"] = markdown(result)
    print(json.dumps({"correctness": result["correctness"], "verdicts": result["verdicts"]}, indent=2))
    print(result["markdown"])
    print(save(args.name, result))
    (ROOT / "bench" / "results" / f"{args.name}.md").write_text(result["markdown"])
    svg(result, Path(args.plot))
    print(args.plot, "logs in", workdir)


if __name__ == "__main__":
    main()
