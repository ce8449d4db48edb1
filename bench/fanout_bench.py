"""Scale-out reads: a gateway forwarding to a query root over 3 cache nodes, beside the embedded gateway,
on the same S3 table (moto), in the same run.

    .venv/bin/python bench/fanout_bench.py                  # 1M rows, 16 superfiles
    .venv/bin/python bench/fanout_bench.py --rows 200000    # a quick check (still 16 superfiles)

The table (``--rows`` real rows repeated, text and 384-d vectors, ``--superfiles`` of them) is built once on
file:// by ``search_bench.py``'s builder into its cache (``/tmp/sfbench-search`` for 1M rows, keyed by
rows, superfile size and the data's version; another size gets its own directory), then copied object by
object into a bucket on a local moto server. Two read paths over that one S3 table:

- **embedded**: ``python -m superfile_gateway`` alone, reads run in its process over its own disk cache;
- **fan-out**: another gateway with ``SUPERFILE_QUERY_URL`` forwarding every read to ``superfile-query``,
  which plans and merges, over 3 ``superfile-cache`` nodes that each hold the superfiles they own.

The cache nodes' ports are picked so that rendezvous hashing splits the 16 superfiles 6/5/5 (random ports
give a busiest node of 7 or more in most draws and 8+ in ~38%: the spread is saved beside the results).
Both gateways run with maintenance off (the benchmark is the only writer). The client is the SDK
(``superfile.connect(url, api_key=...)``); queries are the 318 real Vaswani + Cranfield query texts and
embeddings, top-10, ``projection=["_id", "score"]``. Measured, in this order:

1. **latency**: ``--rounds`` passes over every query from 1 client thread, the two paths alternating query
   by query (the first one of a pair alternates too); p50/p99 per path and the p50 of the per-query
   difference (fan-out minus embedded: the target is <= 3 ms). The answers of the two paths are compared
   (the ``_id`` lists). Each response's ``Server-Timing`` (engine time at the embedded gateway, at the query
   root for fan-out) and the mean leaf call durations from the root's and the nodes' ``/metrics`` say where
   the time goes.
2. **throughput**: queries/s at ``--threads`` client threads, each path on its own (alternating pass by
   pass, ``--passes`` each), and the CPU seconds of every process (``/proc/<pid>/stat`` utime + stime: both
   gateways, the query root, each cache node, moto, this client) per query over each pass.
3. **calibration**: leaf requests sent straight to one cache node (vector search over 1 superfile, then
   over all it owns) to split a node's CPU per leaf request into a fixed part and a per-superfile part.
   With the per-process CPU figures this gives the fleet projection: with N nodes every query visits every
   node (up to the number of superfiles), so a node's CPU per query is ``fixed + work / N``.
4. **first query after a commit**: append ``--commit-rows`` rows (one new superfile) from this process,
   then time the first query through each path ("immediately"); append again, wait until the nodes'
   ``/v1/stats`` (the figures ``/v1/cluster`` shows) count the owner's download of it (warm on commit),
   then time the first query ("after warm"; the embedded gateway has nothing that warms it, so its first
   query still downloads). The second query of the same kind is timed as the warm reference.
5. **restarts**: kill one cache node (SIGKILL), restart it on the same port with the same cache directory,
   wait until the root sees it healthy and the fleet is quiet, time the first query; then the same for the
   embedded gateway (SIGTERM, restart with its cache directory).

Saves bench/results/fanout.json (with ``--no-hedge``, the query root's hedging turned off in its process:
bench/results/fanout_nohedge.json); the summaries of earlier runs of the same size are kept in it.
``--reproject`` redoes the projection and summary of the saved results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent))
import superfile
from common import RESULTS, median, percentile, repeated, save
from search_bench import ensure_builds, paths, queries, query_vectors, timed_pass
from superfile.search.leaf import LeafRequest
from superfile.search.placement import assign
from superfile_suite import Server, free_port, start_cache_node, start_moto, start_query

K = 10
PROJECTION = ["_id", "score"]
KINDS = ("bm25", "vector")
PHASES = ("latency", "throughput", "calibration", "commits", "restarts")
TABLE = "bench"
NODES = 3
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
_TICK = os.sysconf("SC_CLK_TCK")


# -- processes --------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def start_process(name: str, argv: list[str], env: dict[str, str], log_path: str, port: int) -> Server:
    """``argv`` serving on ``port``; returns once ``/healthz`` answers."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    http = urllib3.PoolManager(retries=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if http.request("GET", f"{url}/healthz", timeout=1.0).status == 200:
                return Server(name, proc, port, url)
        except urllib3.exceptions.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not start; see {log_path}")


