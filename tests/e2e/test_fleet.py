"""The distributed read path as deployed (issue 16): an SDK talking to a gateway that forwards every read to a
query service, which fans out to three cache nodes (real processes on 127.0.0.1) over a bucket on moto's S3.

- every search kind, scans, counts and SQL answer exactly as an embedded connection on the same bucket;
- a cache node SIGKILLed under load costs no request; restarted on its port and directory, it serves from
  the disk cache it kept;
- warm on commit downloads each superfile once fleet-wide, onto its owner, and a fourth node takes about a
  quarter of them;
- bad input gets typed answers: 401 without the internal token, 400 for a malformed leaf request, and a
  superfile missing from storage is a ``SuperfileMissingError`` naming it, at the node and through the SDK;
- a commit's BM25 statistics are gathered for the terms searched lately before the next search needs them;
- the gateway reads on through a query service restarted on its port, on a new connection.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pytest
import superfile
from e2e_support import wait_until
from fleet_support import API_KEY, FleetProcesses, aws_env, request, running_fleet, s3_bucket
from superfile.errors import SuperfileMissingError
from superfile.search.placement import assign
from superfile_suite import Server, start_query

DIM = 8
VOCAB = [
    "alpha", "beta", "gamma", "gamut", "gambit", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma",
    "omega", "boundary", "layer", "shock", "wave", "flutter", "laminar", "plate", "wing", "nozzle", "vortex", "jet",
]  # fmt: skip
TAGS = ["red fox", "lazy dog", "quick brown fox", "blue whale", "red panda"]
DOCS_SCHEMA = pa.schema(
    [("key", pa.int64()), ("title", pa.string()), ("tag", pa.string()), ("emb", pa.list_(pa.float32()))]
)
DOCS_ROWS = 1500  # in three appends, 100 rows a superfile: 15 superfiles
SPREAD = 300  # superfiles of a second table: enough for the share a fourth node takes to be measured
REL = 1e-6  # scores: relative tolerance between embedded and fleet


def _docs(start: int, stop: int) -> pa.Table:
    rng = np.random.default_rng(start)
    keys = list(range(start, stop))
    titles = [" ".join(rng.choice(VOCAB, size=int(rng.integers(2, 8)))) for _ in keys]
    tags = [TAGS[int(i)] for i in rng.integers(0, len(TAGS), len(keys))]
    emb = rng.normal(size=(len(keys), DIM)).astype(np.float32)
    return pa.table(
        {"key": keys, "title": titles, "tag": tags, "emb": [list(map(float, v)) for v in emb]}, schema=DOCS_SCHEMA
    )


@dataclass
class Setup:
    s3: Server
    uri: str
    emb: Any  # superfile.connect(s3_uri): embedded, the reference
    sdk: Any  # superfile.connect(gateway URL): gateway -> query -> cache nodes
    fleet: FleetProcesses
    bucket: str
    missing: str  # the superfile of table "broken" deleted from the bucket


def _live_paths(db: Any, name: str) -> list[str]:
    table = db.open_table(name)
    return [e.path for e in db.snapshot(name, table.stats()["manifest_id"]).entries()]


@pytest.fixture(scope="module")
def setup(s3: Server) -> Iterator[Setup]:
    """Three tables written embedded before the fleet starts: ``docs`` (15 superfiles, rows deleted in two
    ways), ``spread`` (300 one-row-pair superfiles), ``broken`` (one superfile, then deleted out of band)."""
    with s3_bucket(s3) as uri:
        emb = superfile.connect(uri)
        docs = emb.create_table(
            "docs", DOCS_SCHEMA, fts_columns=["title", "tag"], vector_columns={"emb": DIM}, max_rows_per_superfile=100
        )
        for start in range(0, DOCS_ROWS, 500):
            docs.append(_docs(start, start + 500))
        docs.delete("tag = 'lazy dog'")
        docs.delete("key >= 700 AND key < 760")
        spread = emb.create_table("spread", pa.schema([("key", pa.int64())]), max_rows_per_superfile=2)
        spread.append(pa.table({"key": list(range(2 * SPREAD))}))
        broken = emb.create_table("broken", DOCS_SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM})
        broken.append(_docs(0, 10))
        [missing] = _live_paths(emb, "broken")
        bucket = uri.removeprefix("s3://").split("/", 1)[0]
        boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1").delete_object(
            Bucket=bucket, Key=f"tables/broken/{missing}"
        )
        assert docs.stats()["superfile_count"] >= 8 and docs.stats()["deleted_rows"] > 0
        # a killed node keeps its share for the whole of its test (SUPERFILE_MOVE_AFTER_S, docs/query.md)
        with running_fleet(uri, {**aws_env(s3), "SUPERFILE_MOVE_AFTER_S": "600"}) as fleet:
            assert fleet.gateway is not None
            sdk = superfile.connect(fleet.gateway.url, api_key=API_KEY)
            try:
                yield Setup(s3, uri, emb, sdk, fleet, bucket, missing)
            finally:
                sdk.close()
                emb.close()


# -- helpers ----------------------------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _copy_name(path: str) -> str:
    """How a cache node's disk cache names its copy of superfile ``path`` (after a hash of the storage URI)."""
    return _UNSAFE.sub("_", posixpath.basename(path))[-80:]


