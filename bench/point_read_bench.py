"""Point reads: rows selected by an index fetched by pages, by whole row groups, and by a scan; same run.

    .venv/bin/python bench/point_read_bench.py --rows 1000000 --repeat 9

The rows of ``bench/where_index_bench.py`` (``doc_id``, ``label`` = ``c{i % 1000}`` spread over every row
group, ``batch`` = 1,000 consecutive rows per value, ``title`` ~70-byte unique strings) in superfiles of
62,500 rows, written four times:

- ``indexed``: the default bitmap indexes, written with the page index and page table (the default);
- ``plain``: every scalar index off, same writer: what a fetch costs without the index (a scan and filter);
- ``indexed_old`` / ``plain_old``: the same, written as before point reads (``page_index=False``: pyarrow's
  default pages, no page table), for today's reads and today's scans.

Each round times every variant once, interleaved; reported times are medians over ``--repeat`` rounds
after a warm-up. Variants of a fetch:

- ``pages``: ``indexed``, the reader decoding only the pages holding the rows;
- ``row_groups``: the same files with ``SUPERFILE_PAGE_READS=0`` (whole row groups, as before);
- ``today``: ``indexed_old`` (no page table: whole row groups of pyarrow's default pages);
- ``scan`` / ``scan_old``: ``plain`` / ``plain_old``.

Cases: ``label = 'c17'`` (0.1% of rows, ~8 in every row group), through the API and SQL; ``batch = 'b517'``
(1,000 consecutive rows); ``doc_id IN (<10 random ids>)`` (a top-k's fetch).

Bytes: for each superfile, the byte ranges the reader asks for (``ensure``) to fetch the matching rows,
by pages and by row groups, and a full read of the same columns. With ``--s3``, the same reads run over a
local S3 server (moto), each range one ranged GET into a sparse copy, and are timed.
``--page-bytes``, ``--dictionary-bytes`` and ``--compression`` change the writer of the new-format tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
import superfile.commit.build as build
from common import median, save
from superfile.format import SuperfileReader
from superfile.format.reader import PAGE_READS_ENV
from superfile.table.snapshot import offsets_of
from where_index_bench import rows

COLUMNS = ["doc_id", "title"]
SCATTERED = "label = 'c17'"
CLUSTERED = "batch = 'b517'"


@contextmanager
def writer(**changes: Any) -> Iterator[None]:
    """Tables created inside are written with ``changes`` to the superfile spec."""
    original = build.superfile_spec

    def changed(options: Any) -> Any:
        return replace(original(options), **changes)

    build.superfile_spec = changed
    try:
        yield
    finally:
        build.superfile_spec = original


@contextmanager
def page_reads(enabled: bool) -> Iterator[None]:
    before = os.environ.get(PAGE_READS_ENV)
    os.environ[PAGE_READS_ENV] = "1" if enabled else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PAGE_READS_ENV, None)
        else:
            os.environ[PAGE_READS_ENV] = before


def interleaved(variants: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median ms of each variant over ``repeat`` rounds, each round running every variant once."""
    for fn in variants.values():
        fn()
    runs: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append((time.perf_counter() - t0) * 1000)
    return {k: round(median(v), 3) for k, v in runs.items()}


def fetch_variants(db: Any, tables: dict[str, Any], where: str, sql: bool) -> dict[str, Callable[[], Any]]:
    def run(name: str, pages: bool) -> Callable[[], Any]:
        def go() -> Any:
            with page_reads(pages):
                if sql:
                    return db.sql(f"SELECT doc_id, title FROM {name} WHERE {where}")
                return tables[name].to_arrow(columns=COLUMNS, where=where)

        return go

    return {
        "pages": run("indexed", True),
        "row_groups": run("indexed", False),
        "today": run("indexed_old", True),
        "scan": run("plain", True),
        "scan_old": run("plain_old", True),
    }


def superfile_paths(table: Any) -> list[str]:
    snap = table.snapshot()
    return [snap.files.storage.local_path(e.path) for e in sorted(snap.entries(), key=lambda e: e.id_min)]


