"""A query root over cache nodes that lose answers, answer 503, turn slow or are not there at all: every
read still answers, and answers what the embedded engine does (docs/query.md, "Failures").

Three real cache nodes (``superfile-cache serve``), each behind a fault-injecting proxy that acts on its
leaf requests only (health checks pass), and a root in this process (``superfile.connect(uri,
cache_nodes=...)``), compared read by read with an embedded connection on the same table."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import superfile
from superfile.errors import CacheNodeUnavailableError
from superfile.remote.errors import AuthenticationError
from superfile.search.fleet import Fleet
from superfile.telemetry import render
from superfile_suite import Server, start_cache_node
from superfile_suite.faults import Faults, FaultyHttpProxy, Request

TOKEN = "fleet-faults-token"
DIM = 8
WORDS = [
    "supersonic",
    "boundary",
    "layer",
    "transition",
    "heat",
    "transfer",
    "hypersonic",
    "flow",
    "wing",
    "flutter",
    "laminar",
    "plate",
    "shock",
]

pytestmark = pytest.mark.timeout(300)


def _leaf(request: Request) -> bool:
    return request.method == "POST" and request.path == "/v1/leaf"


@pytest.fixture(scope="module")
def root_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table of 8 superfiles with deleted rows."""
    root = tmp_path_factory.mktemp("fleet")
    db = superfile.connect(f"file://{root}")
    schema = pa.schema([("key", pa.int64()), ("title", pa.string()), ("emb", pa.list_(pa.float32()))])
    table = db.create_table("docs", schema, fts_columns=["title"], vector_columns={"emb": DIM})
    rng = np.random.default_rng(7)
    for part in range(8):
        keys = range(part * 30, part * 30 + 30)
        table.append(
            [{"key": k, "title": " ".join(rng.choice(WORDS, 6)), "emb": rng.normal(size=DIM).tolist()} for k in keys]
        )
    table.delete("key % 11 = 0")
    return root


@pytest.fixture(scope="module")
def nodes(root_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[Server, FaultyHttpProxy]]]:
    started: list[tuple[Server, FaultyHttpProxy]] = []
    try:
        for i in range(3):
            node = start_cache_node(f"file://{root_dir}", str(tmp_path_factory.mktemp(f"cache{i}")), TOKEN)
            # a seed each: proxies seeded alike draw the same fault for their n-th requests, and a share sent
            # on after a fault meets it again on every node (the rounds fail together, a CI flake)
            started.append((node, FaultyHttpProxy(node.url, seed=i)))
        yield started
    finally:
        for node, proxy in started:
            proxy.close()
            node.stop()


@pytest.fixture
def root(root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]]) -> Iterator[Any]:
    """A fresh root (its own health view and latency history) over the three proxies, faults cleared."""
    for _, proxy in nodes:
        proxy.faults = Faults(match=_leaf)
    db = superfile.connect(f"file://{root_dir}", cache_nodes=[p.endpoint for _, p in nodes], internal_token=TOKEN)
    yield db
    db.close()


def _reads(rng: np.random.Generator) -> list[Callable[[Any], pa.Table]]:
    vector = rng.normal(size=DIM).tolist()
    words = " ".join(rng.choice(WORDS, 2))
    token = str(rng.choice(WORDS))
    return [
        lambda t: t.bm25_search("title", words, 10),
        lambda t: t.bm25_search("title", words, 5, mode="all"),
        lambda t: t.bm25_search_prefix("title", "hyp", 10),
        lambda t: t.token_match("title", [token]),
        lambda t: t.vector_search("emb", vector, 10),
        lambda t: t.vector_search("emb", vector, 10, where="key > 40"),
        lambda t: t.to_arrow(["_id", "title"], where="key < 100"),
    ]


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.column("_id").to_pylist() == b.column("_id").to_pylist()
    if "score" in a.column_names:
        np.testing.assert_allclose(
            np.asarray(a.column("score").to_pylist(), float), np.asarray(b.column("score").to_pylist(), float), 1e-6
        )


def _busiest(db: Any, nodes: list[tuple[Server, FaultyHttpProxy]]) -> FaultyHttpProxy:
    """The proxy of the node owning the most of ``docs``' live superfiles now: rendezvous hashing over
    random ports leaves a node with none of 8 superfiles in 4% of runs, and a fault on it would meet no call."""
    paths = [e.path for e in db.snapshot("docs", db.open_table("docs").stats()["manifest_id"]).entries()]
    owned = db.fleet.placement(paths)
    return max((p for _, p in nodes), key=lambda p: len(owned.get(p.endpoint, [])))


