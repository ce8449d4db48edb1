"""Processes for the maintenance race tests: ``python maintenance_worker.py MODE URI TABLE ARGS...``.

Every line a process prints is printed only after the call it reports
returned, so the parent's model holds exactly the acknowledged writes.

- ``write WORKER COUNT ROWS``: appends ``COUNT`` batches of ``ROWS`` rows
  tagged (worker, seq); after every third append it deletes the batch it
  appended two appends earlier. Prints ``ack W S V`` / ``del W S V``.
- ``keyed COUNT ROWS``: appends batch ``seq`` under idempotency key
  ``key-<seq>`` (the same rows in every process). Prints ``ack S V``.
- ``read STOPFILE``: until ``STOPFILE`` exists, opens the current version (or
  a recent one), reads it whole and checks it. Prints ``ok V SECONDS`` or
  ``error V SECONDS TYPE MESSAGE``; the parent decides which reads the
  retention window promised to keep working.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import superfile

SCHEMA = pa.schema(
    [
        ("worker", pa.int32()),
        ("seq", pa.int32()),
        ("i", pa.int32()),
        ("text", pa.string()),
        ("emb", pa.list_(pa.float32(), 8)),
    ]
)
WORDS = ["wing", "flow", "shock", "heat", "boundary", "layer", "mach", "plate"]


def batch(worker: int, seq: int, rows: int) -> pa.Table:
    """Deterministic rows of one batch: the same (worker, seq) always gives the same rows."""
    rng = np.random.default_rng(worker * 100_003 + seq)
    vectors = rng.normal(size=(rows, 8)).astype(np.float32)
    return pa.table(
        {
            "worker": pa.array([worker] * rows, pa.int32()),
            "seq": pa.array([seq] * rows, pa.int32()),
            "i": pa.array(range(rows), pa.int32()),
            "text": [" ".join(rng.choice(WORDS, 4)) + f" w{worker}s{seq}" for _ in range(rows)],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
        },
        schema=SCHEMA,
    )


def write(table: superfile.Supertable, worker: int, count: int, rows: int) -> None:
    for seq in range(count):
        print(f"ack {worker} {seq} {table.append(batch(worker, seq, rows))}", flush=True)
        if seq % 3 == 2:
            gone = seq - 2
            print(f"del {worker} {gone} {table.delete(f'worker = {worker} AND seq = {gone}')}", flush=True)


def keyed(table: superfile.Supertable, count: int, rows: int) -> None:
    for seq in range(count):
        version = table.append(batch(0, seq, rows), idempotency_key=f"key-{seq}")
        print(f"ack {seq} {version}", flush=True)


def check(rows: pa.Table, expected: int) -> None:
    """A version read whole: its row count, unique ``_id``s, and no batch split by a partial commit."""
    if rows.num_rows != expected:
        raise AssertionError(f"read {rows.num_rows} rows, the manifest says {expected}")
    if len(pc.unique(rows["_id"])) != rows.num_rows:
        raise AssertionError("duplicate _id")
    sizes = rows.group_by(["worker", "seq"]).aggregate([("i", "count")])["i_count"].to_pylist()
    if len(set(sizes)) > 1:
        raise AssertionError(f"a batch is partly visible: batch sizes {sorted(set(sizes))}")


def read(db: superfile.Connection, name: str, stopfile: str) -> None:
    table = db.open_table(name)
    rng = random.Random(os.getpid())
    while not os.path.exists(stopfile):
        start = time.time()
        version = -1
        try:
            history = table.versions()
            recent = [h for h in history if h["timestamp_ms"] >= (start - 1.0) * 1000]
            pick = rng.choice(recent) if recent and rng.random() < 0.5 else history[-1]
            version = pick["version"]
            old = db.open_table(name, version=version)
            check(old.to_arrow(), pick["row_count"])
            old.bm25_search("text", "shock wave", k=5)
            old.vector_search("emb", np.ones(8, np.float32), k=5)
            print(f"ok {version} {start:.3f} {pick['timestamp_ms'] / 1000:.3f} {time.time():.3f}", flush=True)
        except Exception as e:
            message = str(e).replace("\n", " ")[:300]
            print(f"error {version} {start:.3f} 0 {time.time():.3f} {type(e).__name__} {message}", flush=True)


def main() -> None:
    mode, uri, name, *args = sys.argv[1:]
    db = superfile.connect(uri)
    if mode == "write":
        write(db.open_table(name), int(args[0]), int(args[1]), int(args[2]))
    elif mode == "keyed":
        keyed(db.open_table(name), int(args[0]), int(args[1]))
    elif mode == "read":
        read(db, name, args[0])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
