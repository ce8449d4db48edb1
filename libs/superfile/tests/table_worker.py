"""Writer processes for the concurrency and crash tests (run as ``python table_worker.py MODE ...``).

Each appended batch is ``rows`` rows tagged with (worker, seq) so the parent
can check that every acknowledged batch is present exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pyarrow as pa
import superfile


def batch(worker: int, seq: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "worker": pa.array([worker] * rows, pa.int32()),
            "seq": pa.array([seq] * rows, pa.int32()),
            "text": [f"worker {worker} batch {seq} row {i}" for i in range(rows)],
        }
    )


def append_until_killed(mode: str, uri: str, table: str, worker: int, rows: int, delay: float) -> set[int]:
    """Run a worker appending ``rows``-row batches to ``table``, SIGKILL it ``delay`` seconds after its
    first acknowledged commit; the sequence numbers it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, __file__, mode, uri, table, str(worker), "1000", str(rows)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # committing now
    assert first.startswith("ack"), first
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    return {int(line.split()[2]) for line in [first, *rest.splitlines()] if line.startswith("ack")}


def main() -> None:
    mode, uri, table_name, worker, count, rows = sys.argv[1:7]
    if mode == "append-short-history":  # every other commit writes a history segment or checkpoint
        from superfile.manifest import log

        log.TAIL, log.CHECKPOINT_EVERY = 2, 2
        mode = "append"
    table = superfile.connect(uri).open_table(table_name)
    for seq in range(int(count)):
        version = table.append(batch(int(worker), seq, int(rows)))
        # acknowledgement: printed only after append returned
        print(f"ack {worker} {seq} {version}", flush=True)
    if mode != "append":
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