def _counter(name: str) -> float:
    """A counter's value summed over its labels, from this process's Prometheus exposition."""
    total = 0.0
    for line in render().decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_lost_and_refused_leaf_answers_go_to_the_next_node(
    root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]], root: Any
) -> None:
    for _, proxy in nodes:
        proxy.faults = Faults(lose=0.15, error=0.15, match=_leaf)
    embedded = superfile.connect(f"file://{root_dir}").open_table("docs")
    fleet = root.open_table("docs")
    retries = _counter("superfile_query_leaf_retries_total")
    rng = np.random.default_rng(1)
    for _ in range(6):
        for read in _reads(rng):
            _same(read(embedded), read(fleet))
    assert sum(p.faults.injected for _, p in nodes) > 0
    assert _counter("superfile_query_leaf_retries_total") > retries


def test_a_round_tries_every_node_before_the_next(nodes: list[tuple[Server, FaultyHttpProxy]]) -> None:
    """After a failure a share goes to the live nodes not tried in this round, then to any node not tried:
    a node marked down (here its health check is refused; elsewhere another read's failure did it) still
    gets its turn. Before, a round ended at the live nodes, so a health check reviving the failed ones while
    a third stayed marked down sent the share round the failing ones until the read failed (a CI flake)."""
    a, b, c = (p for _, p in nodes)
    b.faults = Faults(refuse=1.0, match=lambda r: r.path == "/healthz")
    fleet = Fleet([p.endpoint for p in (a, b, c)], token=TOKEN, check_s=3600)
    try:
        assert [m.healthy for m in fleet.members()] == [True, False, True]
        assert fleet._untried(frozenset({a.endpoint})) == [c.endpoint]  # live ones first
        assert fleet._untried(frozenset({a.endpoint, c.endpoint})) == [b.endpoint]
        assert fleet._untried(frozenset({a.endpoint, b.endpoint, c.endpoint})) == []
    finally:
        fleet.close()
        b.faults = Faults(match=_leaf)


def _warmed(root: Any, seed: int) -> tuple[Any, np.random.Generator]:
    """``docs`` through ``root`` after enough reads for hedging to start (the p95 needs 20 answers)."""
    fleet = root.open_table("docs")
    rng = np.random.default_rng(seed)
    for _ in range(5):
        for read in _reads(rng):
            read(fleet)
    return fleet, rng


def test_a_slow_node_is_hedged_after_the_p95(
    root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]], root: Any
) -> None:
    embedded = superfile.connect(f"file://{root_dir}").open_table("docs")
    fleet, rng = _warmed(root, 2)
    slow_s = 3.0
    slow = _busiest(root, nodes)
    slow.faults = Faults(delay=1.0, delay_s=slow_s, match=_leaf)
    hedges = _counter("superfile_query_leaf_hedges_total")
    for read in _reads(rng):
        start = time.monotonic()
        got = read(fleet)
        assert time.monotonic() - start < slow_s, "a read waited for the slow node instead of hedging"
        _same(read(embedded), got)
    assert slow.faults.counts["delay"] > 0
    assert _counter("superfile_query_leaf_hedges_total") > hedges


def test_hedges_are_held_to_a_budget_when_every_node_turns_slow(
    root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]], root: Any
) -> None:
    """When every call turns late at once, hedging them all would double the load (on a busy machine each
    hedge's transient read makes the others later still): hedges stay within a burst of 10 and 5% of the
    calls answered, and the reads answer as embedded."""
    embedded = superfile.connect(f"file://{root_dir}").open_table("docs")
    fleet, rng = _warmed(root, 5)
    for _, proxy in nodes:
        proxy.faults = Faults(delay=1.0, delay_s=0.1, match=_leaf)  # every leaf call, past the 20 ms floor
    hedges = _counter("superfile_query_leaf_hedges_total")
    before = sum(proxy.faults.counts["requests"] for _, proxy in nodes)
    for _ in range(6):
        for read in _reads(rng):
            _same(read(embedded), read(fleet))
    calls = sum(proxy.faults.counts["requests"] for _, proxy in nodes) - before
    hedged = _counter("superfile_query_leaf_hedges_total") - hedges
    assert calls > 60, calls
    assert 0 < hedged <= 10 + 0.05 * calls + 1, (hedged, calls)


def test_a_first_call_on_a_new_version_is_hedged_only_late(
    root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]], root: Any
) -> None:
    """A node's first call on a version it has not answered opens it (a commit's manifest, its new superfiles),
    so it is hedged only past 1 s, not at the p95: after a commit most calls would be sent twice. Its next call
    on that version is hedged at the p95 again."""
    fleet, rng = _warmed(root, 4)
    writer = superfile.connect(f"file://{root_dir}").open_table("docs")
    writer.append(
        [{"key": 100_000 + k, "title": "shock plate", "emb": rng.normal(size=DIM).tolist()} for k in range(5)]
    )

    def scan(t: Any) -> pa.Table:  # one call to every node
        return t.to_arrow(["_id", "title"], where="key >= 0")

    slow_s = 0.4
    _busiest(root, nodes).faults = Faults(delay=1.0, delay_s=slow_s, match=_leaf)
    hedges = _counter("superfile_query_leaf_hedges_total")
    start = time.monotonic()
    _same(scan(writer), scan(fleet))
    assert time.monotonic() - start >= slow_s, "the slow node's first call on the version was not waited for"
    assert _counter("superfile_query_leaf_hedges_total") == hedges, "a first call on a new version was hedged"
    start = time.monotonic()
    _same(scan(writer), scan(fleet))
    assert time.monotonic() - start < slow_s, "the node answered this version once: its next call is hedged"
    assert _counter("superfile_query_leaf_hedges_total") > hedges