def start_gateway(
    uri: str,
    key: str,
    cache_dir: str,
    log_path: str,
    *,
    query_url: str | None = None,
    token: str | None = None,
    port: int | None = None,
) -> Server:
    """``python -m superfile_gateway`` on ``uri`` (embedded, or forwarding reads to ``query_url``)."""
    port = port or free_port()
    env = {
        **S3_ENV,
        "SUPERFILE_STORAGE": uri,
        "SUPERFILE_API_KEYS": f"{key}:*:rw",
        "SUPERFILE_CACHE_DIR": cache_dir,
        "SUPERFILE_MAINTENANCE": "0",
    }
    if query_url:
        env |= {"SUPERFILE_QUERY_URL": query_url, "SUPERFILE_INTERNAL_TOKEN": token or ""}
    argv = [sys.executable, "-m", "superfile_gateway", "--port", str(port)]
    return start_process("gateway", argv, env, log_path, port)


# ``superfile-query serve`` with hedging off (``--no-hedge``): the fleet's default, set before it is built
_NO_HEDGE = (
    "import sys, superfile.search.fleet as f; f.Fleet.__init__.__kwdefaults__['hedge'] = False; "
    "from superfile_query.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


def start_query_root(uri: str, nodes: list[str], token: str, log_path: str, *, hedge: bool) -> Server:
    if hedge:
        return start_query(uri, nodes, token, env=S3_ENV, log_path=log_path)
    port = free_port()
    argv = [
        sys.executable,
        "-c",
        _NO_HEDGE,
        "serve",
        f"--uri={uri}",
        f"--port={port}",
        f"--cache-nodes={','.join(nodes)}",
    ]
    return start_process("query", argv, {**S3_ENV, "SUPERFILE_INTERNAL_TOKEN": token}, log_path, port)


def balanced_ports(superfiles: list[str], nodes: int) -> tuple[list[int], dict[str, Any]]:
    """Free ports for ``nodes`` cache nodes whose URLs split ``superfiles`` as evenly as rendezvous hashing
    can (shares differing by at most one), and how uneven the split is for random ports (the spread a
    deployment gets: the cache tier is as fast as its busiest node)."""
    rng = np.random.default_rng(0)
    biggest = []
    for _ in range(2000):
        ports = rng.choice(np.arange(20000, 60000), nodes, replace=False)
        owned = assign(superfiles, [f"http://127.0.0.1:{p}" for p in ports])
        biggest.append(max(len(v) for v in owned.values()))
    smallest_max = math.ceil(len(superfiles) / nodes)
    spread = {
        "superfiles": len(superfiles),
        "nodes": nodes,
        "busiest_node_share_p50": float(np.median(biggest)),
        "busiest_node_share_p90": float(np.percentile(biggest, 90)),
        "p_busiest_share_at_least_8": float(np.mean(np.asarray(biggest) >= 8)),
        "even_share": smallest_max,
    }
    for _ in range(1000):
        ports = [free_port() for _ in range(nodes)]
        if len(set(ports)) < nodes:
            continue
        shares = [len(v) for v in assign(superfiles, [f"http://127.0.0.1:{p}" for p in ports]).values()]
        if max(shares) - min(shares) <= 1:
            return ports, spread
    raise RuntimeError("no free ports split the superfiles evenly")


class Internal:
    """GETs and POSTs with the internal token (``/v1/cluster``, ``/v1/stats``, ``/metrics``, ``/v1/leaf``)."""

    def __init__(self, token: str) -> None:
        self.http = urllib3.PoolManager(
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"}, retries=False
        )

    def get(self, url: str) -> Any:
        r = self.http.request("GET", url, timeout=10.0)
        if r.status != 200:
            raise RuntimeError(f"GET {url}: {r.status} {r.data[:300]!r}")
        return json.loads(r.data) if r.headers.get("content-type", "").startswith("application/json") else r.data

    def members(self, query: Server) -> list[dict[str, Any]]:
        return list(self.get(f"{query.url}/v1/cluster")["members"])


def metric_sums(text: bytes, name: str) -> dict[str, tuple[float, float]]:
    """A Prometheus histogram's (sum, count) by ``op`` label."""
    out: dict[str, list[float]] = {}
    for line in text.decode().splitlines():
        m = re.match(rf"{name}_(sum|count)\{{([^}}]*)\}} ([0-9.e+-]+)", line)
        if not m:
            continue
        op = re.search(r'op="([^"]*)"', m.group(2))
        cell = out.setdefault(op.group(1) if op else "", [0.0, 0.0])
        cell[0 if m.group(1) == "sum" else 1] += float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


# -- the table on S3 -------------------------------------------------------------------------------


def upload(local_root: Path, uri: str) -> dict[str, Any]:
    """Every object of the file:// table root under the S3 root, as the engine would read them."""
    from superfile.io import from_uri
    from superfile.io.local import LocalStorage

    src = LocalStorage(str(local_root), create=False)
    dst = from_uri(uri)
    infos = list(src.list(""))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda info: dst.write(info.path, src.read(info.path)), infos))
    return {"objects": len(infos), "bytes": sum(i.size for i in infos), "seconds": time.perf_counter() - t0}


# -- the two read paths as the client sees them -------------------------------------------------------


