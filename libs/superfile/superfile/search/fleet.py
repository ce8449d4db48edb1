"""The cache nodes a query root fans out to: membership, health, placement, and the leaf calls.

Membership is a static list of node URLs or the DNS name of a headless
service (every address it resolves to is a node), re-read and health-checked
every ``check_s``. Superfiles are placed by rendezvous hashing over the healthy
nodes (``placement.py``). A leaf call that gets no answer (refused, reset,
timed out, any 5xx but a missing superfile) marks its node unhealthy and its
superfiles are read by their next node in rendezvous order; a call slower than the
observed p95 is hedged to the next node and the first answer wins (a node's first
call on a version it has not answered yet, which opens it, only past 1 s); a node that
loses three hedges in a row rests from placement for a while (its share moves
to the next nodes, as for a failed one). A node that fails or leaves keeps its
share for ``move_after_s`` (``SUPERFILE_MOVE_AFTER_S``, default 60 s, as
Elasticsearch delays reallocating a departed node's shards): meanwhile the
next nodes read its superfiles transiently, keeping no copies, so a restart
downloads nothing; only past that is its share placed, and warmed, on the
others. A read's thread writes its calls and awaits them together, with
no thread per call (``transport.py``). Every call
of one read shares one deadline. A typed error from a leaf (a bad argument, a
missing superfile) is the read's answer: it is raised as such, not retried.
See docs/query.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

from superfile.errors import CacheNodeUnavailableError, InvalidOptionError, SuperfileMissingError
from superfile.expressions import Predicate
from superfile.remote.errors import error_from_response
from superfile.remote.wire import ARROW_STREAM, from_ipc
from superfile.search.leaf import OPS, PARTS, LeafRequest
from superfile.search.placement import assign, rank
from superfile.search.transport import Answer, Call, Connections, NoAnswer
from superfile.table.snapshot import Snapshot

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

__all__ = ["Fleet", "Member"]

log = logging.getLogger(__name__)

_HEDGE_MIN_SAMPLES = 20  # leaf latencies seen before hedging starts (a p95 of fewer is noise)
_HEDGE_FLOOR_S = 0.02  # never hedge a call sooner than this
# hedges are held to this share of the calls answered, with bursts of up to _HEDGE_BURST ("The Tail at Scale":
# a few percent of extra load). When many calls turn late at once (on a busy machine, where each hedge's
# transient read from storage makes the others later still), hedging them all would double the load.
_HEDGE_RATE = 0.05
_HEDGE_BURST = 10.0
_ROUNDS = 3  # a share goes round every node at most this often before the read fails
_SLOW_STRIKES = 3  # hedges in a row another node wins before a node rests from placement
_SLOW_REST_S = 10.0  # how long it rests
_P95_EVERY_S = 0.1  # how stale the hedging threshold may be
# A node's first call on a version loads its manifest and opens what is new (after a commit: 30-100 ms on the
# 1M-row bench, against a p95 of ~10-20 ms): hedged only past this, or a hedge would follow nearly every commit
_FIRST_HEDGE_S = 1.0
_VERSIONS_KEPT = 16  # per node: the versions it answered lately
MOVE_AFTER_S = float(os.environ.get("SUPERFILE_MOVE_AFTER_S", "60"))  # a departed node's share stays this long


@dataclass(frozen=True)
class _FleetMetrics:
    leaf_seconds: Histogram
    width: Histogram
    retries: Counter
    hedges: Counter
    failures: Counter


@functools.cache
def _metrics() -> _FleetMetrics:
    """The query root's metrics (docs/query.md), made with the process's first fleet (a query root makes it at
    start): only the processes that fan out list them, and ``import superfile`` loads no metrics library."""
    from prometheus_client import Counter, Histogram

    from superfile.telemetry import preset, seconds_histogram

    leaf_seconds = seconds_histogram("superfile_query_leaf_duration_seconds", "Leaf request latency by op", ["op"])
    preset(leaf_seconds, op=sorted(OPS))
    return _FleetMetrics(
        leaf_seconds=leaf_seconds,
        width=Histogram(
            "superfile_query_fanout_width",
            "Cache nodes one read fanned out to",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128),
        ),
        retries=Counter("superfile_query_leaf_retries", "Leaf calls sent to the next node"),
        hedges=Counter("superfile_query_leaf_hedges", "Leaf calls hedged after the p95"),
        failures=Counter("superfile_query_leaf_failures", "Leaf calls without an answer"),
    )


@dataclass
class Member:
    """One cache node as the root sees it."""

    url: str
    healthy: bool = True


class _NoAnswer(Exception):
    """A node did not answer (or answered a 5xx that names no engine error): try the next one."""


class Fleet:
    """Cache nodes by URL (``nodes``) or by a DNS name ``host:port`` (``dns``), with the shared ``token``
    every request carries (``Authorization: Bearer``)."""

    def __init__(
        self,
        nodes: Sequence[str] = (),
        *,
        dns: str | None = None,
        token: str | None = None,
        deadline_s: float = 30.0,
        check_s: float = 1.0,
        hedge: bool = True,
        move_after_s: float = MOVE_AFTER_S,
    ) -> None:
        if not nodes and not dns:
            raise InvalidOptionError("a fleet needs cache node URLs or the DNS name of their service")
        if dns is not None and not urlsplit(f"//{dns}").port:
            raise InvalidOptionError(f"the cache nodes' DNS name must be host:port, got {dns!r}")
        self._static = [n.rstrip("/") for n in nodes]
        self._dns = dns
        self.deadline_s = deadline_s
        self.check_s = check_s
        self.hedge = hedge
        self.move_after_s = move_after_s
        headers = {"accept": f"{ARROW_STREAM}, application/json", "content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = Connections(headers)
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self.generation = 0  # changes whenever a node joins, leaves, fails or recovers (what warming follows)
        self._away: dict[str, float] = {}  # nodes failed or gone -> since when (monotonic); they keep their share
        self._placed: tuple[str, ...] = ()  # the nodes superfiles are placed on: the live and the recently away
        self._latencies: deque[float] = deque(maxlen=512)
        self._p95_cached: tuple[float, float] | None = None  # (when, p95)
        self._hedge_budget = _HEDGE_BURST  # hedges that may be sent now (_HEDGE_RATE per call answered)
        # shares sent on after a failure (``_next``) or to the next node (``_share``): off the read's thread, which
        # waits on its other calls meanwhile
        self._calls = ThreadPoolExecutor(32, thread_name_prefix="superfile-fanout")
        self._checks = ThreadPoolExecutor(8, thread_name_prefix="superfile-fleet-check")
        self._strikes: dict[str, int] = {}  # per node: hedges in a row that another node won
        self._slow_until: dict[str, float] = {}  # nodes resting for being slow, until then (they keep their share)
        self._names: dict[str, str] = {}  # address -> the name it resolves back to (a pod's stable DNS name)
        self._answered: dict[str, deque[str]] = {}  # per node: the manifests it answered lately
        self._metrics = _metrics()
        self._stop = threading.Event()
        self.refresh()
        self._checker = threading.Thread(target=self._check_loop, name="superfile-fleet-health", daemon=True)
        self._checker.start()

    # -- membership -------------------------------------------------------------------------
    def _resolve(self) -> list[str]:
        if self._dns is None:
            return self._static
        host, _, port = self._dns.rpartition(":")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            log.warning("cache nodes' name %s does not resolve: %s", self._dns, e)
            return []
        names = sorted({self._name(str(info[4][0])) for info in infos})
        return [f"http://[{n}]:{port}" if ":" in n else f"http://{n}:{port}" for n in names]

    def _name(self, address: str) -> str:
        """A member's identity: the name its address resolves back to where there is one (a StatefulSet pod
        behind a headless Service keeps its name across restarts, and so its superfiles; its IP changes),
        else the address. Looked up once per address."""
        name = self._names.get(address)
        if name is None:
            try:
                found = socket.gethostbyaddr(address)[0]
                name = found if found and not found.startswith(("localhost", "ip6-")) else address
            except OSError:
                name = address
            self._names[address] = name
        return name

    def _healthy(self, url: str) -> bool:
        try:
            return self._http.request("GET", url, "/healthz", None, 1.0).status == 200
        except NoAnswer:
            return False

    def refresh(self) -> None:
        """Re-read the member list and health-check every member (the health thread does this each ``check_s``)."""
        urls = self._resolve()
        health = dict(zip(urls, self._checks.map(self._healthy, urls), strict=True)) if urls else {}
        now = time.monotonic()
        with self._lock:
            before = {u: m.healthy for u, m in self._members.items()}
            self._members = {u: Member(u, ok) for u, ok in health.items()}
            for url in before.keys() | health.keys():
                if health.get(url):
                    self._away.pop(url, None)
                    if not before.get(
                        url
                    ):  # back (a restarted process, maybe): nothing opened, nothing held against it
                        self._answered.pop(url, None)
                        self._strikes.pop(url, None)
                        self._slow_until.pop(url, None)
                else:
                    self._away.setdefault(url, now)
            for url in [u for u, since in self._away.items() if u not in health and now - since > self.move_after_s]:
                del self._away[url]  # gone for good (a member still failing keeps its entry: its time stands)
            recent = {u for u, since in self._away.items() if now - since <= self.move_after_s}  # failed or unlisted
            placed = tuple(sorted({u for u, ok in health.items() if ok} | recent))
            if before != health or placed != self._placed:
                self._placed = placed
                self.generation += 1

    def _check_loop(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.refresh()
            except Exception:  # the loop must outlive any one bad check
                log.exception("cache node health check failed")

    def members(self) -> list[Member]:
        with self._lock:
            return [Member(m.url, m.healthy) for m in self._members.values()]

    def _live(self) -> list[str]:
        """Healthy members; failing that all (a read tries them anyway rather than fail at once)."""
        members = self.members()
        healthy = [m.url for m in members if m.healthy]
        return healthy or [m.url for m in members]

    def _untried(self, tried: frozenset[str]) -> list[str]:
        """The nodes a share goes to next in this round: the live ones not tried yet, else any not tried yet.
        A round ends only once every node was tried: a node the health check revived is not tried twice while
        another, marked down by some other read's failure, is skipped."""
        members = self.members()
        untried = [m.url for m in members if m.url not in tried]
        return [m.url for m in members if m.healthy and m.url not in tried] or untried

    def _resting(self, url: str) -> bool:
        """Slow (it lost hedges) or away (failed, its share kept for a while): its share is read by the next node."""
        return url in self._away or self._slow_until.get(url, 0.0) > time.monotonic()

    def _struck(self, url: str, lost: bool) -> None:
        """A hedge against ``url`` was won by another node (``lost``), or ``url`` answered in time. Three lost
        in a row rest it for ``_SLOW_REST_S``: it keeps its share (placement does not move, nothing is copied),
        but reads send that share straight to the next node as a transient call instead of costing each read
        a hedge."""
        with self._lock:
            strikes = self._strikes.get(url, 0) + 1 if lost else 0
            self._strikes[url] = strikes
            if strikes >= _SLOW_STRIKES:
                self._strikes[url] = 0
                self._slow_until[url] = time.monotonic() + _SLOW_REST_S
                log.warning("cache node %s lost %d hedges in a row: resting it for %g s", url, strikes, _SLOW_REST_S)

    def _down(self, url: str) -> None:
        with self._lock:
            member = self._members.get(url)
            if member is not None and member.healthy:
                member.healthy = False
                self._away.setdefault(url, time.monotonic())
                self.generation += 1

    def _owns(self, url: str, path: str) -> bool:
        with self._lock:
            placed = list(self._placed)
        return not placed or rank(path, placed)[0] == url

    def placement(self, paths: Sequence[str]) -> dict[str, list[str]]:
        """Which node owns each of ``paths`` now: a live one, or one away for less than ``move_after_s``."""
        with self._lock:
            placed = list(self._placed)
        return assign(paths, placed or self._live())

    # -- calls ------------------------------------------------------------------------------
    def _ask(
        self, url: str, request: LeafRequest, deadline: float, args_json: str | None = None
    ) -> pa.Table | dict[str, Any]:
        """``request``'s answer from ``url``, waited for in this thread."""
        start = time.perf_counter()
        return self._answer(self._send(url, request, deadline, args_json), request, deadline, start)

    def _send(self, url: str, request: LeafRequest, deadline: float, args_json: str | None) -> Call:
        try:
            return self._http.send("POST", url, "/v1/leaf", request.encode(args_json), deadline)
        except NoAnswer as e:
            self._metrics.failures.inc()
            raise _NoAnswer(str(e)) from None

    def _answer(self, call: Call, request: LeafRequest, deadline: float, start: float) -> pa.Table | dict[str, Any]:
        """The answer of a ``call`` sent at ``start`` (``perf_counter``): a table, statistics, or the typed error
        the node answered; :class:`_NoAnswer` if there is none."""
        try:
            response: Answer = call.answer(deadline)
        except NoAnswer as e:
            self._metrics.failures.inc()
            raise _NoAnswer(str(e)) from None
        self._metrics.leaf_seconds.labels(op=request.op).observe(time.perf_counter() - start)
        if response.status == 200:
            self._answered.setdefault(call.url, deque(maxlen=_VERSIONS_KEPT)).append(request.manifest)
            if response.content_type.startswith(ARROW_STREAM):
                return from_ipc(response.data)
            answer: dict[str, Any] = json.loads(response.data)
            return answer
        error = error_from_response(response.status, response.data)
        if response.status >= 500 and not isinstance(error, SuperfileMissingError):
            self._metrics.failures.inc()
            raise _NoAnswer(f"{call.url}: {error}") from error
        raise error

    def _p95(self) -> float | None:
        """The hedging threshold: recomputed at most every ``_P95_EVERY_S`` (a quantile of 512 latencies on
        every read cost more than the rest of its planning)."""
        if not self.hedge or len(self._latencies) < _HEDGE_MIN_SAMPLES:
            return None
        now = time.monotonic()
        if self._p95_cached is None or now - self._p95_cached[0] > _P95_EVERY_S:
            p95 = max(_HEDGE_FLOOR_S, float(np.quantile(np.fromiter(self._latencies, float), 0.95)))
            self._p95_cached = (now, p95)
        return self._p95_cached[1]

    def _hedge_after(self, url: str, manifest: str, p95: float | None) -> float | None:
        """When a call to ``url`` for ``manifest`` is hedged: at the p95, or past ``_FIRST_HEDGE_S`` for a version
        the node has not answered yet (its first call opens it)."""
        if p95 is None or manifest in self._answered.get(url, ()):
            return p95
        return max(p95, _FIRST_HEDGE_S)

    def _answered_in(self, seconds: float) -> None:
        """A call answered without a hedge: its latency counts toward the p95, and it earns hedge budget."""
        self._latencies.append(seconds)
        with self._lock:
            self._hedge_budget = min(_HEDGE_BURST, self._hedge_budget + _HEDGE_RATE)

    def _hedge_granted(self, p95: float) -> bool:
        """Whether a call still silent after ``p95`` is hedged now (the budget allows it); a hedged call counts
        as ``p95`` toward the next p95. A call not hedged is waited for, and counts as what it took."""
        with self._lock:
            if self._hedge_budget < 1:
                return False
            self._hedge_budget -= 1
        self._metrics.hedges.inc()
        self._latencies.append(p95)
        return True

    def _first(
        self, url: str, backup: str | None, request: LeafRequest, deadline: float, args_json: str | None = None
    ) -> Any:
        """``url``'s answer, or ``backup``'s if ``url`` is still silent after the p95 and that one answers first.

        The p95 is over what callers waited: a call that was hedged counts as the p95 itself, so a node that
        turned slow does not drag the threshold up to its own latency (and make hedging useless)."""
        p95 = self._hedge_after(url, request.manifest, self._p95()) if backup is not None else None
        start = time.perf_counter()
        if p95 is None:
            answer = self._ask(url, request, deadline, args_json)
            self._answered_in(time.perf_counter() - start)
            return answer
        with _Wave() as wave:
            wave.add(self._send(url, request, deadline, args_json), 0, "owner", request)
            ready, _ = wave.wait(p95)
            if not ready and not self._hedge_granted(p95):  # no budget: the owner alone, until the deadline
                ready, _ = wave.wait(max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise _NoAnswer(f"{url}: the deadline passed")
            if ready:
                self._answered_in(time.perf_counter() - start)
                self._struck(url, lost=False)
                return self._answer(ready[0][0], request, deadline, start)
            assert backup is not None
            # the backup owns none of the share: it reads what the work needs and keeps no copies
            hedge = replace(request, transient=True)
            failure: _NoAnswer | None = None
            try:
                wave.add(self._send(backup, hedge, deadline, args_json), 0, "hedge", hedge)
            except _NoAnswer as e:
                failure = e
            while wave.pending(0):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _NoAnswer(f"{url}: the deadline passed")
                ready, _ = wave.wait(left)
                for call, (_, kind, sent) in ready:
                    try:
                        answer = self._answer(call, sent, deadline, start)
                    except _NoAnswer as e:  # a typed error is raised: it is the read's answer
                        failure = e
                        continue
                    self._struck(url, lost=kind == "hedge")
                    return answer
        assert failure is not None
        raise failure

    def _share(
        self,
        snap: Snapshot,
        url: str,
        paths: list[str],
        op: str,
        args: dict[str, Any],
        tried: frozenset[str],
        deadline: float,
        round_: int = 0,
        args_json: str | None = None,
    ) -> list[Any]:
        """The answers for ``paths`` from ``url``, or (when it gives none) from the next nodes in their order
        (:meth:`_next`). A node that does not own them (their owner failed) reads them transiently."""
        request = LeafRequest(
            snap.files.name, snap.path, tuple(paths), op, args, transient=not self._owns(url, paths[0])
        )
        others = [u for u in self._live() if u not in tried]
        backup = rank(paths[0], others)[0] if others else None
        try:
            if backup is not None and self._resting(url) and not self._resting(backup):
                with contextlib.suppress(_NoAnswer):  # else the owner, slow as it is
                    return [self._ask(backup, replace(request, transient=True), deadline, args_json)]
            return [self._first(url, backup, request, deadline, args_json)]
        except _NoAnswer as e:
            return self._next(snap, url, paths, op, args, tried, deadline, round_, args_json, e)

    def _next(
        self,
        snap: Snapshot,
        url: str,
        paths: list[str],
        op: str,
        args: dict[str, Any],
        tried: frozenset[str],
        deadline: float,
        round_: int,
        args_json: str | None,
        error: _NoAnswer,
    ) -> list[Any]:
        """``url`` gave no answer for ``paths``: mark it down and send them on, by rendezvous over the nodes
        not tried yet (:meth:`_untried`); once every node was tried, up to ``_ROUNDS`` rounds over all of them
        again, with a pause between."""
        self._down(url)
        tried = tried | {url}
        rest = self._untried(tried)
        if not rest and round_ + 1 < _ROUNDS:
            time.sleep(min(0.05 * 2**round_, max(0.0, deadline - time.monotonic())))
            tried, rest, round_ = frozenset(), [m.url for m in self.members()], round_ + 1
        if not rest or time.monotonic() >= deadline:
            raise CacheNodeUnavailableError(
                f"no cache node answered for {len(paths)} superfiles of {snap.files.name!r} (last: {error})"
            ) from None
        self._metrics.retries.inc()
        log.warning("cache node %s gave no answer (%s); its share goes to the next nodes", url, error)
        out: list[Any] = []
        for node, share in assign(paths, rest).items():
            if share:
                out += self._share(snap, node, share, op, args, tried, deadline, round_, args_json)
        return out

    def run(self, snap: Snapshot, paths: Sequence[str], op: str, args: dict[str, Any]) -> list[Any]:
        """``op`` over ``paths`` of ``snap``: one leaf call per owning node, concurrently; their answers.

        The calling thread writes every node's call (``transport.py``) and waits on them all at once, hedging
        from here a call still silent after the p95; it reads each answer as it comes. A share whose owner
        rests, or that got no answer, goes through :meth:`_share` / :meth:`_next` (retries, rounds) on the
        pool, and its end wakes this thread too."""
        if not paths:
            return []
        deadline = time.monotonic() + self.deadline_s
        groups = [(url, share) for url, share in self.placement(paths).items() if share]
        if not groups:
            raise CacheNodeUnavailableError("the query service knows no cache node")
        self._metrics.width.observe(len(groups))
        args_json = json.dumps(args)  # once for every share (a query vector is most of it)
        p95 = self._p95()
        live = self._live()
        start = time.perf_counter()
        answers: list[list[Any] | None] = [None] * len(groups)
        backups: list[str | None] = []
        hedged = [False] * len(groups)
        with _Wave() as wave:

            def no_answer(i: int, url: str, error: _NoAnswer) -> None:
                """Group ``i``'s call to ``url`` got no answer: its share goes on, unless its pair may answer."""
                if not wave.pending(i):
                    hedged[i] = True  # no hedge for a share being sent on
                    wave.add_share(self._calls.submit(self._next, snap, url, groups[i][1], op, args,
                                                      frozenset({url}), deadline, 0, args_json, error), i)  # fmt: skip

            def send(i: int, kind: str, url: str, request: LeafRequest) -> None:
                try:
                    wave.add(self._send(url, request, deadline, args_json), i, kind, request)
                except _NoAnswer as error:
                    no_answer(i, url, error)

            for i, (url, share) in enumerate(groups):
                others = [u for u in live if u != url]
                backup = rank(share[0], others)[0] if others else None
                backups.append(backup)
                if backup is not None and self._resting(url) and not self._resting(backup):
                    hedged[i] = True  # _share sends it to the backup first
                    wave.add_share(self._calls.submit(self._share, snap, url, share, op, args, frozenset({url}),
                                                      deadline, 0, args_json), i)  # fmt: skip
                else:
                    send(i, "owner", url, LeafRequest(snap.files.name, snap.path, tuple(share), op, args))
            # when each group is hedged; never without a backup (waking for it would only spin)
            after = [
                self._hedge_after(url, snap.path, p95) if b else None
                for (url, _), b in zip(groups, backups, strict=True)
            ]

            def unhedged() -> dict[int, float]:
                """The groups still waiting on their owner alone that may be hedged, and when."""
                return {i: a for i, a in enumerate(after) if a is not None and answers[i] is None and not hedged[i]}

            while any(a is None for a in answers):
                due = unhedged().values()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sum(len(groups[i][1]) for i, a in enumerate(answers) if a is None)
                    raise CacheNodeUnavailableError(
                        f"no cache node answered for {missing} superfiles of {snap.files.name!r} in {self.deadline_s} s"
                    )
                timeout = min(left, max(0.0, start + min(due) - time.perf_counter())) if due else left
                ready, shares = wave.wait(timeout)
                for call, (i, kind, request) in ready:
                    if answers[i] is not None:
                        call.abandon()  # the other call of a hedged pair answered first
                        continue
                    url = groups[i][0]
                    try:
                        answer = self._answer(call, request, deadline, start)
                    except _NoAnswer as error:
                        no_answer(i, call.url, error)
                        continue
                    answers[i] = [answer]
                    wave.abandon(i)  # a hedged pair's other call
                    if not hedged[i]:
                        self._answered_in(time.perf_counter() - start)
                        if p95 is not None:
                            self._struck(url, lost=False)
                    else:
                        self._struck(url, lost=kind == "hedge")
                for future, i in shares:
                    if answers[i] is None:
                        answers[i] = future.result()  # _share and _next raise only final errors: the read's
                        wave.abandon(i)
                if p95 is not None:
                    waited = time.perf_counter() - start
                    for i, due_after in unhedged().items():
                        if waited < due_after:
                            continue
                        if not self._hedge_granted(p95):
                            after[i] = None  # no budget: this read waits for the owner
                            continue
                        hedged[i] = True
                        backup = backups[i]
                        assert backup is not None  # (after[i] is None without one)
                        # the backup owns none of the share: it reads what the work needs and keeps no copies
                        hedge = LeafRequest(snap.files.name, snap.path, tuple(groups[i][1]), op, args, transient=True)
                        send(i, "hedge", backup, hedge)
        return [answer for group in answers for answer in group or []]

    # -- Fanout: scans and counts for SQL and to_arrow --------------------------------------
    def scan_parts(self, snap: Snapshot, columns: list[str], where: Predicate | None) -> list[pa.Table]:
        """Every matching live row, one table per superfile in the order an embedded scan returns them."""
        entries = sorted(snap.entries(where), key=lambda e: (e.id_min, e.path))
        args = {"columns": columns, "where": None if where is None else str(where)}
        pieces: dict[str, pa.Table] = {}
        for table in self.run(snap, [e.path for e in entries], "scan", args):
            offset = 0
            for path, rows in json.loads((table.schema.metadata or {})[PARTS.encode()]):
                pieces[path] = table.slice(offset, rows).replace_schema_metadata(None)
                offset += rows
        return [pieces[e.path] for e in entries if e.path in pieces]

    def count(self, snap: Snapshot, where: Predicate) -> int:
        answers = self.run(snap, [e.path for e in snap.entries(where)], "count", {"where": str(where)})
        return sum(int(a["count"]) for a in answers)

    # -- the cluster's view -----------------------------------------------------------------
    def warm(self, snap: Snapshot) -> list[str]:
        """Ask each live node to fetch the superfiles of ``snap`` it owns (warm on commit); the superfiles."""
        sizes = {e.path: e.size for e in snap.entries()}
        for url, share in self.placement(list(sizes)).items():
            if not share or url in self._away:  # an away node's share waits for it (or for move_after_s)
                continue
            body = {"table": snap.files.name, "superfiles": [[p, sizes[p]] for p in share]}
            try:
                self._http.request("POST", url, "/v1/prefetch", json.dumps(body).encode(), 5.0)
            except NoAnswer as e:
                log.warning("prefetch on %s failed: %s", url, e)
        return list(sizes)

    def node_stats(self) -> dict[str, dict[str, Any]]:
        """Each member's own account of its cache (``GET /v1/stats``); empty for a node that does not answer."""

        def one(url: str) -> dict[str, Any]:
            try:
                response = self._http.request("GET", url, "/v1/stats", None, 2.0)
                return dict(json.loads(response.data)) if response.status == 200 else {}
            except (NoAnswer, ValueError):
                return {}

        urls = [m.url for m in self.members()]
        return dict(zip(urls, self._checks.map(one, urls), strict=True))

    def close(self) -> None:
        self._stop.set()
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._checks.shutdown(wait=False, cancel_futures=True)
        self._http.clear()

    def __repr__(self) -> str:
        return f"Fleet({self._dns or self._static!r})"


class _Wave:
    """One read's calls in flight, awaited together by its thread: leaf calls (selectable, ``transport.Call``)
    and shares sent on through the pool (``Fleet._share``, ``Fleet._next``), whose end wakes the selector
    through a socket pair. Leaving it abandons the calls still in flight (their connections are closed)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._calls: dict[Call, tuple[int, str, LeafRequest]] = {}  # -> (group, "owner"|"hedge", request)
        self._shares: dict[Future[list[Any]], int] = {}  # -> group
        self._ended: queue.SimpleQueue[Future[list[Any]]] = queue.SimpleQueue()
        self._wake: tuple[socket.socket, socket.socket] | None = None

    def __enter__(self) -> _Wave:
        return self

    def __exit__(self, *exc: object) -> None:
        for call in self._calls:
            call.abandon()
        self._selector.close()
        if self._wake is not None:
            for end in self._wake:
                end.close()

    def add(self, call: Call, group: int, kind: str, request: LeafRequest) -> None:
        self._calls[call] = (group, kind, request)
        self._selector.register(call, selectors.EVENT_READ)

    def add_share(self, future: Future[list[Any]], group: int) -> None:
        if self._wake is None:
            self._wake = socket.socketpair()
            self._wake[0].setblocking(False)
            self._selector.register(self._wake[0], selectors.EVENT_READ)
        self._shares[future] = group
        future.add_done_callback(self._ended_one)

    def _ended_one(self, future: Future[list[Any]]) -> None:
        self._ended.put(future)
        with contextlib.suppress(OSError):  # the read has its answers already
            assert self._wake is not None
            self._wake[1].send(b"\0")

    def pending(self, group: int) -> bool:
        return any(g == group for g, _, _ in self._calls.values()) or group in self._shares.values()

    def abandon(self, group: int) -> None:
        """Give up on a group's other calls (its answer came)."""
        for call in [c for c, (g, _, _) in self._calls.items() if g == group]:
            self._selector.unregister(call)
            del self._calls[call]
            call.abandon()

    def wait(
        self, timeout: float
    ) -> tuple[list[tuple[Call, tuple[int, str, LeafRequest]]], list[tuple[Future[list[Any]], int]]]:
        """The calls whose answers started to arrive, and the shares that ended, within ``timeout`` seconds."""
        ready = []
        for key, _ in self._selector.select(timeout):
            if isinstance(key.fileobj, Call):
                self._selector.unregister(key.fileobj)
                ready.append((key.fileobj, self._calls.pop(key.fileobj)))
            else:
                with contextlib.suppress(BlockingIOError):
                    key.fileobj.recv(4096)  # type: ignore[union-attr]
        ended = []
        while True:
            try:
                future = self._ended.get_nowait()
            except queue.Empty:
                break
            ended.append((future, self._shares.pop(future)))
        return ready, ended
