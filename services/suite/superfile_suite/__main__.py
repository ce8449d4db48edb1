"""``python -m superfile_suite up|down|status``: the whole suite as local processes on 127.0.0.1.

``up`` starts the broker (tansu, its log kept in the S3 server so it survives
broker restarts), the S3 server (moto), Redis (append-only file in
``<dir>/redis``, so leases and fencing counters survive a restart), one builder,
the read path (three cache nodes, each with its cache in ``<dir>/cache-N``, and two
query roots over them: ``superfile-cache serve`` and ``superfile-query serve``,
docs/query.md) and the gateway in suite mode, forwarding every read to the first
query root with a generated internal token. Each runs in its own session so it
outlives this command; their pids, addresses and log paths go to
``<dir>/suite.json`` (the internal token too: the file is readable by its owner
only); ``down`` stops them. Ports are fixed (overridable by flags) so the printed
URLs are stable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import urllib3

from superfile_suite.servers import start_cache_node, start_moto, start_query, start_redis, start_tansu

__all__ = ["main"]

_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
_READY_TIMEOUT = 60.0


def _spawn(name: str, argv: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
        )


def _wait_http(url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}; see its log")
        try:
            if urllib3.request("GET", url, timeout=1, retries=False).status == 200:
                return
        except urllib3.exceptions.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{name} not ready at {url} after {_READY_TIMEOUT:.0f} s; see its log")


def up(args: argparse.Namespace) -> dict[str, Any]:
    state_dir = Path(args.dir).resolve()
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started: list[tuple[str, int]] = []
    try:
        s3 = start_moto(log_path=str(logs / "s3.log"), port=args.s3_port)
        started.append(("s3", s3.proc.pid))
        client = boto3.client(
            "s3", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )
        for bucket in (args.bucket, "superfile-broker"):
            client.create_bucket(Bucket=bucket)
        broker_env = {**_AWS, "AWS_ENDPOINT": s3.url, "AWS_ALLOW_HTTP": "true"}
        kafka = start_tansu(
            log_path=str(logs / "kafka.log"), storage="s3://superfile-broker/", env=broker_env, port=args.kafka_port
        )
        started.append(("kafka", kafka.proc.pid))
        redis = start_redis(log_path=str(logs / "redis.log"), port=args.redis_port, data_dir=str(state_dir / "redis"))
        started.append(("redis", redis.proc.pid))
        storage = f"s3://{args.bucket}/tables?endpoint_url={s3.url}"
        env = {**_AWS, "AWS_ENDPOINT_URL": s3.url}
        builder = _spawn(
            "builder",
            [
                sys.executable,
                "-m",
                "superfile_builder",
                "--storage",
                storage,
                "--kafka",
                kafka.url,
                "--redis",
                redis.url,
                "--metrics-port",
                str(args.builder_metrics_port),
            ],
            env,
            logs,
        )
        started.append(("builder", builder.pid))
        # the read path: cache nodes, then the query roots over them (each starter waits for /healthz)
        token = secrets.token_hex(32)
        cache_nodes = []
        for i, port in enumerate(args.cache_ports, 1):
            node = start_cache_node(
                storage, str(state_dir / f"cache-{i}"), token, env=env, log_path=str(logs / f"cache-{i}.log"), port=port
            )
            started.append((f"cache-{i}", node.proc.pid))
            cache_nodes.append(node.url)
        queries = []
        for i, port in enumerate(args.query_ports, 1):
            query = start_query(storage, cache_nodes, token, env=env, log_path=str(logs / f"query-{i}.log"), port=port)
            started.append((f"query-{i}", query.proc.pid))
            queries.append(query.url)
        gateway_env = {
            **env,
            "SUPERFILE_STORAGE": storage,
            "SUPERFILE_KAFKA": kafka.url,
            "SUPERFILE_API_KEYS": args.api_keys,
            "SUPERFILE_HOST": "127.0.0.1",
            "SUPERFILE_PORT": str(args.gateway_port),
            "SUPERFILE_QUERY_URL": queries[0],
            "SUPERFILE_INTERNAL_TOKEN": token,
        }
        gateway = _spawn("gateway", [sys.executable, "-m", "superfile_gateway"], gateway_env, logs)
        started.append(("gateway", gateway.pid))
        gateway_url = f"http://127.0.0.1:{args.gateway_port}"
        _wait_http(f"{gateway_url}/readyz", gateway, "gateway")
        _wait_http(f"http://127.0.0.1:{args.builder_metrics_port}/metrics", builder, "builder")
    except BaseException:
        _stop_pids(started)
        raise
    state = {
        "pids": dict(started),
        "gateway": gateway_url,
        "query": queries,
        "cache_nodes": cache_nodes,
        "internal_token": token,
        "kafka": kafka.url,
        "s3": s3.url,
        "redis": redis.url,
        "storage": storage,
        "builder_metrics": f"http://127.0.0.1:{args.builder_metrics_port}/metrics",
        "logs": str(logs),
    }
    path = state_dir / "suite.json"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(state, indent=2))
    return state


def _stop_pids(pids: list[tuple[str, int]]) -> None:
    """Stop in reverse start order: services before the servers they use."""
    for _name, pid in reversed(pids):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 10
    for _name, pid in reversed(pids):
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def down(args: argparse.Namespace) -> None:
    path = Path(args.dir) / "suite.json"
    if not path.exists():
        print("suite not running (no state file)")
        return
    state = json.loads(path.read_text())
    _stop_pids(list(state["pids"].items()))
    path.unlink()
    print("suite stopped")


def _ports(text: str) -> list[int]:
    ports = [int(p) for p in text.split(",") if p.strip()]
    if not ports or len(set(ports)) != len(ports) or not all(0 < p < 65536 for p in ports):
        raise argparse.ArgumentTypeError(f"distinct ports, comma-separated: {text!r}")
    return ports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m superfile_suite", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", default=".suite", help="state and logs directory")
    parser.add_argument("--gateway-port", type=int, default=8000)
    parser.add_argument("--kafka-port", type=int, default=9092)
    parser.add_argument("--s3-port", type=int, default=9000)
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--builder-metrics-port", type=int, default=9101)
    parser.add_argument(
        "--query-ports", type=_ports, default=[8100, 8101], help="one query root per port (default 8100,8101)"
    )
    parser.add_argument(
        "--cache-ports", type=_ports, default=[8200, 8201, 8202], help="one cache node per port (default 8200-8202)"
    )
    parser.add_argument("--bucket", default="supertable")
    parser.add_argument(
        "--api-keys",
        default=os.environ.get("SUPERFILE_API_KEYS", "dev-key:*:rw"),
        help="key:table-glob:scopes entries, comma-separated (default: env SUPERFILE_API_KEYS or dev-key:*:rw)",
    )
    args = parser.parse_args(argv)
    if args.command == "down":
        down(args)
        return
    if (Path(args.dir) / "suite.json").exists():
        raise SystemExit(f"suite already running (see {args.dir}/suite.json); make down first")
    state = up(args)
    key = args.api_keys.split(",")[0].split(":")[0]
    shown = {k: v for k, v in state.items() if k != "internal_token"}
    print(json.dumps(shown, indent=2))
    print(f"\nsuite up. Try:\n  curl -H 'Authorization: Bearer {key}' {state['gateway']}/tables")
    print(
        f"  python -c \"import superfile; db = superfile.connect('{state['gateway']}', api_key='{key}'); "
        'print(db.table_names())"'
    )
    state_file = Path(args.dir) / "suite.json"
    print(f"Reads go from the gateway to {state['query'][0]}, which fans them out over the cache nodes:")
    print(f'  TOKEN=$(python -c \'import json; print(json.load(open("{state_file}"))["internal_token"])\')')
    print(f'  curl -H "Authorization: Bearer $TOKEN" {state["query"][0]}/v1/cluster')


if __name__ == "__main__":
    main()