class ReadPath:
    """One gateway through the SDK, noting each response's engine time (``Server-Timing``)."""

    def __init__(self, name: str, url: str, key: str, texts: list[str], vectors: np.ndarray) -> None:
        self.name = name
        self.conn = superfile.connect(url, api_key=key)
        self.table = self.conn.open_table(TABLE)
        self.texts = texts
        self.vectors = vectors
        self.engine_ms: list[float] = []
        self._note = threading.local()
        request = self.conn.client.request

        def took(*args: Any, **kwargs: Any) -> Any:
            response = request(*args, **kwargs)
            timing = response.headers.get("server-timing", "")
            if timing.startswith("engine;dur="):
                self._note.ms = float(timing.split("=", 1)[1])
            return response

        self.conn.client.request = took  # type: ignore[method-assign]

    def query(self, kind: str, i: int) -> pa.Table:
        if kind == "bm25":
            return self.table.bm25_search("text", self.texts[i], k=K, projection=PROJECTION)
        return self.table.vector_search("embedding", self.vectors[i], k=K, projection=PROJECTION)

    def timed(self, kind: str, i: int) -> tuple[float, float | None, pa.Table]:
        """Latency (ms), the engine time the gateway reported (ms) and the answer."""
        self._note.ms = None
        t0 = time.perf_counter()
        out = self.query(kind, i)
        return (time.perf_counter() - t0) * 1e3, self._note.ms, out


