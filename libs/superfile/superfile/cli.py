"""The ``superfile`` command: table operations from the shell, built only on the public API."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import superfile
from superfile.errors import SuperfileError
from superfile.remote.wire import json_default

__all__ = ["main"]

_SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield" / "docs.parquet"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_COMMANDS = "superfile.commands"  # the entry point group of subcommands other packages add
_PACKAGES = {  # subcommands the project's own packages add: their help, and what to install when one is missing
    "serve": (
        "serve the tables over HTTP (REST gateway, embedded mode)",
        "the gateway package",
        "pip install 'superfile[service]' ./services/gateway",
    ),
}


def _connect(uri: str) -> Any:
    """The catalog at ``uri``; a gateway (http/https) gets the API key from ``SUPERFILE_API_KEY``."""
    if uri.startswith(("http://", "https://")):
        return superfile.connect(uri, api_key=os.environ.get("SUPERFILE_API_KEY"))
    return superfile.connect(uri)


def _open(args: argparse.Namespace, **at: Any) -> Any:
    return _connect(args.uri).open_table(args.table, **at)


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=json_default))


def _duration(text: str) -> float:
    """Seconds from ``3600``, ``90.5`` or a duration such as ``7d``, ``12h``, ``1h30m``."""
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not seconds or a duration like 7d, 12h, 1h30m: {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _point_in_time(text: str) -> datetime.datetime | int:
    """Epoch milliseconds, or an ISO 8601 datetime (naive meaning UTC, as the engine reads it)."""
    if text.isdigit():
        return int(text)
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not epoch milliseconds or an ISO 8601 datetime: {text!r}") from None


def _columns(text: str) -> list[str]:
    return [c for c in text.split(",") if c]


def _read(path: str) -> pa.Table:
    if path.endswith((".jsonl", ".json", ".ndjson")):
        import pyarrow.json as pj

        return pj.read_json(path)
    return pq.read_table(path)


def _vector_arg(spec: str) -> tuple[str, dict[str, Any]]:
    name, dim, *metric = spec.split(":")
    return name, {"dim": int(dim), "metric": metric[0] if metric else "cosine"}


def _print_table(table: pa.Table, width: int = 60) -> None:
    for row in table.to_pylist():
        shown = {}
        for k, v in row.items():
            if isinstance(v, list):
                v = f"<vector dim={len(v)}>"
            elif isinstance(v, str) and len(v) > width:
                v = v[: width - 3] + "..."
            shown[k] = v
        print("  " + json.dumps(shown, default=str))


def _append_with_progress(table: superfile.Table, data: pa.Table, batch_rows: int) -> None:
    from tqdm import tqdm

    with tqdm(total=data.num_rows, unit="rows", desc=f"append {table.name}") as bar:
        for start in range(0, data.num_rows, batch_rows):
            chunk = data.slice(start, batch_rows)
            table.append(chunk)
            bar.update(chunk.num_rows)


def cmd_demo(args: argparse.Namespace) -> None:
    """The main job: load the Cranfield sample into a table, show what is there and how to query it."""
    db = superfile.connect(args.uri)
    data = pq.read_table(args.data)
    if args.table in db.table_names():
        db.drop_table(args.table)
    table = db.create_table(
        args.table,
        data.schema,
        fts_columns=["title", "text"],
        vector_columns={"embedding": {"dim": 384, "metric": "cosine"}},
    )
    _append_with_progress(table, data, args.batch_rows)
    print("\nstats:", json.dumps(table.stats(), indent=2))
    print(f"\nfirst rows of {args.table!r}:")
    _print_table(table.to_arrow(columns=["_id", "id", "title", "author"]).slice(0, 3))
    query = "supersonic boundary layer"
    print(f"\nBM25 top 3 for {query!r} in text:")
    _print_table(table.bm25_search("text", query, k=3, projection=["id", "title"]))
    first = table.to_arrow(columns=["embedding", "title"], where="id = 1")
    print(f"\nnearest 3 to the embedding of {first.column('title')[0].as_py()[:50]!r}:")
    vector = first.column("embedding")[0].as_py()
    _print_table(table.vector_search("embedding", vector, k=3, projection=["id", "title"]))
    print(
        "\nQuery it from Python:\n"
        f"  import superfile\n  t = superfile.connect({args.uri!r}).open_table({args.table!r})\n"
        "  t.bm25_search('text', 'shock waves', k=5, projection=['id', 'title'])\n"
        "  t.to_arrow(where=\"author = 'brenckman,m.'\")\n"
        f"or from the shell:\n  superfile search {args.uri} {args.table} text 'shock waves' --k 5 --columns id,title\n"
        f'  superfile scan {args.uri} {args.table} --where "id < 5" --columns id,title'
    )
    if args.serve:
        _serve_demo(args)


def _serve_demo(args: argparse.Namespace) -> None:
    """Serve the demo table over HTTP with a key made for this run, after saying how to query it."""
    key = secrets.token_urlsafe(18)  # shown once, to whoever started the server; never stored
    url = f"http://127.0.0.1:{args.port}"
    auth = f"-H 'Authorization: Bearer {key}' -H 'content-type: application/json'"
    bm25 = '{"column": "text", "query": "shock waves", "k": 5, "projection": ["id", "title"]}'
    sql = f'{{"query": "SELECT author, count(*) AS n FROM {args.table} GROUP BY author ORDER BY n DESC LIMIT 5"}}'
    print(
        f"\nServing {args.uri} at {url} (Ctrl-C stops it). API key for this run (read and write): {key}\n"
        f"  curl -s {auth} -d '{bm25}' {url}/tables/{args.table}/search/bm25\n"
        f"  curl -s {auth} -d '{sql}' {url}/sql\n"
        f"  curl -s -H 'Authorization: Bearer {key}' {url}/tables/{args.table}/stats\n"
        "From Python (the same methods as embedded):\n"
        f"  t = superfile.connect({url!r}, api_key={key!r}).open_table({args.table!r})\n"
        "  t.bm25_search('text', 'shock waves', k=5, projection=['id', 'title'])\n"
        f"OpenAPI: {url}/docs",
        flush=True,
    )
    serve = _parser().parse_args(["serve", args.uri, "--port", str(args.port)])
    serve.api_keys = f"{key}:*:rw"  # the serve command takes this run's key instead of SUPERFILE_API_KEYS
    serve.fn(serve)


def cmd_create(args: argparse.Namespace) -> None:
    db = _connect(args.uri)
    schema = (
        pq.read_schema(args.schema_from) if args.schema_from.endswith(".parquet") else _read(args.schema_from).schema
    )
    db.create_table(
        args.table,
        schema,
        fts_columns=args.fts or [],
        vector_columns=dict(_vector_arg(v) for v in args.vector or []),
        tokenizer=args.tokenizer,
    )
    print(f"created {args.table}")


def cmd_append(args: argparse.Namespace) -> None:
    table = _open(args)
    data = _read(args.file)
    if args.idempotency_key is None:
        _append_with_progress(table, data, args.batch_rows)
        print(f"version {table.version}")
    else:  # one commit: a retried command adds all of the file or nothing, and the key names all of it
        print(f"version {table.append(data, idempotency_key=args.idempotency_key)}")


def cmd_stats(args: argparse.Namespace) -> None:
    print(json.dumps(_open(args).stats(), indent=2))


def cmd_tables(args: argparse.Namespace) -> None:
    for name in _connect(args.uri).table_names():
        print(name)


def cmd_drop(args: argparse.Namespace) -> None:
    _connect(args.uri).drop_table(args.table)
    print(f"dropped {args.table}")


def cmd_delete(args: argparse.Namespace) -> None:
    print(f"version {_open(args).delete(args.where)}")


def cmd_scan(args: argparse.Namespace) -> None:
    table = _open(args, version=args.version, as_of=args.as_of)
    columns = args.columns.split(",") if args.columns else None
    _print_table(table.to_arrow(columns=columns, where=args.where).slice(0, args.limit))


def cmd_search(args: argparse.Namespace) -> None:
    table = _open(args)
    projection = args.columns.split(",") if args.columns else None
    if args.kind == "bm25":
        result = table.bm25_search(args.column, args.query, k=args.k, mode=args.mode, projection=projection)
    elif args.kind == "prefix":
        result = table.bm25_search_prefix(args.column, args.query, k=args.k, projection=projection)
    elif args.kind == "tokens":
        result = table.token_match(args.column, args.query.split(), projection=projection)
    else:
        result = table.exact_match(args.column, args.query, projection=projection)
    _print_table(result)


def cmd_versions(args: argparse.Namespace) -> None:
    for v in _open(args).versions():
        print(json.dumps(v))


def cmd_optimize(args: argparse.Namespace) -> None:
    _print_json(_open(args).optimize(args.target_rows, target_bytes=args.target_bytes))


def cmd_cleanup(args: argparse.Namespace) -> None:
    table = _open(args)
    options = {"dry_run": args.dry_run, "safety_margin": args.safety_margin}
    if args.older_than is None:
        _print_json(table.cleanup(**options))
    else:
        _print_json(table.cleanup(args.older_than, **options))


def cmd_restore(args: argparse.Namespace) -> None:
    _print_json({"version": _open(args).restore(args.version)})


def cmd_upgrade(args: argparse.Namespace) -> None:
    """Convert a table (or every table) written by an older superfile to the current format."""
    db = superfile.Connection(args.uri)  # an upgrade rewrites storage directly: embedded only
    for name in [args.table] if args.table else db.table_names():
        _print_json({"table": name, "version": db.upgrade_table(name)})


def cmd_changes(args: argparse.Namespace) -> None:
    """One JSON object per changed row: ``_change`` ("insert"/"delete"), ``_id``, then the columns."""
    for row in _open(args).changes(args.from_version, args.to_version, columns=args.columns).to_pylist():
        _print_json(row)


def _add_installed_commands(sub: Any, builtin: set[str]) -> None:
    """The subcommands installed packages add: each entry point of the ``superfile.commands`` group names a
    ``register(subparsers)`` that adds one subcommand (setting ``fn``, as the commands here do). ``serve``
    comes with the gateway (``superfile_gateway.cli``): the library never imports a service itself."""
    added: set[str] = set()
    for ep in entry_points(group=_COMMANDS):
        if ep.name in builtin or ep.name in added:
            continue
        try:
            register = ep.load()
        except ImportError as e:  # installed, but something it needs is not
            _not_installed(sub, ep.name, str(e))
        else:
            register(sub)
        added.add(ep.name)
    for name in sorted(set(_PACKAGES) - added):
        _not_installed(sub, name, "not installed")


def _not_installed(sub: Any, name: str, reason: str) -> None:
    """A subcommand whose package is missing: it takes any arguments and says what to install (exit code 2)."""
    help_, package, install = _PACKAGES.get(name, (f"the {name} command", "its package", "pip"))
    message = f"error: superfile {name} needs {package} ({reason}); install it with {install}"

    def fn(args: argparse.Namespace) -> None:
        print(message, file=sys.stderr)
        raise SystemExit(2)

    sp = sub.add_parser(name, help=f"{help_}; needs {package}")
    sp.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    sp.set_defaults(fn=fn)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="superfile", description="Supertable command line")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Any, help_: str, table: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(fn=fn)
        if name != "demo":
            sp.add_argument("uri", help="storage URI, e.g. file://./data or s3://bucket/prefix")
            if table:
                sp.add_argument("table")
        return sp

    d = add("demo", cmd_demo, "load the Cranfield sample into a table and show it")
    d.add_argument("--uri", default="file://./data")
    d.add_argument("--table", default="cranfield")
    d.add_argument("--data", default=str(_SAMPLE))
    d.add_argument("--batch-rows", type=int, default=200)
    d.add_argument("--serve", action="store_true", help="then serve it over HTTP on 127.0.0.1 (make run does)")
    d.add_argument("--port", type=int, default=8000)
    c = add("create", cmd_create, "create a table with the schema of a Parquet/JSON file")
    c.add_argument("--schema-from", required=True)
    c.add_argument("--fts", nargs="*", help="full-text columns")
    c.add_argument("--vector", nargs="*", help="vector columns as name:dim[:metric]")
    c.add_argument("--tokenizer", default="english")
    a = add("append", cmd_append, "append a Parquet or JSON-lines file")
    a.add_argument("file")
    a.add_argument("--batch-rows", type=int, default=100_000)
    a.add_argument(
        "--idempotency-key",
        help="append the whole file as one commit recording this key; a repeated key adds nothing",
    )
    add("stats", cmd_stats, "print table stats")
    add("tables", cmd_tables, "list tables", table=False)
    add("drop", cmd_drop, "drop a table")
    dl = add("delete", cmd_delete, "delete rows matching a SQL predicate")
    dl.add_argument("where")
    s = add("scan", cmd_scan, "print rows")
    s.add_argument("--where")
    s.add_argument("--columns")
    s.add_argument("--limit", type=int, default=20)
    at = s.add_mutually_exclusive_group()
    at.add_argument("--version", type=int, help="read this past version")
    at.add_argument(
        "--as-of", type=_point_in_time, help="read the version current at this time: epoch ms or ISO 8601 (UTC)"
    )
    q = add("search", cmd_search, "full-text search a column")
    q.add_argument("column")
    q.add_argument("query")
    q.add_argument("--kind", choices=["bm25", "prefix", "tokens", "exact"], default="bm25")
    q.add_argument("--mode", choices=["any", "all"], default="any")
    q.add_argument("--k", type=int, default=10)
    q.add_argument("--columns", help="comma-separated projection (default: whole rows)")
    add("versions", cmd_versions, "list retained versions (JSON lines)")
    o = add("optimize", cmd_optimize, "compact small superfiles and drop deleted rows (prints JSON)")
    size = o.add_mutually_exclusive_group()
    size.add_argument("--target-rows", type=int, help="rows per output superfile (default: the table's maximum)")
    size.add_argument("--target-bytes", type=int, help="size outputs to about this many bytes")
    cl = add("cleanup", cmd_cleanup, "delete files no retained version needs (prints JSON)")
    cl.add_argument(
        "--older-than",
        type=_duration,
        help="keep versions of this window: seconds or 7d, 12h, 30m, 1h30m (default 7d)",
    )
    cl.add_argument(
        "--safety-margin",
        type=_duration,
        help="unreferenced files younger than this stay: longer than any commit (default: the window)",
    )
    cl.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    r = add("restore", cmd_restore, "publish a retained version's contents as the newest version (prints JSON)")
    r.add_argument("version", type=int)
    ch = add("changes", cmd_changes, "rows inserted and deleted between two versions (JSON lines)")
    ch.add_argument("from_version", type=int, metavar="FROM")
    ch.add_argument("to_version", type=int, nargs="?", metavar="TO", help="default: the latest version")
    ch.add_argument("--columns", type=_columns, help="comma-separated columns besides _change and _id")
    up = add("upgrade", cmd_upgrade, "convert tables of an older format, one commit each (prints JSON)", table=False)
    up.add_argument("table", nargs="?", help="the table (default: every table)")
    _add_installed_commands(sub, set(sub.choices))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.fn(args)
    except SuperfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