def test_cache_nodes_found_by_dns(root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]]) -> None:
    """``cache_dns``: every address the name resolves to is a member; one that does not answer its health
    check (here localhost's IPv6 address, if any: the node listens on 127.0.0.1) takes no work."""
    node = nodes[1][0]
    db = superfile.connect(f"file://{root_dir}", cache_dns=f"localhost:{node.port}", internal_token=TOKEN)
    try:
        members = db.fleet.members()
        assert f"http://127.0.0.1:{node.port}" in {m.url for m in members if m.healthy}
        embedded = superfile.connect(f"file://{root_dir}").open_table("docs")
        for read in _reads(np.random.default_rng(3)):
            _same(read(embedded), read(db.open_table("docs")))
    finally:
        db.close()


def test_no_node_answering_is_a_typed_error(root_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    db = superfile.connect(f"file://{root_dir}", cache_nodes=[f"http://127.0.0.1:{port}"], internal_token=TOKEN)
    try:
        with pytest.raises(CacheNodeUnavailableError):
            db.open_table("docs").bm25_search("title", "supersonic", 5)
        assert db.open_table("docs").count_rows() > 0  # the manifest answers a plain count: no node needed
    finally:
        db.close()


def test_a_wrong_token_is_refused_by_the_nodes(root_dir: Path, nodes: list[tuple[Server, FaultyHttpProxy]]) -> None:
    db = superfile.connect(
        f"file://{root_dir}", cache_nodes=[n.url for n, _ in nodes], internal_token=f"not-{uuid.uuid4().hex}"
    )
    try:
        with pytest.raises(AuthenticationError):
            db.open_table("docs").vector_search("emb", [0.0] * (DIM - 1) + [1.0], 3)
    finally:
        db.close()


def test_a_failed_node_keeps_its_share_until_move_after(nodes: list[tuple[Server, FaultyHttpProxy]]) -> None:
    """A node that stops answering its health checks keeps its share for ``move_after_s`` (a restart moves
    nothing, docs/query.md); its share is placed on the others only after that, and it takes it back when it
    answers again."""
    urls = [p.endpoint for _, p in nodes]
    paths = [f"s/{i}.superfile" for i in range(300)]
    fleet = Fleet(urls, token=TOKEN, check_s=0.1, move_after_s=1.5)
    victim = nodes[1][1]
    try:
        before = fleet.placement(paths)
        generation = fleet.generation
        victim.faults = Faults(refuse=1.0, match=lambda r: True)
        deadline = time.monotonic() + 10
        while fleet.generation == generation and time.monotonic() < deadline:  # the health check sees it down
            time.sleep(0.02)
        down = {m.url: m.healthy for m in fleet.members()}
        assert down[victim.endpoint] is False
        assert fleet.placement(paths) == before  # within move_after_s: nothing moves
        while fleet.placement(paths) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        moved = fleet.placement(paths)
        assert victim.endpoint not in moved or not moved[victim.endpoint]
        for url, share in before.items():  # only its share moves, each to its next node
            if url != victim.endpoint:
                assert set(share) <= set(moved[url])
        victim.faults = Faults(match=_leaf)
        while fleet.placement(paths) != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.placement(paths) == before  # back: it owns its share again
    finally:
        victim.faults = Faults(match=_leaf)
        fleet.close()


def test_a_node_no_longer_listed_keeps_its_share_until_move_after(
    nodes: list[tuple[Server, FaultyHttpProxy]],
) -> None:
    """A node that drops out of the member list (a restarting pod leaves its headless Service until it is ready
    again) keeps its share for ``move_after_s`` like a failed one, then loses it."""
    urls = [p.endpoint for _, p in nodes]
    paths = [f"s/{i}.superfile" for i in range(300)]
    fleet = Fleet(urls, token=TOKEN, check_s=0.1, move_after_s=1.5)
    try:
        before = fleet.placement(paths)
        fleet._static = [urls[0], urls[2]]  # what a DNS answer without the restarting pod gives
        deadline = time.monotonic() + 10
        while urls[1] in {m.url for m in fleet.members()} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert urls[1] not in {m.url for m in fleet.members()}
        assert fleet.placement(paths) == before  # within move_after_s: nothing moves
        while fleet.placement(paths) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not fleet.placement(paths).get(urls[1])
        fleet._static = urls  # listed again: it owns its share again
        while fleet.placement(paths) != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.placement(paths) == before
    finally:
        fleet.close()
