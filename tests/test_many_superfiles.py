"""Issue 18, item 5: a table of 10,000 superfiles opens, searches and compacts, its open superfiles bounded by a
budget of bytes and file handles (``superfile.table.snapshot.open_readers``), not a count.

One append of 20,000 rows with ``max_rows_per_superfile=2`` and ``level0_max_rows`` above it commits 10,000
level-0 superfiles (no full-text or vector index: searched exactly) in one version; ``optimize`` then compacts
them into one indexed superfile at the next version. Every answer of the 10,000-superfile version must equal
the compacted one's (and a brute-force one) under the default budgets, and so must those of a 600-superfile
table under budgets so small that readers are evicted while searches hold them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile._lru import BudgetLRU
from superfile.format import reader as reader_module
from superfile.table import Supertable
from superfile.table.snapshot import open_readers, set_open_budget

pytestmark = pytest.mark.slow

FILES = 10_000
FEW_FILES = 600  # the tiny-budget test's table: every search there opens each superfile several times
PER_FILE = 2
ROWS = FILES * PER_FILE
DIM = 8
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
QUERIES = ["alpha beta", "zeta mu kappa"]


def _data(rows: int) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(18)
    text = [" ".join(rng.choice(WORDS, int(rng.integers(1, 8)))) for _ in range(rows)]
    vec = rng.standard_normal((rows, DIM)).astype(np.float32)
    table = pa.table(
        {
            "n": pa.array(np.arange(rows), pa.int64()),
            "cat": pa.array([f"c{i % 7}" for i in range(rows)]),
            "text": text,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), DIM),
        }
    )
    return table, vec


def _make(root: Path, files: int) -> tuple[str, int, int, np.ndarray]:
    """A table of ``files`` level-0 superfiles (one append) compacted at the next version: its URI, the two
    versions and the vectors."""
    uri = f"file://{root}"
    rows = files * PER_FILE
    data, vec = _data(rows)
    t = superfile.connect(uri, fsync=False).create_table(
        "t",
        data.schema,
        fts_columns=["text"],
        vector_columns={"vec": {"dim": DIM, "metric": "l2"}},
        max_rows_per_superfile=PER_FILE,
        level0_max_rows=rows,
    )
    t.append(data)
    wide = t.version
    assert t.stats()["superfile_count"] == files
    t.optimize(target_rows=rows)
    assert t.stats()["superfile_count"] == 1
    return uri, wide, t.version, vec


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int, np.ndarray]:
    """The table of 10,000 superfiles."""
    return _make(tmp_path_factory.mktemp("many"), FILES)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps(root: str, but: str = "\0") -> int:
    """Mappings of a table's superfiles (files below ``root``) and of their full-text indexes (extracted to a
    directory named after the superfile's path), except those naming ``but``."""
    extracted = f"{os.path.basename(root)}_t_data_"  # the extracted directory's name ends with the superfile's
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if (root in line or extracted in line) and but not in line)


def _answers(uri: str, version: int, query: np.ndarray) -> dict[str, Any]:
    """What a fresh connection answers at ``version``: counts, BM25 and vector top-k (ids and scores), SQL."""
    db = superfile.connect(uri)
    t = db.open_table("t", version=version)
    out: dict[str, Any] = {"count": t.count_rows(), "where": t.count_rows("n % 5 = 0 AND cat = 'c3'")}
    for q in QUERIES:
        r = t.bm25_search("text", q, k=10)
        out[f"bm25 {q}"] = (r["_id"].to_pylist(), np.round(r["score"].to_numpy(), 4).tolist())
    r = t.vector_search("vec", query.tolist(), k=10, nprobe=10_000, rerank=1_000)
    out["vector"] = (r["_id"].to_pylist(), np.round(r["score"].to_numpy(), 4).tolist())
    # SQL reads the table's current version: pin it by a view of the same rows through a filter on _id
    sql = t.to_arrow(["n", "cat"], where="n >= 100 AND n < 20000 AND cat = 'c5'")
    out["filtered"] = sorted(sql["n"].to_pylist())
    return out