def _copies(cache_dir: str) -> dict[str, int]:
    """The whole copies in a cache node's ``--cache-dir``: name (after the hash) -> inode (a download replaces it)."""
    below = os.path.join(cache_dir, "superfiles")  # where superfile.connect(cache_dir=...) keeps them
    if not os.path.isdir(below):
        return {}
    return {
        e.name.split("-", 1)[1]: e.inode() for e in os.scandir(below) if not e.name.endswith(".part") and "-" in e.name
    }


def _held(cache_dir: str, paths: list[str]) -> set[str]:
    """Which of ``paths`` have a whole copy in ``cache_dir``."""
    names = _copies(cache_dir)
    return {p for p in paths if _copy_name(p) in names}


def _query_counter(fleet: FleetProcesses, name: str) -> float:
    """A counter of the query service's ``/metrics``, summed over its labels."""
    assert fleet.query is not None
    with urllib.request.urlopen(f"{fleet.query.url}/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


def _same(expected: pa.Table, got: pa.Table, what: str) -> None:
    """Identical rows in identical order; ``score`` within ``REL``."""
    assert got.column_names == expected.column_names, what
    assert got.num_rows == expected.num_rows, f"{what}: {got.num_rows} rows, embedded {expected.num_rows}"
    for name in expected.column_names:
        want, have = expected.column(name).to_pylist(), got.column(name).to_pylist()
        if name == "score":
            for a, b in zip(want, have, strict=True):
                if a is None or b is None:  # unranked matches have no score
                    assert a is None and b is None, (what, a, b)
                else:
                    assert math.isclose(a, b, rel_tol=REL, abs_tol=1e-12), (what, a, b)
        else:
            assert have == want, f"{what}: column {name!r} differs"


Q = [0.5, -1.0, 0.25, 0.0, 1.5, -0.5, 0.75, 0.1]
READS: dict[str, Callable[[Any], pa.Table]] = {
    "bm25 any": lambda t: t.bm25_search("title", "gamma shock vortex", k=25, projection=["key", "title"]),
    "bm25 all": lambda t: t.bm25_search("title", "gamma shock", k=25, mode="all", projection=["key"]),
    "bm25 tag": lambda t: t.bm25_search("tag", "fox", k=40),
    "prefix": lambda t: t.bm25_search_prefix("title", "gam", k=30, projection=["key", "title"]),
    "token_match and": lambda t: t.token_match("title", ["wing", "jet"], "and", projection=["key"]),
    "token_match or": lambda t: t.token_match("title", "nozzle laminar", "or", projection=["key", "tag"]),
    "exact_match": lambda t: t.exact_match("tag", "red panda", projection=["key"]),
    "vector": lambda t: t.vector_search("emb", Q, k=20, projection=["key"]),
    "vector where": lambda t: t.vector_search("emb", Q, k=15, where="key >= 600 AND tag = 'red fox'"),
    "vector filter": lambda t: t.vector_search(
        "emb", Q, k=15, filter={"column": "title", "query": "flutter"}, projection=["key", "title"]
    ),
    "hybrid": lambda t: t.hybrid_search("title", "boundary layer", "emb", Q, k=20, projection=["key"]),
    "scan": lambda t: t.to_arrow(columns=["_id", "key", "tag"], where="key < 400 OR tag = 'blue whale'"),
    "scan all": lambda t: t.to_arrow(),
}
COUNTS: dict[str, Callable[[Any], int]] = {
    "count": lambda t: t.count_rows(),
    "count where": lambda t: t.count_rows("tag = 'red fox' AND key >= 300"),
    "count range": lambda t: t.count_rows("key < 1000"),
}
SQL = [
    "SELECT count(*) AS n, min(key) AS lo, max(key) AS hi FROM docs WHERE tag <> 'blue whale'",
    "SELECT tag, count(*) AS n FROM docs GROUP BY tag ORDER BY tag",
    "SELECT key, title FROM docs WHERE key BETWEEN 650 AND 780 ORDER BY key",
    "SELECT _id, key, score FROM bm25_search('docs', 'title', 'flutter wave', 30) ORDER BY score DESC, _id",
    "SELECT _id, key, score FROM bm25_search('docs', 'title', 'boundary layer', 30, 'all') ORDER BY score DESC, _id",
    f"SELECT _id, key, tag, score FROM vector_search('docs', 'emb', {Q}, 25) ORDER BY score, _id",
    f"SELECT _id, key, score FROM hybrid_search('docs', 'title', 'shock', 'emb', {Q}, 20) ORDER BY score DESC, _id",
    "SELECT b.tag, count(*) AS n FROM bm25_search('docs', 'title', 'sigma', 50) b GROUP BY b.tag ORDER BY b.tag",
]


# -- tests (in this order: the steady state first, on a fleet no read has touched; the SIGKILL last) ------------
def test_warm_on_commit_downloads_each_superfile_once(setup: Setup) -> None:
    """After warm-up every live superfile is on exactly its owner's disk, downloaded once fleet-wide; reads
    then download nothing; a fourth node takes about 1/4 of the superfiles, all of them from the others."""
    fleet, emb = setup.fleet, setup.emb
    paths = sorted(p for name in ("docs", "spread") for p in _live_paths(emb, name))
    nodes = {n.url: d for n, d in zip(fleet.cache, fleet.cache_dirs, strict=True)}
    owners = assign(paths, list(nodes))
    assert all(owners.values()), "every node owns some superfiles"

    def placed() -> bool:
        return all(_held(nodes[url], paths) == set(share) for url, share in owners.items())

    wait_until(placed, 60, "warm on commit to put each superfile on its owner")
    downloads = {n.url: fleet.stats(n)["downloads"] for n in fleet.cache}
    assert sum(downloads.values()) == len(paths), downloads  # the missing superfile of "broken" never arrives
    assert downloads == {url: len(share) for url, share in owners.items()}
    members = fleet.cluster()
    assert [m["url"] for m in members] == sorted(nodes) and all(m["healthy"] for m in members)
    broken = {url: s for url, s in assign(_live_paths(emb, "broken"), list(nodes)).items()}
    assert {m["url"]: m["superfiles"] for m in members} == {
        url: len(share) + len(broken[url]) for url, share in owners.items()
    }

    docs = setup.sdk.open_table("docs")
    hedges = _query_counter(fleet, "superfile_query_leaf_hedges_total")
    for read in READS.values():
        read(docs)
    assert setup.sdk.sql(SQL[0]).num_rows == 1
    after = {n.url: fleet.stats(n) for n in fleet.cache}
    assert all(s["hits"] > 0 for s in after.values())
    # a read is answered by the owners' copies; only a hedged call (one slower than the p95, sent to the next
    # node too) may make a node fetch a superfile it does not own, so none may arrive unless one was hedged
    if _query_counter(fleet, "superfile_query_leaf_hedges_total") == hedges:
        assert {u: s["downloads"] for u, s in after.items()} == downloads, "a read downloaded a warmed superfile"
    assert all(_held(nodes[url], paths) >= set(share) for url, share in owners.items())
    downloads = {u: s["downloads"] for u, s in after.items()}

    # a fourth node, seen by a second query service over all four
    fourth = fleet.start_node()
    nodes[fourth.url] = fleet.cache_dirs[-1]
    query4 = fleet.start_query()
    try:
        moved_to = assign(paths, list(nodes))
        moved = {p for p in moved_to[fourth.url]}
        for url, share in moved_to.items():
            if url != fourth.url:
                assert set(share) == set(owners[url]) - moved, "only superfiles the new node owns move"
        assert 0.15 <= len(moved) / len(paths) <= 0.35, f"{len(moved)} of {len(paths)} superfiles moved"
        wait_until(lambda: _held(nodes[fourth.url], paths) == moved, 60, "the fourth node to fetch its share")
        counts = {m["url"]: m["superfiles"] for m in fleet.cluster(query4)}
        broken4 = assign(_live_paths(emb, "broken"), list(nodes))
        assert counts == {url: len(share) + len(broken4[url]) for url, share in moved_to.items()}
        assert fleet.stats(fourth)["downloads"] == len(moved)
        assert {n.url: fleet.stats(n)["downloads"] for n in fleet.cache[:3]} == downloads  # no copy moved back
    finally:
        query4.stop()
        fourth.stop()
        fleet.cache.remove(fourth)
        fleet.cache_dirs.pop()


def test_identical_results(setup: Setup) -> None:
    """Every read through gateway -> query -> cache nodes equals the embedded read of the same bucket."""
    local, remote = setup.emb.open_table("docs"), setup.sdk.open_table("docs")
    assert remote.version == local.version and remote.count_rows() < DOCS_ROWS
    for what, read in READS.items():
        expected = read(local)
        assert expected.num_rows > 0, f"{what}: the reference finds nothing, the comparison would be empty"
        _same(expected, read(remote), what)
    for what, count in COUNTS.items():
        assert count(remote) == count(local), what
    for query in SQL:
        expected = setup.emb.sql(query)
        assert expected.num_rows > 0, query
        _same(expected, setup.sdk.sql(query), query)
    for version in (2, 4):  # past versions: after the first append, after the last (before the deletes)
        past_local, past_remote = local.checkout(version), remote.checkout(version)
        for what in ("bm25 any", "vector where", "scan"):
            _same(READS[what](past_local), READS[what](past_remote), f"{what} at version {version}")
        assert past_remote.count_rows() == past_local.count_rows()


def _leaf(node: Server, body: dict[str, Any], token: str | None) -> tuple[int, Any]:
    return request(f"{node.url}/v1/leaf", token=token, body=json.dumps(body).encode())


def test_bad_input(setup: Setup) -> None:
    fleet, emb = setup.fleet, setup.emb
    node = fleet.cache[0]
    manifest = emb.open_table("docs").stats()["manifest_id"]
    paths = _live_paths(emb, "docs")
    good = {"table": "docs", "manifest": manifest, "superfiles": paths[:2], "op": "count", "args": {}}
    status, body = _leaf(node, good, fleet.token)
    assert status == 200 and body["count"] > 0
    for token in (None, "not-the-token"):
        status, body = _leaf(node, good, token)
        assert status == 401 and body["error"]["type"] == "AuthenticationError"
    for name in ("/v1/stats", "/v1/leaf", "/v1/prefetch"):
        status, _ = request(f"{node.url}{name}", body=b"{}" if name != "/v1/stats" else None)
        assert status == 401, name
    malformed: list[bytes] = [
        b"not json",
        b"[1, 2]",
        b'{"table": "docs"}',
        b'{"table": "docs", "manifest": "m", "superfiles": "x", "op": "count", "args": {}}',
        f'{{"table": "docs", "manifest": "{manifest}", "superfiles": [], "op": "drop", "args": {{}}}}'.encode(),
        f'{{"table": "docs", "manifest": "{manifest}", "superfiles": ["{paths[0]}"], "op": "bm25", '
        '"args": {"column": "title"}}'.encode(),
        f'{{"table": "docs", "manifest": "{manifest}", "superfiles": ["data/nope.parquet"], "op": "count", '
        '"args": {}}'.encode(),
    ]
    malformed.append(b" " * (16 << 20) + b"{}")  # past the 16 MiB a leaf request may be
    for raw in malformed:
        status, body = request(f"{node.url}/v1/leaf", token=fleet.token, body=raw)
        assert status == 400, (raw, status, body)
        assert body["error"]["type"] in ("InvalidInputError", "InvalidOptionError"), body
    assert fleet.query is not None
    for token in (None, API_KEY, "not-the-token"):
        status, body = request(f"{fleet.query.url}/v1/cluster", token=token)
        assert status == 401, (token, body)
    assert len(fleet.cluster()) == 3


def _root_search(
    fleet: FleetProcesses, path: str, body: bytes, token: str | None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, str]:
    """POST ``path`` to the query root as a gateway forwards a search: status, body and content type."""
    assert fleet.query is not None
    sent = {"content-type": "application/json", "accept": "application/json", **(headers or {})}
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{fleet.query.url}{path}", data=body, headers=sent, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def test_query_root_search_path_answers_as_the_app(setup: Setup) -> None:
    """The root answers a forwarded search ahead of FastAPI (``SearchFirst``, as an embedded gateway does:
    ``test_gateway_http.py``); a query string sends the same request through the gateway's app. Both answer
    alike: the rows, and every refusal (token, grants, body, table, column) with the same status and error."""
    fleet = setup.fleet
    bm25 = json.dumps({"column": "title", "query": "gamma wave", "k": 5, "projection": ["key"]}).encode()
    vector = json.dumps({"column": "emb", "vector": [0.5] * DIM, "k": 4, "projection": ["key"]}).encode()
    reader = json.dumps({"key": "00" * 32, "unrestricted": False, "grants": [["docs", "r"]]})
    writer_only = json.dumps({"key": "00" * 32, "unrestricted": False, "grants": [["docs", "w"]]})
    cases: list[tuple[str, bytes, str | None, dict[str, str]]] = [
        ("/tables/docs/search/bm25", bm25, fleet.token, {}),
        ("/tables/docs/search/vector", vector, fleet.token, {}),
        ("/tables/docs/search/bm25", bm25, fleet.token, {"x-superfile-grants": reader}),
        ("/tables/docs/search/bm25", bm25, fleet.token, {"x-superfile-grants": writer_only}),  # 403
        ("/tables/docs/search/bm25", bm25, fleet.token, {"x-superfile-grants": "{not json"}),  # 400
        ("/tables/docs/search/bm25", bm25, None, {}),  # 401
        ("/tables/docs/search/bm25", bm25, "not-the-token", {}),  # 401
        ("/tables/docs/search/bm25", bm25, API_KEY, {}),  # a gateway's key is not a root's: 401
        ("/tables/docs/search/bm25", b"not json", fleet.token, {}),  # 400
        ("/tables/docs/search/bm25", b"", fleet.token, {}),  # 422
        ("/tables/docs/search/vector", b'{"column": "emb", "vector": [NaN], "k": 3}', fleet.token, {}),  # 400
        ("/tables/docs/search/bm25", b'{"column": "title", "query": "x", "k": "5"}', fleet.token, {}),  # 422
        ("/tables/docs/search/bm25", b'{"column": "title", "query": "x", "nope": 1}', fleet.token, {}),  # 422
        ("/tables/docs/search/bm25", bm25, fleet.token, {"content-type": "text/plain"}),  # 422
        ("/tables/docs/search/bm25", b'{"column": "nope", "query": "x"}', fleet.token, {}),  # the engine's 4xx
        ("/tables/nope/search/bm25", bm25, fleet.token, {}),  # 404
        ("/tables/docs/search/nope", bm25, fleet.token, {}),  # 404, not a route
    ]
    for path, body, token, headers in cases:
        fast = _root_search(fleet, path, body, token, headers)
        app = _root_search(fleet, f"{path}?through=app", body, token, headers)
        assert fast == app, (path, body[:80], token, headers)
    statuses = [_root_search(fleet, path, body, token, headers)[0] for path, body, token, headers in cases]
    assert statuses == [200, 200, 200, 403, 400, 401, 401, 401, 400, 422, 400, 422, 422, 422, 400, 404, 404]


def test_missing_superfile(setup: Setup) -> None:
    """A superfile deleted out of band: the node says which one, as a SuperfileMissingError (not a 500 or
    InternalError), and so does the SDK through gateway and query service."""
    fleet, emb = setup.fleet, setup.emb
    manifest = emb.open_table("broken").stats()["manifest_id"]
    bm25: dict[str, Any] = {"column": "title", "terms": ["gamma"], "k": 5, "mode": "any", "num_docs": 10}
    bm25 |= {"total_tokens": 50, "df": [1]}
    # (a count without a condition is the manifest's: no superfile is read, nothing to miss)
    ops: list[tuple[str, dict[str, Any]]] = [
        ("count", {"where": "key > 3"}),
        ("bm25", bm25),
        ("scan", {"columns": ["key"]}),
    ]
    for op, args in ops:
        body = {"table": "broken", "manifest": manifest, "superfiles": [setup.missing], "op": op, "args": args}
        for node in fleet.cache:
            status, answer = _leaf(node, body, fleet.token)
            assert status == SuperfileMissingError.http_status, (op, status, answer)  # typed, not a 500
            assert answer["error"]["type"] == "SuperfileMissingError", (op, answer)
            assert setup.missing in answer["error"]["message"]
    assert fleet.gateway is not None
    once = superfile.connect(fleet.gateway.url, api_key=API_KEY, max_retries=0)  # a 503 is final here: no backoff
    reads: list[tuple[str, Callable[[Any, Any], Any]]] = [
        ("count", lambda db, t: t.count_rows("key > 3")),
        ("scan", lambda db, t: t.to_arrow()),
        ("bm25", lambda db, t: READS["bm25 any"](t)),
        ("vector", lambda db, t: READS["vector"](t)),
        ("sql", lambda db, t: db.sql("SELECT count(*) FROM broken WHERE key > 3")),
    ]
    for what, read in reads:
        for db in (once, emb):  # through gateway, query service and cache nodes; embedded, the reference
            with pytest.raises(SuperfileMissingError) as raised:
                read(db, db.open_table("broken"))
            assert setup.missing in str(raised.value), (what, db, raised.value)
    assert once.open_table("docs").count_rows("key > 3") > 0  # the other tables are untouched
    once.close()


def test_a_commit_s_statistics_are_gathered_before_the_next_search(setup: Setup) -> None:
    """On each commit it sees, the query service gathers the BM25 statistics of the terms searched lately for
    the new version, from the new superfile's owner only: the next search of them runs without that round,
    and still answers as embedded."""
    fleet, emb = setup.fleet, setup.emb
    stream = emb.create_table(
        "stream", DOCS_SCHEMA, fts_columns=["title"], vector_columns={"emb": DIM}, max_rows_per_superfile=100
    )
    stream.append(_docs(2000, 2300))
    remote = setup.sdk.open_table("stream")

    def search(t: Any) -> pa.Table:
        return t.bm25_search("title", "gamma shock vortex", k=25, projection=["key"])

    def stats_calls() -> float:
        return _query_counter(fleet, 'superfile_query_leaf_duration_seconds_count{op="bm25_stats"}')

    _same(search(stream), search(remote), "the first version")  # its terms are now the ones searched lately
    before = stats_calls()
    stream.append(_docs(2300, 2400))  # one more superfile
    wait_until(lambda: stats_calls() > before, 30, "the query service to gather the new version's statistics")
    # a hedged call's loser may still be running: wait until the count holds for half a second
    seen = [stats_calls()]

    def settled() -> bool:
        time.sleep(0.5)
        seen.append(stats_calls())
        return seen[-1] == seen[-2]

    wait_until(settled, 30, "the statistics calls to settle")
    warmed = seen[-1]
    _same(search(stream), search(remote), "the version after the commit")
    assert stats_calls() == warmed, "the search asked the leaves for statistics the commit's warm-up gathered"


def test_cache_node_killed_mid_reads(setup: Setup) -> None:
    """SIGKILL one of three cache nodes while four clients read: no read fails or differs; restarted on its
    port and cache directory, the node rejoins and answers from the copies it kept."""
    fleet, emb = setup.fleet, setup.emb
    local = emb.open_table("docs")
    reads = ["bm25 any", "prefix", "token_match or", "vector where", "hybrid", "scan"]
    expected = {what: READS[what](local) for what in reads}
    expected_count = local.count_rows("tag = 'red fox'")
    paths = _live_paths(emb, "docs")
    victim_index = 1
    victim, victim_dir = fleet.cache[victim_index], fleet.cache_dirs[victim_index]
    owned = set(assign(paths, [n.url for n in fleet.cache])[victim.url])
    assert owned and _held(victim_dir, paths) >= owned  # warmed by the first test

    done = [0]
    failures: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + 120

    def client(i: int) -> None:
        # no retries in the SDK: a request the fleet failed (a 503 the SDK would repeat) counts as failed
        conn = superfile.connect(fleet.gateway.url, api_key=API_KEY, max_retries=0)  # type: ignore[union-attr]
        try:
            table = conn.open_table("docs")
            for n in range(10_000):
                if stop.is_set() or time.monotonic() > deadline:
                    return
                what = reads[(n + i) % len(reads)]
                try:
                    _same(expected[what], READS[what](table), what)
                    if n % 3 == 0:
                        assert table.count_rows("tag = 'red fox'") == expected_count
                except Exception as e:  # every failure is counted, none stops the others
                    with lock:
                        failures.append(f"client {i} read {n} ({what}): {type(e).__name__}: {e}")
                with lock:
                    done[0] += 1
        finally:
            conn.close()

    others = [n for n in fleet.cache if n is not victim]
    downloads = {n.url: fleet.stats(n)["downloads"] for n in others}
    placed = next(m for m in fleet.cluster() if m["url"] == victim.url)["superfiles"]
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: done[0] >= 12, 60, "the clients to get going")
        victim.proc.kill()
        victim.proc.wait(timeout=10)
        killed_at = done[0]
        wait_until(lambda: done[0] >= killed_at + 60 or failures, 90, "60 reads after the SIGKILL")
        assert fleet.query is not None
        wait_until(
            lambda: not next(m for m in fleet.cluster() if m["url"] == victim.url)["healthy"],
            10,
            "the query service to see the node down",
        )
        more = done[0]
        wait_until(lambda: done[0] >= more + 12 or failures, 60, "reads with the node known down")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not failures, f"{len(failures)} of {done[0]} reads failed:\n" + "\n".join(failures[:10]) + fleet.output()
    # the victim's share waited for it: the others read it transiently and downloaded nothing
    assert {n.url: fleet.stats(n)["downloads"] for n in others} == downloads
    assert next(m for m in fleet.cluster() if m["url"] == victim.url)["superfiles"] == placed

    held = {p: _copies(victim_dir)[_copy_name(p)] for p in owned}
    back = fleet.start_node(cache_dir=victim_dir, port=victim.port)
    assert back.url == victim.url and fleet.cache[victim_index] is back
    wait_until(
        lambda: next(m for m in fleet.cluster() if m["url"] == back.url)["healthy"],
        30,
        "the query service to see the node healthy again",
    )
    table = setup.sdk.open_table("docs")
    for what in reads:
        _same(expected[what], READS[what](table), f"{what} after the restart")
    # its calls answered from its copies (one the reads above gave up on may still be opening them)
    wait_until(lambda: fleet.stats(back)["hits"] > 0, 30, "the restarted node to answer from its copies")
    stats = fleet.stats(back)
    now = {p: _copies(victim_dir).get(_copy_name(p)) for p in owned}
    assert now == held, "the restarted node downloaded again a superfile it held"
    assert stats["downloads"] <= len(paths) - len(owned), stats  # only what it never had, if anything


def test_the_gateway_reads_on_after_the_query_service_restarts(setup: Setup) -> None:
    """The gateway keeps its connections to the query service. SIGKILL that service and start it again on its
    port: the next read, with no retry in the SDK, goes through on a new connection, not on a kept one the
    dead process left behind."""
    fleet = setup.fleet
    assert fleet.query is not None
    conn = superfile.connect(fleet.gateway.url, api_key=API_KEY, max_retries=0)  # type: ignore[union-attr]
    try:
        table = conn.open_table("docs")
        expected = READS["bm25 any"](setup.emb.open_table("docs"))
        for _ in range(3):  # the gateway now holds a kept connection to the query service
            _same(expected, READS["bm25 any"](table), "before the restart")
        old = fleet.query
        old.proc.kill()
        old.proc.wait(timeout=10)
        fleet.query = start_query(fleet.uri, [n.url for n in fleet.cache], fleet.token, env=fleet.env, port=old.port)
        _same(expected, READS["bm25 any"](table), "the first read after the restart")
    finally:
        conn.close()