def reader_bytes(paths: list[str], where: str) -> dict[str, Any]:
    """Bytes the reader asks for to fetch the rows matching ``where`` (by pages, by row groups) and to read
    the columns whole, summed over the superfiles; and the share of pages the fetch decodes."""
    label, value = (s.strip().strip("'") for s in where.split("="))
    out = {"pages": 0, "row_groups": 0, "whole_columns": 0, "rows": 0}
    for path in paths:
        for mode in ("pages", "row_groups", "whole_columns"):
            asked: list[int] = []

            def record(_offset: int, length: int, a: list[int] = asked) -> None:
                a.append(length)

            r = SuperfileReader.open(path, name=path, verify=False, ensure=record)
            asked.clear()  # the footer, read on open
            if mode == "whole_columns":
                r.read(COLUMNS)
            else:
                idx = r.scalar_index(label)
                offsets = offsets_of(idx.lookup("=", value))
                asked.clear()  # the index itself
                with page_reads(mode == "pages"):
                    got = r.read(COLUMNS, rows=offsets)
                if mode == "pages":
                    out["rows"] += got.num_rows
            out[mode] += sum(asked)
    return out


def sizes(table: Any) -> dict[str, int]:
    snap = table.snapshot()
    total = footer = data = pages = 0
    for e in snap.entries():
        path = snap.files.storage.local_path(e.path)
        r = SuperfileReader.open(path, name=path, verify=False)
        total += os.path.getsize(path)
        data += r.sections["data"].length
        footer += r.sections["footer"].length
        pages += r.sections["pages"].length if "pages" in r.sections else 0
    return {"file_bytes": total, "parquet_data_bytes": data, "footer_bytes": footer, "page_table_bytes": pages}


