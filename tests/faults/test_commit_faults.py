"""Lost answers never lose or duplicate a row: concurrent writers whose storage drops answers after the write
took effect, on file:// (a wrapper over the real local backend) and on s3:// (a proxy in front of the real
S3 server that drops answers, answers 503 after acting, refuses and delays)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import boto3
import pyarrow as pa
import pytest
import superfile
from losing_storage import LosingStorage
from superfile.errors import CommitStateUnknownError, StorageError
from superfile.io import from_uri
from superfile_suite import Server, start_moto
from superfile_suite.faults import Faults, FaultyHttpProxy, Request, conditional_put

WRITERS = 4
APPENDS = 25
ROWS = 3  # per append
REPEATS = 5

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with start_moto() as server:
        yield server


def _bucket(endpoint: str) -> str:
    name = f"f-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    ).create_bucket(Bucket=name)
    return name


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)


def _rows(writer: int, n: int) -> pa.Table:
    ids = [writer * 10_000 + n * ROWS + r for r in range(ROWS)]
    return pa.table({"id": pa.array(ids, pa.int64()), "text": [f"writer {writer} append {n} row {i}" for i in ids]})


def _run_writers(connect: Callable[[], superfile.Connection], table: str) -> list[BaseException]:
    """WRITERS threads, each with its own connection, APPENDS appends each; returns what any append raised."""
    failures: list[BaseException] = []
    start = threading.Barrier(WRITERS)

    def writer(w: int) -> None:
        t = connect().open_table(table)
        start.wait()
        for n in range(APPENDS):
            try:
                t.append(_rows(w, n))
            except BaseException as exc:  # every append must return: any exception fails the test
                failures.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    return failures


def _check_exactly_once(conn: superfile.Connection, table: str) -> None:
    ids = conn.open_table(table).to_arrow(["id"]).column("id").to_pylist()
    expected = {w * 10_000 + i for w in range(WRITERS) for i in range(APPENDS * ROWS)}
    duplicated = len(ids) - len(set(ids))
    lost = expected - set(ids)
    assert (duplicated, len(lost)) == (0, 0), f"{duplicated} duplicated, {len(lost)} lost"
    assert set(ids) == expected


def _create(conn: superfile.Connection, table: str) -> None:
    conn.create_table(table, _rows(0, 0).schema, fts_columns=["text"])


@pytest.mark.slow
def test_lost_answers_on_local_disk(tmp_path: pytest.TempPathFactory) -> None:
    """20% of conditional writes (manifests, parts, deletion vectors, key blocks, the pointer swap, the _id
    sequence) act and then raise: every append returns, no row is lost or duplicated, 5 times over."""
    for repeat in range(REPEATS):
        uri = f"file://{tmp_path}/r{repeat}"
        _create(superfile.connect(uri), "t")
        losing: list[LosingStorage] = []

        def connect(uri: str = uri, repeat: int = repeat, losing: list[LosingStorage] = losing) -> superfile.Connection:
            storage = LosingStorage(from_uri(uri), 0.2, seed=repeat * 100 + len(losing))
            losing.append(storage)
            return superfile.Connection(uri, storage=storage)

        failures = _run_writers(connect, "t")
        assert not failures, f"repeat {repeat}: {len(failures)} appends raised, first: {failures[0]!r}"
        assert sum(s.dice.lost for s in losing) >= 20, "the faults did not happen"
        _check_exactly_once(superfile.connect(uri), "t")


@pytest.mark.slow
def test_lost_answers_on_s3(moto: Server) -> None:
    """A proxy in front of the S3 server loses the answer of 20% of conditional PUTs (manifests, parts,
    deletion vectors, key blocks, the pointer swap, the _id sequence) after the server stored them: every
    append returns, no row is lost or duplicated, 5 times over."""
    with FaultyHttpProxy(moto.url, Faults(lose=0.2, match=conditional_put), seed=7) as proxy:
        for repeat in range(REPEATS):
            bucket = _bucket(moto.url)
            _create(superfile.connect(f"s3://{bucket}/tables?endpoint_url={moto.url}"), "t")
            uri = f"s3://{bucket}/tables?endpoint_url={proxy.endpoint}"
            lost_before = proxy.faults.counts["lose"]
            failures = _run_writers(lambda uri=uri: superfile.connect(uri), "t")
            assert not failures, f"repeat {repeat}: {len(failures)} appends raised, first: {failures[0]!r}"
            assert proxy.faults.counts["lose"] - lost_before >= 50, "the faults did not happen"
            _check_exactly_once(superfile.connect(f"s3://{bucket}/tables?endpoint_url={moto.url}"), "t")


@pytest.mark.slow
def test_errors_after_acting_refusals_and_delays_on_s3(moto: Server) -> None:
    """503 answers to writes (any PUT or DELETE) the server performed, 503 refusals of writes it never saw,
    and delays: nothing lost or duplicated, every append returns."""
    faults = Faults(error=0.05, refuse=0.05, delay=0.1, delay_s=0.05)
    with FaultyHttpProxy(moto.url, faults, seed=11) as proxy:
        bucket = _bucket(moto.url)
        _create(superfile.connect(f"s3://{bucket}/tables?endpoint_url={moto.url}"), "t")
        uri = f"s3://{bucket}/tables?endpoint_url={proxy.endpoint}"
        failures = _run_writers(lambda: superfile.connect(uri), "t")
        assert not failures, f"{len(failures)} appends raised, first: {failures[0]!r}"
        assert min(proxy.faults.counts[k] for k in ("error", "refuse", "delay")) >= 5
    _check_exactly_once(superfile.connect(f"s3://{bucket}/tables?endpoint_url={moto.url}"), "t")


def test_commit_whose_fate_cannot_be_read_is_unknown_and_a_keyed_retry_commits_once(moto: Server) -> None:
    """Every answer to the pointer swap is lost and storage then refuses every read: the append raises
    CommitStateUnknownError naming the manifest; once storage answers again, the same append retried with
    its idempotency key finds that commit and adds nothing."""
    bucket = _bucket(moto.url)
    direct = f"s3://{bucket}/tables?endpoint_url={moto.url}"
    _create(superfile.connect(direct), "t")

    def is_swap(r: Request) -> bool:
        return conditional_put(r) and r.path.endswith("_pointer.json")

    # the first pointer swap is performed and its answer lost; from then on no answer comes back at all
    faults = Faults(lose=1.0)
    faults.match = lambda r: is_swap(r) or faults.counts["lose"] > 0
    with FaultyHttpProxy(moto.url, faults) as proxy:
        table = superfile.connect(f"s3://{bucket}/tables?endpoint_url={proxy.endpoint}&max_attempts=2").open_table("t")
        started = time.monotonic()
        with pytest.raises(CommitStateUnknownError) as caught:
            table.append(_rows(1, 0), idempotency_key="request-1")
        assert time.monotonic() - started < 60
    err = caught.value
    assert isinstance(err, StorageError) and err.manifest.startswith("_manifests/") and err.version == 2
    assert err.manifest in str(err) and "idempotency key" in str(err)
    fresh = superfile.connect(direct).open_table("t")
    assert fresh.versions()[-1]["version"] == 2  # the swap had landed
    assert fresh.idempotency_version("request-1") == 2
    assert fresh.append(_rows(1, 0), idempotency_key="request-1") == 2  # the retry adds nothing
    ids = fresh.to_arrow(["id"]).column("id").to_pylist()
    assert sorted(ids) == _rows(1, 0).column("id").to_pylist()
