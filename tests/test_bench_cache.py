"""bench/search_bench.py's build cache (issue 20 item 5): builds are keyed by their inputs, and recall is
checked against the table actually measured.

A run once reported recall 0.005 for superfile and LanceDB: their tables came from an earlier `--kinds bm25`
run and the ground truth from a later `--kinds vector` run over other rows. Here the same sequence runs for
real on a small cache (4,000 rows in 4 superfiles): the second run must reuse the first run's table, build only
what it lacks, and measure the right recall; a ground truth that does not match the measured table must fail
the measurement instead of reporting a recall; other inputs must rebuild the cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "search_bench.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "vaswani").exists(), reason="needs the query sets"),
]


def bench(tmp_path: Path, *args: str, rows: int = 4000) -> tuple[str, dict[str, Any]]:
    """One run of the benchmark on the test's cache and results directory: its stdout and results."""
    small = ["--rows", str(rows), "--max-rows-per-superfile", "1000", "--passes", "1", "--threads", "1"]
    here = ["--cache", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results")]
    out = subprocess.run(
        [sys.executable, str(BENCH), *small, *here, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return out.stdout, json.loads((tmp_path / "results" / "search.json").read_text())


def builds(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "cache" / "builds.json").read_text()))


def test_cache_reuse_and_invalidation(tmp_path: Path) -> None:
    out, _ = bench(tmp_path, "--kinds", "bm25", "--systems", "superfile,tantivy")
    assert "building superfile" in out and "building gt" not in out
    table_build = builds(tmp_path)["superfile"]

    # a later vector run on the same cache: reuses the table, builds the ground truth and usearch
    out, res = bench(tmp_path, "--kinds", "vector", "--systems", "superfile,usearch")
    assert "building superfile" not in out and "building gt" in out and "building usearch" in out
    assert builds(tmp_path)["superfile"] == table_build
    for system in ("superfile", "usearch"):
        best = max(s["recall"] for s in res["vector"][system]["settings"])
        assert best >= 0.95, (system, res["vector"][system]["settings"])

    # a table written by other superfile code: that table alone is built again
    recorded = builds(tmp_path)
    recorded["superfile"]["format"] = "an older writer"
    (tmp_path / "cache" / "builds.json").write_text(json.dumps(recorded))
    out, _ = bench(tmp_path, "--kinds", "bm25", "--systems", "superfile,tantivy")
    assert "building superfile" in out and "building tantivy" not in out and "building gt" not in out
    assert builds(tmp_path)["superfile"]["format"] != "an older writer"

    # a ground truth over other rows: the measurement fails and reports no recall
    gt_path = tmp_path / "cache" / "ground_truth.npz"
    gt = dict(np.load(gt_path))
    np.savez(gt_path, ids=gt["ids"], sim=gt["sim"] - 0.01)
    out, res = bench(tmp_path, "--kinds", "vector", "--systems", "superfile")
    assert "was not computed over the measured table" in out
    assert "superfile" not in res["vector"]

    # other inputs (here the row count): everything is built again, the tampered ground truth included
    out, res = bench(tmp_path, "--kinds", "vector", "--systems", "superfile", rows=3000)
    assert "building superfile" in out and "building gt" in out
    assert builds(tmp_path)["config"]["rows"] == 3000 and "usearch" not in builds(tmp_path)
    assert max(s["recall"] for s in res["vector"]["superfile"]["settings"]) >= 0.95