def s3_reads(tables: dict[str, Any], where: str, repeat: int) -> dict[str, Any]:
    """The fetch of ``where`` through readers over sparse copies of the ``indexed`` superfiles on a local S3
    server, each range the reader asks for one ranged GET: by pages and by row groups; bytes and ms."""
    import boto3
    from superfile_suite.servers import start_moto

    label, value = (s.strip().strip("'") for s in where.split("="))
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"})
    paths = superfile_paths(tables["indexed"])
    with start_moto() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.url)
        s3.create_bucket(Bucket="points")
        for i, p in enumerate(paths):
            s3.upload_file(p, "points", f"f{i}")
        keys = [f"f{i}" for i in range(len(paths))]

        def fetch(pages: bool) -> tuple[float, int, int]:
            got = 0
            requests = 0
            t0 = time.perf_counter()
            for key in keys:
                size = s3.head_object(Bucket="points", Key=key)["ContentLength"]
                buf = bytearray(size)
                present: set[tuple[int, int]] = set()

                def ensure(offset: int, length: int, key: str = key, buf: bytearray = buf, have: Any = present) -> None:
                    nonlocal got, requests
                    if length <= 0 or (offset, length) in have:
                        return
                    end = min(offset + length, len(buf))
                    body = s3.get_object(Bucket="points", Key=key, Range=f"bytes={offset}-{end - 1}")["Body"].read()
                    buf[offset:end] = body
                    have.add((offset, length))
                    got += len(body)
                    requests += 1

                r = SuperfileReader.open(memoryview(buf), name=key, verify=False, ensure=ensure)
                offsets = offsets_of(r.scalar_index(label).lookup("=", value))
                with page_reads(pages):
                    r.read(COLUMNS, rows=offsets)
            return (time.perf_counter() - t0) * 1000, got, requests

        res: dict[str, Any] = {}
        for name, pages in (("pages", True), ("row_groups", False)):
            runs = [fetch(pages) for _ in range(repeat)]
            res[name] = {
                "ms": round(median([r[0] for r in runs]), 1),
                "bytes": runs[0][1],
                "requests": runs[0][2],
            }
        return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--page-bytes", type=int, default=None)
    p.add_argument("--dictionary-bytes", type=int, default=None)
    p.add_argument("--compression", default=None)
    p.add_argument("--s3", action="store_true", help="also read over a local S3 server (moto)")
    p.add_argument("--out", default="point_read")
    args = p.parse_args()
    data = rows(args.rows)
    db = superfile.connect(f"file://{tempfile.mkdtemp(prefix='sfpoint-')}")
    new: dict[str, Any] = {}
    if args.page_bytes:
        new["page_bytes"] = args.page_bytes
    if args.dictionary_bytes:
        new["dictionary_page_bytes"] = args.dictionary_bytes
    if args.compression:
        new["compression"] = args.compression
    tables: dict[str, Any] = {}
    off = {"doc_id": "none", "label": "none", "batch": "none", "title": "none"}
    build_ms: dict[str, float] = {}
    for name, changes, indexes in (
        ("indexed", new, {}),
        ("plain", new, off),
        ("indexed_old", {"page_index": False}, {}),
        ("plain_old", {"page_index": False}, off),
    ):
        with writer(**changes):
            t = db.create_table(name, data.schema, scalar_indexes=indexes, max_rows_per_superfile=62_500)
            t0 = time.perf_counter()
            t.append(data)
            build_ms[name] = round((time.perf_counter() - t0) * 1000, 1)
        tables[name] = t
    expect = tables["plain"].to_arrow(columns=COLUMNS, where=SCATTERED).sort_by("doc_id")
    for name in ("indexed", "indexed_old", "plain_old"):
        for pages in (True, False):
            with page_reads(pages):
                got = tables[name].to_arrow(columns=COLUMNS, where=SCATTERED).sort_by("doc_id")
            assert got.equals(expect), (name, pages)
    results: dict[str, Any] = {
        "rows": args.rows,
        "repeat": args.repeat,
        "writer": new or "defaults",
        "matches": expect.num_rows,
        "append_ms": build_ms,
    }
    ten = np.random.default_rng(7).choice(args.rows, 10, replace=False).tolist()
    cases = {
        "scattered fetch, API": (SCATTERED, False),
        "scattered fetch, SQL": (SCATTERED, True),
        "clustered fetch, API": (CLUSTERED, False),
        "10 rows by doc_id, API": (f"doc_id IN ({', '.join(map(str, ten))})", False),
    }
    for case, (where, sql) in cases.items():
        results[case] = interleaved(fetch_variants(db, tables, where, sql), args.repeat)
        print(case, json.dumps(results[case]), flush=True)
    scan_cols = ["doc_id", "title", "label"]

    def scan(name: str) -> Callable[[], Any]:
        return lambda: tables[name].to_arrow(columns=scan_cols)

    results["full scan (doc_id, title, label), API"] = interleaved(
        {name: scan(name) for name in ("plain", "plain_old")}, args.repeat
    )
    print("full scan", json.dumps(results["full scan (doc_id, title, label), API"]), flush=True)
    results["bytes, scattered fetch"] = {
        "indexed": reader_bytes(superfile_paths(tables["indexed"]), SCATTERED),
        "indexed_old": reader_bytes(superfile_paths(tables["indexed_old"]), SCATTERED),
    }
    print("bytes", json.dumps(results["bytes, scattered fetch"]), flush=True)
    results["sizes"] = {name: sizes(t) for name, t in tables.items()}
    print("sizes", json.dumps(results["sizes"]), flush=True)
    if args.s3:
        results["s3, scattered fetch"] = s3_reads(tables, SCATTERED, max(3, args.repeat // 3))
        print("s3", json.dumps(results["s3, scattered fetch"]), flush=True)
    for case in cases:
        r = results[case]
        r["pages_vs_scan"] = round(r["scan"] / r["pages"], 2)
        r["pages_vs_row_groups"] = round(r["row_groups"] / r["pages"], 2)
        r["today_vs_scan_old"] = round(r["scan_old"] / r["today"], 2)
    save(args.out, results)
    print(json.dumps({c: {k: v for k, v in results[c].items() if "_vs_" in k} for c in cases}))


if __name__ == "__main__":
    main()