def _brute(vec: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    dist = ((vec - query) ** 2).sum(axis=1)
    return np.lexsort((np.arange(len(vec)), dist))[:k].tolist()


def test_ten_thousand_superfiles_answer_like_their_compaction(many: tuple[str, int, int, np.ndarray]) -> None:
    uri, wide, compacted, vec = many
    query = vec[123] + 0.01
    root = uri.removeprefix("file://")
    fds = _fds()
    got = _answers(uri, wide, query)
    assert _fds() <= fds + 8  # readers of local files keep no descriptor: their mapping outlives it
    assert _maps(root) <= open_readers().limits[1]
    held_bytes, held_files = open_readers().totals()
    limit_bytes, limit_files = open_readers().limits
    assert held_bytes <= limit_bytes and held_files <= limit_files
    expected = _answers(uri, compacted, query)
    assert got == expected
    vector_ids, _ = got["vector"]
    bm25_ids, _ = got["bm25 alpha beta"]
    assert got["count"] == FILES * PER_FILE and vector_ids == _brute(vec, query, 10) and len(bm25_ids) == 10


def test_sql_over_ten_thousand_superfiles(many: tuple[str, int, int, np.ndarray]) -> None:
    """SQL reads the current (compacted) version; the 10,000-superfile version's answers are checked above.
    Here the wide version is restored as the current one and SQL's count, filter and group-by are compared."""
    uri, wide, _, _ = many
    db = superfile.connect(uri, fsync=False)
    query = "SELECT cat, count(*) AS c, sum(n) AS s FROM t WHERE n % 3 = 1 GROUP BY cat ORDER BY cat"
    before = db.sql(query)
    t = db.open_table("t")
    t.restore(wide)
    assert t.stats()["superfile_count"] == FILES
    assert db.sql(query).equals(before)
    assert db.sql("SELECT count(*) AS c FROM t WHERE cat = 'c2'")["c"][0].as_py() == sum(
        1 for i in range(ROWS) if i % 7 == 2
    )


@pytest.fixture
def tiny_budget() -> Iterator[tuple[int, int]]:
    """Budgets so small that almost every reader is evicted right after use."""
    saved = open_readers().limits
    set_open_budget(64 * 1024, 2)
    try:
        yield 64 * 1024, 2
    finally:
        set_open_budget(*saved)


def test_a_tiny_budget_evicts_and_still_answers(
    tmp_path: Path, tiny_budget: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reader mapped (none read whole into memory), the budget holds two: searches over 600 superfiles,
    two at once, evict readers the other search still uses, and both answer as the compacted table."""
    uri, wide, compacted, vec = _make(tmp_path, FEW_FILES)
    monkeypatch.setattr(reader_module, "READ_WHOLE_BYTES", 0)
    query = vec[7]
    expected = _answers(uri, compacted, query)
    root = uri.removeprefix("file://")
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(_answers(uri, wide, query))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors and len(results) == 2
    assert all(r == expected for r in results)
    held_bytes, held_files = open_readers().totals()
    one_reader = 128 * 1024  # a 2-row superfile's reader holds well under this
    assert held_bytes <= tiny_budget[0] + one_reader and 1 <= held_files <= tiny_budget[1] + 1  # mapped readers
    # 10,000 superfiles were mapped and searched; the mappings of all but the budget's went. The compacted
    # superfile's are not counted: the search's union caches hold its indexes (table/search.py, by count)
    table = superfile.connect(uri).open_table("t", version=compacted)
    assert isinstance(table, Supertable)
    compacted_file = table._current().entries()[0].path
    assert _maps(root, but=compacted_file.rsplit("/", 1)[-1].removesuffix(".parquet")) <= tiny_budget[1] + 1


def test_budgets_from_the_environment_are_checked(tmp_path: Path) -> None:
    """``SUPERFILE_OPEN_BYTES`` / ``SUPERFILE_OPEN_FILES`` set the budgets of a fresh process; a bad value is a
    typed error at the first table opened; a lowered descriptor limit lowers the default handle budget."""
    import subprocess
    import sys

    code = (
        "import resource, superfile\n"
        "from superfile.table.snapshot import open_readers, set_open_budget\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        f"superfile.connect('file://{tmp_path}').create_table('t', data={{'a': [1, 2]}}, exist_ok=True)\n"
        "print(open_readers().limits)\n"
    )

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
        )

    done = run({"SUPERFILE_OPEN_BYTES": "1000000", "SUPERFILE_OPEN_FILES": "77"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1000000, 77)"
    done = run({"SUPERFILE_OPEN_BYTES": "", "SUPERFILE_OPEN_FILES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(", 100)")  # half of the 200 descriptors
    done = run({"SUPERFILE_OPEN_FILES": "lots"})
    assert done.returncode != 0 and "InvalidOptionError" in done.stderr and "SUPERFILE_OPEN_FILES" in done.stderr


def test_budget_lru_keeps_each_total_within_one_value_of_its_budget() -> None:
    """Values of several weights, loaded, hit and re-weighed in a random order by four threads: after every
    step each total is within its budget plus the largest value, and the totals are what the held values
    weigh (nothing evicted is still counted, nothing held is uncounted)."""
    weights: dict[str, list[int]] = {f"k{i}": [i % 7 * 10 + 1, i % 3] for i in range(40)}
    cache = BudgetLRU((100, 4), lambda w: tuple(w))
    largest = (max(w[0] for w in weights.values()), max(w[1] for w in weights.values()))
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(400):
            key = f"k{int(rng.integers(40))}"
            value, _ = cache.get_or_load(key, lambda key=key: weights[key])
            if rng.random() < 0.2:
                cache.charge(key, value)
            held_bytes, held_files = cache.totals()
            if held_bytes > 100 + largest[0] or held_files > 4 + largest[1]:
                errors.append(f"{held_bytes}, {held_files}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    held = [k for k in weights if k in cache]
    assert cache.totals() == (sum(weights[k][0] for k in held), sum(weights[k][1] for k in held))
    cache.set_limits((10, 0))  # a budget below every value: one value stays, the most recent
    assert sum(k in cache for k in weights) == 1