# -- the run -------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, work: str, stack: ExitStack) -> None:
        self.args = args
        self.work = work
        self.stack = stack
        self.key = secrets.token_urlsafe(18)
        self.token = secrets.token_hex(16)
        self.internal = Internal(self.token)
        q = queries()
        self.texts = q["text"].to_pylist()
        self.vectors = query_vectors(q)
        self.n = len(self.texts)
        self.nodes: list[Server] = []
        self.node_dirs: list[str] = []
        self.log = lambda name: str(Path(work, f"{name}.log"))

    # -- setup -----------------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        a = self.args
        self.moto = start_moto(log_path=self.log("moto"))
        self.stack.callback(self.moto.stop)
        os.environ.update(S3_ENV)
        import boto3

        boto3.client("s3", endpoint_url=self.moto.url, region_name="us-east-1").create_bucket(Bucket="bench")
        self.uri = f"s3://bench/sf?endpoint_url={quote(self.moto.url, safe='')}"
        print("copying the table into moto ...", flush=True)
        copied = upload(paths(Path(a.cache))["superfile"], self.uri)
        print(
            f"  {copied['objects']} objects, {copied['bytes'] / 2**20:.0f} MiB in {copied['seconds']:.1f} s", flush=True
        )
        built = superfile.connect(f"file://{paths(Path(a.cache))['superfile']}")
        ports, self.placement_spread = balanced_ports(
            [e.path for e in built.open_table(TABLE)._snapshot.entries()], NODES
        )
        for i, port in enumerate(ports):
            d = str(Path(self.work, f"cache-node-{i}"))
            self.node_dirs.append(d)
            self.nodes.append(
                start_cache_node(self.uri, d, self.token, env=S3_ENV, port=port, log_path=self.log(f"cache-{i}"))
            )
        self.stack.callback(lambda: [n.stop() for n in self.nodes])
        query_started = time.perf_counter()
        self.query_root = start_query_root(
            self.uri, [n.url for n in self.nodes], self.token, self.log("query"), hedge=not a.no_hedge
        )
        self.stack.callback(self.query_root.stop)
        self.embedded_dir = str(Path(self.work, "gateway-embedded-cache"))
        self.gw_embedded = start_gateway(self.uri, self.key, self.embedded_dir, self.log("gateway-embedded"))
        self.stack.callback(lambda: self.gw_embedded.stop())
        self.gw_fanout = start_gateway(
            self.uri,
            self.key,
            str(Path(self.work, "gateway-fanout-cache")),
            self.log("gateway-fanout"),
            query_url=self.query_root.url,
            token=self.token,
        )
        self.stack.callback(self.gw_fanout.stop)
        self.writer = superfile.connect(self.uri, cache_budget_bytes=0).open_table(TABLE)
        snap = self.writer.last_snapshot
        self.superfiles = len(list(snap.entries()))
        self.wait_warm(lambda m: sum(x["superfiles"] for x in m) == self.superfiles)
        warm_s = time.perf_counter() - query_started
        print(f"  cache nodes warmed their shares {warm_s:.1f} s after the query root started", flush=True)
        self.paths = {
            "embedded": ReadPath("embedded", self.gw_embedded.url, self.key, self.texts, self.vectors),
            "fanout": ReadPath("fanout", self.gw_fanout.url, self.key, self.texts, self.vectors),
        }
        t0 = time.perf_counter()
        self.paths["embedded"].query("bm25", 0)
        first_embedded = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.paths["fanout"].query("bm25", 0)
        first_fanout = time.perf_counter() - t0
        for p in self.paths.values():  # warm-up: every query of each kind once
            for kind in KINDS:
                for i in range(self.n):
                    p.query(kind, i)
        members = self.internal.members(self.query_root)
        return {
            "copy_to_s3": copied,
            "superfiles": self.superfiles,
            "cache_nodes_warm_s": warm_s,
            "first_query_cold_s": {"embedded (downloads every superfile)": first_embedded, "fanout": first_fanout},
            "shares": {m["url"]: m["superfiles"] for m in members},
            "placement_spread_for_random_ports": self.placement_spread,
        }

    def pids(self) -> dict[str, int]:
        out = {
            "gateway (embedded)": self.gw_embedded.proc.pid,
            "gateway (fan-out)": self.gw_fanout.proc.pid,
            "query root": self.query_root.proc.pid,
        }
        out |= {f"cache node {i}": n.proc.pid for i, n in enumerate(self.nodes)}
        return out | {"moto (S3)": self.moto.proc.pid, "client": os.getpid()}

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids().items()}

    def wait_warm(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 600.0) -> list[dict[str, Any]]:
        """Poll ``/v1/cluster`` until ``done(members)`` and every member has downloaded what it owns."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            members = self.internal.members(self.query_root)
            if done(members) and all(m["healthy"] for m in members):
                stats = [self.internal.get(f"{m['url']}/v1/stats") for m in members]
                if all(s["superfiles"] >= m["superfiles"] for s, m in zip(stats, members, strict=True)):
                    return members
            time.sleep(0.02)
        raise RuntimeError("the cache nodes did not warm in time")

    def counters(self) -> dict[str, Any]:
        """The root's hedges, retries and failed leaf calls so far, and each node's copies and downloads."""
        text = self.internal.get(f"{self.query_root.url}/metrics").decode()
        out: dict[str, Any] = {}
        for m in re.finditer(
            r"^superfile_query_leaf_(hedges|retries|failures)(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M
        ):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        stats = self.node_stats()
        out["node copies"] = [s["superfiles"] for s in stats]
        out["node downloads"] = [s["downloads"] for s in stats]
        return out

    def node_stats(self) -> list[dict[str, Any]]:
        return [self.internal.get(f"{n.url}/v1/stats") for n in self.nodes]

    @contextmanager
    def profiled(self, out_dir: str | None) -> Iterator[None]:
        """With ``out_dir``: py-spy records the query root, the fan-out gateway, cache node 0 and the embedded
        gateway (the thread holding the GIL) while the block runs, one speedscope file each."""
        if out_dir is None:
            yield
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        spy = str(Path(sys.executable).with_name("py-spy"))
        procs = []
        servers = {
            "query-root": self.query_root,
            "gateway-fanout": self.gw_fanout,
            "cache-node-0": self.nodes[0],
            "gateway-embedded": self.gw_embedded,
        }
        for name, server in servers.items():
            argv = [spy, "record", "--pid", str(server.proc.pid), "--rate", "100", "--gil", "--format", "speedscope",
                    "--output", str(Path(out_dir, f"{name}.speedscope.json")), "--nonblocking"]  # fmt: skip
            with open(Path(out_dir, f"{name}.py-spy.log"), "wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        try:
            yield
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                proc.wait(timeout=60)

    # -- 1. latency, interleaved -------------------------------------------------------------------
    def latency(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind in KINDS:
            lat: dict[str, list[float]] = {"embedded": [], "fanout": []}
            engine: dict[str, list[float]] = {"embedded": [], "fanout": []}
            diff: list[float] = []
            mismatched = 0
            metrics_before = self.leaf_metrics()
            hedges0 = self.counters().get("hedges", 0.0)
            cpu0 = self.cpu()
            for r in range(self.args.rounds):
                for i in range(self.n):
                    order = ("embedded", "fanout") if (i + r) % 2 == 0 else ("fanout", "embedded")
                    got = {}
                    for name in order:
                        ms, eng, table = self.paths[name].timed(kind, i)
                        lat[name].append(ms)
                        if eng is not None:
                            engine[name].append(eng)
                        got[name] = table
                    diff.append(lat["fanout"][-1] - lat["embedded"][-1])
                    if got["fanout"].column("_id").to_pylist() != got["embedded"].column("_id").to_pylist():
                        mismatched += 1
            cpu1 = self.cpu()
            leaf = self.leaf_metrics(metrics_before)
            hedges = self.counters().get("hedges", 0.0) - hedges0
            queries = self.args.rounds * self.n
            out[kind] = {
                "queries": queries,
                **{
                    name: {
                        "p50_ms": percentile(v, 50),
                        "p99_ms": percentile(v, 99),
                        "mean_ms": float(np.mean(v)),
                        "engine_p50_ms": percentile(engine[name], 50) if engine[name] else None,
                        "added_to_engine_p50_ms": percentile([a - b for a, b in zip(v, engine[name], strict=True)], 50)
                        if len(engine[name]) == len(v)
                        else None,
                    }
                    for name, v in lat.items()
                },
                "fanout_minus_embedded_ms": {"p50": percentile(diff, 50), "p99": percentile(diff, 99)},
                "p50_ratio": percentile(lat["fanout"], 50) / percentile(lat["embedded"], 50),
                "answers_differing": mismatched,
                "leaf_calls": leaf,
                "hedged_leaf_calls": hedges,
                "cpu_ms_per_query": {k: (cpu1[k] - cpu0[k]) * 1e3 / queries for k in cpu0},
            }
            print(kind, json.dumps({k: v for k, v in out[kind].items() if k != "cpu_ms_per_query"}), flush=True)
        return out

    def leaf_metrics(self, before: dict[str, Any] | None = None) -> dict[str, Any]:
        """Leaf calls as the root saw them (HTTP included) and as the nodes ran them: mean ms by op."""
        root = metric_sums(self.internal.get(f"{self.query_root.url}/metrics"), "superfile_query_leaf_duration_seconds")
        nodes: dict[str, tuple[float, float]] = {}
        for n in self.nodes:
            for op, (s, c) in metric_sums(
                self.internal.get(f"{n.url}/metrics"), "superfile_cache_leaf_duration_seconds"
            ).items():
                old = nodes.get(op, (0.0, 0.0))
                nodes[op] = (old[0] + s, old[1] + c)
        now = {"root": root, "nodes": nodes}
        if before is None:
            return now
        out: dict[str, Any] = {}
        for side in ("root", "nodes"):
            for op, (s, c) in now[side].items():
                s0, c0 = before[side].get(op, (0.0, 0.0))
                if c > c0:
                    out.setdefault(side, {})[op] = {"calls": c - c0, "mean_ms": (s - s0) / (c - c0) * 1e3}
        return out

    # -- 2. throughput and CPU per query -------------------------------------------------------------
    def throughput(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind in KINDS:
            for th in self.args.threads:
                runs: dict[str, list[dict[str, Any]]] = {"embedded": [], "fanout": []}
                for rep in range(self.args.passes):
                    for name in ("embedded", "fanout") if rep % 2 == 0 else ("fanout", "embedded"):
                        p = self.paths[name]
                        hedges0 = self.counters().get("hedges", 0.0)
                        cpu0 = self.cpu()
                        lat, wall, _ = timed_pass(lambda i, p=p, kind=kind: p.query(kind, i), self.n, th)
                        cpu1 = self.cpu()
                        runs[name].append(
                            {
                                "qps": self.n / wall,
                                "p50_ms": percentile(lat, 50) * 1e3,
                                "p99_ms": percentile(lat, 99) * 1e3,
                                "cpu_ms_per_query": {k: (cpu1[k] - cpu0[k]) * 1e3 / self.n for k in cpu0},
                                "wall_s": wall,
                                "hedged_leaf_calls": self.counters().get("hedges", 0.0) - hedges0,
                            }
                        )
                cell = {}
                for name, rs in runs.items():
                    cell[name] = {
                        "qps": median([r["qps"] for r in rs]),
                        "p50_ms": median([r["p50_ms"] for r in rs]),
                        "p99_ms": median([r["p99_ms"] for r in rs]),
                        "cpu_ms_per_query": {
                            k: median([r["cpu_ms_per_query"][k] for r in rs]) for k in rs[0]["cpu_ms_per_query"]
                        },
                        "qps_runs": [r["qps"] for r in rs],
                        "hedged_leaf_calls_per_query": median([r["hedged_leaf_calls"] for r in rs]) / self.n,
                    }
                out.setdefault(kind, {})[str(th)] = cell
                print(kind, th, "threads", {n: round(c["qps"], 1) for n, c in cell.items()}, flush=True)
        return out

    def idle_cpu(self, seconds: float = 5.0) -> dict[str, float]:
        """CPU ms per second each process spends with no query running (health checks, warm-on-commit polls)."""
        cpu0 = self.cpu()
        time.sleep(seconds)
        cpu1 = self.cpu()
        return {k: (cpu1[k] - cpu0[k]) * 1e3 / seconds for k in cpu0}

    # -- 3. calibration: a node's CPU per leaf request ------------------------------------------------
    def calibrate(self, requests: int = 150) -> dict[str, Any]:
        snap = superfile.connect(self.uri, cache_budget_bytes=0).open_table(TABLE)._snapshot
        urls = [n.url for n in self.nodes]
        owned = assign([e.path for e in snap.entries()], urls)
        node = max(range(NODES), key=lambda i: len(owned[urls[i]]))
        share = owned[urls[node]]
        q = self.vectors[0] / np.linalg.norm(self.vectors[0])
        args = {"column": "embedding", "vector": q.tolist(), "k": K, "nprobe": None, "rerank": None,
                "filter": None, "where": None, "projection": []}  # fmt: skip
        out: dict[str, Any] = {"node": node, "share": len(share)}
        pid = self.nodes[node].proc.pid
        for label, superfiles in (("one superfile", share[:1]), ("whole share", share)):
            body = json.dumps(LeafRequest(TABLE, snap.path, tuple(superfiles), "vector", args).to_json()).encode()
            for _ in range(10):  # warm
                self.internal.http.request("POST", f"{urls[node]}/v1/leaf", body=body)
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            for _ in range(requests):
                r = self.internal.http.request("POST", f"{urls[node]}/v1/leaf", body=body)
                assert r.status == 200, r.data[:300]
            out[label] = {
                "superfiles": len(superfiles),
                "cpu_ms_per_request": (cpu_seconds(pid) - c0) * 1e3 / requests,
                "ms_per_request": (time.perf_counter() - t0) * 1e3 / requests,
            }
        one, whole = out["one superfile"]["cpu_ms_per_request"], out["whole share"]["cpu_ms_per_request"]
        s = len(share)
        out["per_superfile_cpu_ms"] = (whole - one) / (s - 1) if s > 1 else None
        out["fixed_cpu_ms_per_request"] = one - out["per_superfile_cpu_ms"] if s > 1 else one
        print("calibration", json.dumps(out), flush=True)
        return out

    # -- 4. first query after a commit ---------------------------------------------------------------
    def commit(self, r: int) -> float:
        """Append ``--commit-rows`` rows (one new superfile); the seconds the commit took."""
        rows = self.args.commit_rows
        batch = next(repeated(rows, rows, seed=1000 + r))
        first = 10_000_000 + r * rows
        batch = batch.set_column(0, "doc_id", pa.array(np.arange(first, first + rows), pa.int64()))
        t0 = time.perf_counter()
        self.writer.append(batch)
        return time.perf_counter() - t0

    def downloads(self) -> int:
        return sum(s["downloads"] for s in self.node_stats())

    def after_commit(self) -> list[dict[str, Any]]:
        rounds = []
        for r in range(self.args.commit_rounds):
            kind = KINDS[r % 2]
            i = (7 * r + 3) % self.n
            order = ("embedded", "fanout") if r % 4 < 2 else ("fanout", "embedded")
            row: dict[str, Any] = {"round": r, "kind": kind, "query": i, "order": list(order)}
            # immediately: the first query right after the commit returns
            before = self.downloads()
            row["commit_s"] = self.commit(2 * r)
            for name in order:
                row[f"{name} immediately ms"] = self.paths[name].timed(kind, i)[0]
            row["node downloads (immediately)"] = self.downloads() - before
            for name in order:
                row[f"{name} second query ms"] = self.paths[name].timed(kind, i)[0]
            # after warm: a second commit, then wait for the owner's download before the first query
            before = self.downloads()
            self.commit(2 * r + 1)
            t0 = time.perf_counter()
            while self.downloads() < before + 1:
                if time.perf_counter() - t0 > 60:
                    raise RuntimeError("the new superfile was not warmed within 60 s")
                time.sleep(0.01)
            row["commit_to_warm_s"] = time.perf_counter() - t0
            for name in order:
                row[f"{name} after warm ms"] = self.paths[name].timed(kind, i)[0]
            row["node downloads (after warm, by the query)"] = self.downloads() - before - 1
            rounds.append(row)
            print(
                "commit",
                json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
        return rounds

    # -- 5. restarts -------------------------------------------------------------------------------
    def quiet(self, timeout: float = 600.0) -> float:
        """Wait until the root sees every node healthy and no node's downloads move for 1 s; seconds waited."""
        t0 = time.perf_counter()
        last = None
        stable_since = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            members = self.internal.members(self.query_root)
            now = [s["downloads"] for s in self.node_stats()]
            if now != last:
                last, stable_since = now, time.perf_counter()
            if all(m["healthy"] for m in members) and time.perf_counter() - stable_since >= 1.0:
                return time.perf_counter() - t0
            time.sleep(0.1)
        raise RuntimeError("the fleet did not settle")

    def restarts(self) -> dict[str, Any]:
        node_rounds = []
        for r in range(self.args.restart_rounds):
            kind = KINDS[r % 2]
            i = (11 * r + 5) % self.n
            j = r % NODES
            self.quiet()
            before = self.node_stats()
            old = self.nodes[j]
            t0 = time.perf_counter()
            old.proc.send_signal(signal.SIGKILL)
            old.proc.wait()
            self.nodes[j] = start_cache_node(
                self.uri, self.node_dirs[j], self.token, env=S3_ENV, port=old.port, log_path=self.log(f"cache-{j}")
            )
            up_s = time.perf_counter() - t0
            settle_s = self.quiet()
            ms = self.paths["fanout"].timed(kind, i)[0]
            second = self.paths["fanout"].timed(kind, i)[0]
            after = self.node_stats()
            row = {
                "round": r,
                "node": j,
                "kind": kind,
                "kill_to_healthz_s": up_s,
                "then_until_root_sees_it_and_quiet_s": settle_s,
                "first_query_ms": ms,
                "second_query_ms": second,
                "restarted_node_downloads": after[j]["downloads"],
                "other_nodes_downloads_meanwhile": sum(
                    a["downloads"] - b["downloads"]
                    for k, (a, b) in enumerate(zip(after, before, strict=True))
                    if k != j
                ),
            }
            node_rounds.append(row)
            print(
                "restart",
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
        embedded_rounds = []
        for r in range(self.args.restart_rounds):
            kind = KINDS[r % 2]
            i = (11 * r + 5) % self.n
            old = self.gw_embedded
            t0 = time.perf_counter()
            old.stop()
            self.gw_embedded = start_gateway(
                self.uri, self.key, self.embedded_dir, self.log("gateway-embedded"), port=old.port
            )
            up_s = time.perf_counter() - t0
            p = self.paths["embedded"] = ReadPath("embedded", self.gw_embedded.url, self.key, self.texts, self.vectors)
            ms = p.timed(kind, i)[0]
            row = {"round": r, "kind": kind, "stop_to_healthz_s": up_s, "first_query_ms": ms,
                   "second_query_ms": p.timed(kind, i)[0]}  # fmt: skip
            embedded_rounds.append(row)
            print("restart embedded", json.dumps(row), flush=True)
        return {"cache_node": node_rounds, "embedded_gateway": embedded_rounds}


# -- the fleet projection -----------------------------------------------------------------------------


def projection(cell: dict[str, Any], calib: dict[str, Any], leaf_calls_per_node: int, superfiles: int,
               cores: int) -> dict[str, Any]:  # fmt: skip
    """What a fleet would serve, from the CPU ms per query each process spent in one throughput cell (both
    paths measured on their own).

    Cache tier: a node's CPU per query is ``fixed * leaf_calls_per_node + work / width`` (``fixed`` from the
    calibration, ``work`` the rest of what the 3 nodes spent), where ``width`` = min(N, superfiles): every
    query visits every node that owns one of the table's superfiles, so the tier serves what one node
    serves, ``cores * 1000 / that``. The query root and the gateway cost the same per query whatever N is
    (the root's extra calls for more nodes are not modelled); they are given per core, and a root is one
    Python process (its interpreter lock keeps it near one core of Python work)."""
    fan, emb = cell["fanout"]["cpu_ms_per_query"], cell["embedded"]["cpu_ms_per_query"]
    nodes_ms = sum(v for k, v in fan.items() if k.startswith("cache node"))
    fixed = calib["fixed_cpu_ms_per_request"] * leaf_calls_per_node
    work = max(nodes_ms - NODES * fixed, 0.0)
    rows = []
    for n in (1, 2, 3, 4, 8, 16, 32):
        per_node = fixed + work / min(n, superfiles)
        rows.append({"nodes": n, "cache_node_cpu_ms_per_query": per_node, "cache_tier_qps": cores * 1e3 / per_node})
    root_per_core = 1e3 / fan["query root"]
    return {
        "cores_per_cache_node": cores,
        "cpu_ms_per_query": {
            "fan-out, all server processes": fan["gateway (fan-out)"] + fan["query root"] + nodes_ms,
            "fan-out: gateway": fan["gateway (fan-out)"],
            "fan-out: query root": fan["query root"],
            "fan-out: cache nodes together": nodes_ms,
            "embedded gateway": emb["gateway (embedded)"],
            "S3 (moto) per fan-out query": fan["moto (S3)"],
            "S3 (moto) per embedded query": emb["moto (S3)"],
        },
        "fixed_cpu_ms_per_query_per_node": fixed,
        "superfile_work_cpu_ms_per_query": work,
        "cache_tier": rows,
        "cache_tier_ceiling_qps": cores * 1e3 / (fixed + work / superfiles),
        "query_root_qps_per_core": root_per_core,
        "gateway_qps_per_core": 1e3 / fan["gateway (fan-out)"],
        "embedded_gateway_qps_per_core": 1e3 / emb["gateway (embedded)"],
        "fleet_qps_ceiling_one_root_process": min(root_per_core, rows[-1]["cache_tier_qps"]),
    }


def reproject(result: dict[str, Any], cores: int) -> None:
    """The fleet projection and the summary, from a run's measurements (``--reproject`` redoes them)."""
    th = str(min(int(t) for t in result["throughput"]["bm25"]))
    result["projection"] = {
        "from_client_threads": int(th),
        **{
            kind: projection(
                result["throughput"][kind][th],
                result["calibration"],
                1,  # one call per node: a BM25 search's statistics come from the root's cache in steady state
                result["setup"]["superfiles"],
                cores,
            )
            for kind in KINDS
        },
    }
    result["summary"] = summary(result)


def code_version() -> dict[str, Any]:
    """The commit, and a digest of the read path's sources as they are in the work tree (other work may
    change them during a run: it is taken at the start and at the end)."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    files = sorted(
        [
            *root.glob("libs/superfile/superfile/search/*.py"),
            *root.glob("libs/superfile/superfile/table/search.py"),
            *root.glob("services/cache/superfile_cache/*.py"),
            *root.glob("services/query/superfile_query/*.py"),
            *root.glob("services/gateway/superfile_gateway/*.py"),
        ]
    )
    for f in files:
        digest.update(f.read_bytes())
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"commit": head.stdout.strip(), "read_path_sources_sha256": digest.hexdigest()[:16]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--superfiles", type=int, default=16, help="the table's superfiles (rows split evenly)")
    p.add_argument("--cache", help="where the file:// build is kept (default: search_bench's for 1M rows)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved latency passes over all queries")
    p.add_argument("--passes", type=int, default=2, help="throughput passes per path and thread count")
    p.add_argument("--threads", default="1,4,8", help="client thread counts for queries/s")
    p.add_argument("--commit-rows", type=int, default=1000, help="rows per small commit")
    p.add_argument("--commit-rounds", type=int, default=6)
    p.add_argument("--restart-rounds", type=int, default=3)
    p.add_argument("--cores", type=int, default=2, help="cores per process in the fleet projection")
    p.add_argument("--no-hedge", action="store_true", help="the query root without hedging (saves fanout_nohedge.json)")
    p.add_argument("--reproject", action="store_true", help="redo the projection and summary of the saved results")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="the phases to run, comma-separated (a run of fewer saves bench/results/fanout_<phases>.json "
                        "without earlier runs' summaries)")  # fmt: skip
    p.add_argument("--py-spy", metavar="DIR",
                   help="record the query root, the fan-out gateway, cache node 0 and the embedded gateway with py-spy "
                        "during the latency phase (speedscope profiles in DIR)")  # fmt: skip
    args = p.parse_args()
    if args.reproject:
        for name in ("fanout", "fanout_nohedge"):
            path = RESULTS / f"{name}.json"
            if path.exists():
                saved = json.loads(path.read_text())
                reproject(saved, args.cores)
                print(save(name, saved))
        return
    args.threads = [int(x) for x in args.threads.split(",")]
    args.phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if unknown := set(args.phases) - set(PHASES):
        p.error(f"unknown phases {sorted(unknown)}; the phases are {', '.join(PHASES)}")
    max_rows = math.ceil(args.rows / args.superfiles)
    if args.cache is None:
        args.cache = (
            "/tmp/sfbench-search"
            if (args.rows, max_rows) == (1_000_000, 62_500)
            else f"/tmp/sfbench-search-{args.rows}"
        )
    command = " ".join([".venv/bin/python", "bench/fanout_bench.py", *map(shlex.quote, sys.argv[1:])])
    build_args = argparse.Namespace(rows=args.rows, max_rows_per_superfile=max_rows, cache=args.cache, rebuild=False,
                                    passes=1, threads="1")  # fmt: skip
    t0 = time.perf_counter()
    ensure_builds(build_args, ["bm25"], ["superfile"])
    build_s = time.perf_counter() - t0
    started = time.perf_counter()
    result: dict[str, Any] = {
        "command": command,
        "rows": args.rows,
        "max_rows_per_superfile": max_rows,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "build_or_reuse_s": build_s,
        "hedging": not args.no_hedge,
        "code_at_start": code_version(),
    }
    with tempfile.TemporaryDirectory(prefix="sffanout-") as work, ExitStack() as stack:
        b = Bench(args, work, stack)
        result["setup"] = b.start()
        result["queries"] = b.n
        counters = result["root_and_node_counters"] = {"after setup": b.counters()}
        result["idle_cpu_ms_per_s"] = b.idle_cpu()
        if "latency" in args.phases:
            with b.profiled(args.py_spy):
                result["latency"] = b.latency()
            counters["after latency"] = b.counters()
        if "throughput" in args.phases:
            result["throughput"] = b.throughput()
            counters["after throughput"] = b.counters()
        if "calibration" in args.phases:
            result["calibration"] = b.calibrate()
        if "commits" in args.phases:
            result["after_commit"] = b.after_commit()
            counters["after commits"] = b.counters()
        if "restarts" in args.phases:
            result["restarts"] = b.restarts()
            counters["after restarts (restarted nodes count from 0)"] = b.counters()
        result["cache_nodes_at_end"] = b.node_stats()
        print(json.dumps(counters), flush=True)
    result["wall_s"] = time.perf_counter() - started
    result["code_at_end"] = code_version()
    if args.phases != list(PHASES):
        result["phases"] = args.phases
        print(save(f"fanout_{'_'.join(args.phases)}", result))
        return
    reproject(result, args.cores)
    print(json.dumps(result["summary"], indent=1))
    name = "fanout_nohedge" if args.no_hedge else "fanout"
    earlier = RESULTS / f"{name}.json"
    if earlier.exists():  # keep the summaries of earlier runs of the same size (the machine is noisy)
        old = json.loads(earlier.read_text())
        if old.get("rows") == args.rows:
            keep = {k: old.get(k) for k in ("command", "load_average_at_start", "summary", "projection")}
            result["earlier_runs"] = [*old.get("earlier_runs", []), keep]
    print(save(name, result))


def summary(r: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        lat = r["latency"][kind]
        out[kind] = {
            "embedded p50/p99 ms": [lat["embedded"]["p50_ms"], lat["embedded"]["p99_ms"]],
            "fanout p50/p99 ms": [lat["fanout"]["p50_ms"], lat["fanout"]["p99_ms"]],
            "fanout - embedded p50 ms": lat["fanout_minus_embedded_ms"]["p50"],
            "qps embedded / fanout": {
                th: [c["embedded"]["qps"], c["fanout"]["qps"]] for th, c in r["throughput"][kind].items()
            },
        }
        rows = [x for x in r["after_commit"] if x["kind"] == kind]
        for name in ("embedded", "fanout"):
            for when in ("immediately", "after warm", "second query"):
                vals = [x[f"{name} {when} ms"] for x in rows]
                if vals:
                    out[kind][f"after commit: {name} {when} ms"] = median(vals)
    return out


if __name__ == "__main__":
    main()
