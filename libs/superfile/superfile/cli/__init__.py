"""The ``superfile`` command: table operations from the shell, built on the public API (docs/cli.md).

Every command that answers prints rows, in the one style ``--format`` picks (``cli/output.py``: an aligned
table by default, JSON lines, CSV or Parquet), every value in full unless ``--truncate`` shortens them.
``--limit`` is pushed down: a scan stops reading superfiles once it has the rows (``superfile.table.head``),
SQL gets a ``LIMIT``, a search asks for that many. ``append`` reads its file as a stream and commits it once:
all of the file or none of it. Every failure is one line, ``error: ...`` on stderr, with exit code 1 (2 for
a usage error, argparse's convention); no traceback (``SUPERFILE_DEBUG=1`` shows one for an unexpected error).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.parquet as pq

import superfile
from superfile.cli.inputs import INPUT_FORMATS, open_rows, text_argument
from superfile.cli.output import FORMATS, Output, write
from superfile.errors import InvalidInputError, SuperfileError
from superfile.schema import ID
from superfile.table import Supertable
from superfile.table.head import head

__all__ = ["main"]

_SAMPLE = Path(__file__).resolve().parents[4] / "examples" / "data" / "cranfield" / "docs.parquet"
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
_RANKED = ("bm25", "prefix", "vector", "hybrid")  # the search kinds that return the best k
_DEFAULT_K = 10


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line (``error: ...``, exit code 2) instead of the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


# -- arguments ---------------------------------------------------------------------------------------------------
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _columns(text: str) -> list[str]:
    return [c for c in text.split(",") if c]


def _vector_arg(spec: str) -> tuple[str, dict[str, Any]]:
    """``name:dim[:metric]``, e.g. ``embedding:384`` or ``embedding:384:l2``."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"not name:dim[:metric]: {spec!r}")
    return parts[0], {"dim": int(parts[1]), "metric": parts[2] if len(parts) == 3 else "cosine"}


# -- helpers -----------------------------------------------------------------------------------------------------
def _connect(uri: str) -> Any:
    """The catalog at ``uri``; a gateway (http/https) gets the API key from ``SUPERFILE_API_KEY``."""
    if uri.startswith(("http://", "https://")):
        return superfile.connect(uri, api_key=os.environ.get("SUPERFILE_API_KEY"))
    return superfile.connect(uri)


def _open(args: argparse.Namespace) -> Any:
    """The table ``args`` name, at ``--version`` / ``--as-of`` where the command takes them."""
    at = {k: getattr(args, k) for k in ("version", "as_of") if getattr(args, k, None) is not None}
    return _connect(args.uri).open_table(args.table, **at)


def _one_row(values: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist([values])


def _rows_of(values: list[dict[str, Any]], names: Sequence[str]) -> pa.Table:
    return pa.Table.from_pylist(values) if values else pa.table({n: pa.array([], pa.null()) for n in names})


def _first_rows(table: Any, limit: int | None, columns: list[str] | None, where: str | None) -> pa.Table:
    """``table.to_arrow(columns, where)``, at most ``limit`` rows of it: on an embedded table only the superfiles
    holding them are read; a gateway's scan has no limit, so its answer is cut here."""
    if limit is not None and isinstance(table, Supertable):
        return head(table.snapshot(), limit, columns, where)
    rows = table.to_arrow(columns=columns, where=where)
    return rows if limit is None else rows.slice(0, limit)


@contextmanager
def _progress(enabled: bool | None, total: int | None, desc: str) -> Iterator[Any]:
    """A progress bar on stderr counting rows (``enabled`` None: only when stderr is a terminal)."""
    from tqdm import tqdm

    with tqdm(
        total=total, unit=" rows", unit_scale=True, desc=desc, disable=None if enabled is None else not enabled
    ) as bar:
        yield bar


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- commands ----------------------------------------------------------------------------------------------------
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
    # Several commits on purpose: the demo table has versions to travel to and superfiles to fan out over.
    with _progress(None, data.num_rows, f"append {args.table}") as bar:
        for start in range(0, data.num_rows, args.batch_rows):
            chunk = data.slice(start, args.batch_rows)
            table.append(chunk)
            bar.update(chunk.num_rows)
    stats = table.stats()
    show = Output(truncate=70)
    print(
        f"\n{args.table}: {stats['row_count']} rows in {stats['superfile_count']} superfiles, version {table.version}"
    )
    print(f"\nfirst rows of {args.table!r}:")
    write(_first_rows(table, 3, ["_id", "id", "title", "author"], None), show)
    query = "supersonic boundary layer"
    print(f"\nBM25 top 3 for {query!r} in text:")
    write(table.bm25_search("text", query, k=3, projection=["id", "title"]), show)
    first = table.to_arrow(columns=["embedding", "title"], where="id = 1")
    print(f"\nnearest 3 to the embedding of {first.column('title')[0].as_py()[:50]!r}:")
    vector = first.column("embedding")[0].as_py()
    write(table.vector_search("embedding", vector, k=3, projection=["id", "title"]), show)
    uri, name = args.uri, args.table
    print(
        "\nQuery it from Python:\n"
        f"  import superfile\n  t = superfile.connect({uri!r}).open_table({name!r})\n"
        "  t.bm25_search('text', 'shock waves', k=5, projection=['id', 'title'])\n"
        "  t.to_arrow(where=\"author = 'brenckman,m.'\")\n"
        f"or from the shell{_path_hint()}:\n"
        f"  superfile search {uri} {name} text 'shock waves' --limit 5 --columns id,title\n"
        f"  superfile search {uri} {name} embedding --kind vector --like 'id = 1' --limit 3 --columns id,title\n"
        f"  superfile count {uri} {name} --where \"author = 'brenckman,m.'\"\n"
        f'  superfile sql {uri} "SELECT author, count(*) AS n FROM {name} GROUP BY author ORDER BY n DESC" --limit 5\n'
        f"  superfile scan {uri} {name} --where 'id < 5' --columns id,title --format json",
        flush=True,
    )
    if args.serve:
        _serve_demo(args)


def _path_hint() -> str:
    """How to get ``superfile`` onto PATH when it is not there (the console script sits next to this Python)."""
    if shutil.which("superfile"):
        return ""
    bin_dir = Path(sys.executable).parent
    if (bin_dir / "activate").is_file():
        return f" (first `source {bin_dir / 'activate'}`: it puts superfile on PATH)"
    return f" ({bin_dir / 'superfile'})"


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
        "From the shell, through the server:\n"
        f"  SUPERFILE_API_KEY={key} superfile count {url} {args.table}\n"
        f"OpenAPI: {url}/docs",
        flush=True,
    )
    serve = _parser().parse_args(["serve", args.uri, "--port", str(args.port)])
    serve.api_keys = f"{key}:*:rw"  # the serve command takes this run's key instead of SUPERFILE_API_KEYS
    serve.fn(serve)


def cmd_create(args: argparse.Namespace) -> pa.Table:
    schema = open_rows(args.schema_from, args.input_format).schema
    table = _connect(args.uri).create_table(
        args.table,
        schema,
        fts_columns=args.fts or [],
        vector_columns=dict(args.vector or []),
        tokenizer=args.tokenizer,
    )
    return _one_row({"table": args.table, "version": table.version})


def _csv_types(schema: pa.Schema) -> dict[str, pa.DataType]:
    """The table's scalar columns' types, for reading CSV text as the table has them."""
    return {f.name: f.type for f in schema if f.name != ID and not pa.types.is_nested(f.type)}


def cmd_append(args: argparse.Namespace) -> pa.Table:
    """The whole file in one commit, read as a stream: a failure anywhere in it (a bad row, a dropped
    connection) commits nothing."""
    table = _open(args)
    rows = open_rows(args.file, args.input_format, _csv_types(table.schema))
    with _progress(args.progress, rows.total, f"append {table.name}") as bar:
        committed = table.append(rows.reader(bar.update), idempotency_key=args.idempotency_key)
    return _one_row({"version": committed})


def cmd_stats(args: argparse.Namespace) -> pa.Table:
    return _one_row(_open(args).stats())


def cmd_tables(args: argparse.Namespace) -> pa.Table:
    return pa.table({"table": pa.array(_connect(args.uri).table_names(), pa.string())})


def cmd_drop(args: argparse.Namespace) -> pa.Table:
    _connect(args.uri).drop_table(args.table)
    return _one_row({"dropped": args.table})


def cmd_delete(args: argparse.Namespace) -> pa.Table:
    return _one_row({"version": _open(args).delete(args.where)})


def cmd_scan(args: argparse.Namespace) -> pa.Table:
    return _first_rows(_open(args), args.limit, args.columns, args.where)


def cmd_count(args: argparse.Namespace) -> pa.Table:
    return _one_row({"count": _open(args).count_rows(args.where)})


def cmd_describe(args: argparse.Namespace) -> pa.Table:
    """One row per column: name, type, nullable, and what indexes or partitions by it."""
    table = _open(args)
    options = table.options
    rows = []
    for field in table.schema:
        index = []
        if field.name == ID:
            index.append("row id")
        if field.name in options.fts_columns:
            index.append(f"full-text ({options.fts_columns[field.name]})")
        if field.name in options.vector_columns:
            spec = options.vector_columns[field.name]
            index.append(f"vector ({spec.dim}, {spec.metric})")
        if field.name in options.scalar_indexes:
            index.append(f"scalar ({options.scalar_indexes[field.name]})")
        if options.partition is not None and options.partition.column == field.name:
            index.append(f"partition ({options.partition.transform})")
        rows.append(
            {"column": field.name, "type": str(field.type), "nullable": field.nullable, "index": ", ".join(index)}
        )
    return pa.Table.from_pylist(rows)


class _UsageError(Exception):
    """Arguments argparse accepts one by one but not together: a usage error (exit code 2)."""


def _query_vector(table: Any, args: argparse.Namespace, column: str) -> list[float]:
    """The query vector: ``--like WHERE`` (the vector of the first row matching it), else a JSON array given as
    QUERY (vector search) or ``--vector``, ``-`` reading it from stdin."""
    if args.like is not None:
        found = _first_rows(table, 1, [column], args.like)
        if not found.num_rows:
            raise InvalidInputError(f"no row matches --like {args.like!r}")
        return list(found.column(column)[0].as_py())
    text = text_argument(args.vector if args.vector is not None else args.query, "query vector")
    try:
        vector = json.loads(text)
    except ValueError:
        vector = None
    if not isinstance(vector, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
        raise InvalidInputError(f"the query vector must be a JSON array of numbers, got {_one_line(text)[:60]!r}")
    return [float(x) for x in vector]


def _check_search(args: argparse.Namespace) -> None:
    """The options that go with ``--kind``, and one query (and one query vector) given."""
    kind = args.kind
    only = {  # option -> (the kinds it applies to, its name)
        "mode": (("bm25", "tokens"), "--mode"),
        "where": (("vector",), "--where"),
        "nprobe": (("vector",), "--nprobe"),
        "rerank": (("vector",), "--rerank"),
        "vector": (("vector", "hybrid"), "--vector"),
        "like": (("vector", "hybrid"), "--like"),
        "vector_column": (("hybrid",), "--vector-column"),
    }
    for dest, (kinds, flag) in only.items():
        if getattr(args, dest) is not None and kind not in kinds:
            raise _UsageError(f"{flag} applies to --kind {' or '.join(kinds)}, not {kind}")
    modes = {"bm25": ("any", "all"), "tokens": ("and", "or")}
    if args.mode is not None and args.mode not in modes[kind]:
        raise _UsageError(f"--mode of a {kind} search is {' or '.join(modes[kind])}, not {args.mode}")
    if kind != "vector" and args.query is None:
        raise _UsageError(f"a {kind} search needs QUERY (or '-' to read it from stdin)")
    if kind in ("vector", "hybrid"):
        given = [args.vector, args.like] + ([args.query] if kind == "vector" else [])
        if sum(g is not None for g in given) != 1:
            where = "QUERY, --vector or --like" if kind == "vector" else "--vector or --like"
            raise _UsageError(f"give a {kind} search one query vector: {where}")


def _vector_column(table: Any, args: argparse.Namespace) -> str:
    if args.vector_column is not None:
        return str(args.vector_column)
    columns = list(table.options.vector_columns)
    if len(columns) != 1:
        raise InvalidInputError(f"give --vector-column: the table has vector columns {columns}")
    return columns[0]


def cmd_search(args: argparse.Namespace) -> pa.Table:
    _check_search(args)
    kind = args.kind
    table = _open(args)
    k = args.limit if args.limit is not None else _DEFAULT_K
    projection = args.columns
    if kind == "vector":
        vector = _query_vector(table, args, args.column)
        return table.vector_search(
            args.column, vector, k=k, nprobe=args.nprobe, rerank=args.rerank, where=args.where, projection=projection
        )
    query = text_argument(args.query, "query")
    if kind == "bm25":
        return table.bm25_search(args.column, query, k=k, mode=args.mode or "any", projection=projection)
    if kind == "prefix":
        return table.bm25_search_prefix(args.column, query, k=k, projection=projection)
    if kind == "hybrid":
        column = _vector_column(table, args)
        return table.hybrid_search(
            args.column, query, column, _query_vector(table, args, column), k=k, projection=projection
        )
    if kind == "tokens":  # unranked: every match; --limit keeps the first
        rows = table.token_match(args.column, query.split(), args.mode or "and", projection=projection)
    else:
        rows = table.exact_match(args.column, query, projection=projection)
    return rows if args.limit is None else rows.slice(0, args.limit)


def _sql_parse(query: str) -> Any:
    """The one statement of ``query`` as sqlglot reads it (the dialects the engine's own analysis tries), or
    None."""
    import sqlglot

    quiet = logging.getLogger("sqlglot")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "unsupported syntax" warnings: the engine says what is wrong, if anything
    try:
        for dialect in ("postgres", "duckdb", None):
            try:
                statements = sqlglot.parse(query, read=dialect)
            except Exception:
                continue
            if len(statements) == 1 and statements[0] is not None:
                return statements[0]
        return None
    finally:
        quiet.setLevel(level)


def _limited_sql(query: str, limit: int) -> tuple[str, bool]:
    """``query`` with its result capped at ``limit`` rows by the SQL itself, and whether it is. A ``LIMIT`` goes
    on the outermost statement (a ``LIMIT`` around it as a subquery would lose its ``ORDER BY``: DataFusion
    drops the order of a subquery); a statement that already has a smaller one, or that aggregates into one
    row, stays as written. Otherwise (an ``OFFSET``, a larger ``LIMIT``, text sqlglot cannot read) the query
    runs as written and its answer is cut."""
    from sqlglot import exp

    tree = _sql_parse(query)
    if not isinstance(tree, exp.Query):
        return query, False
    limit_node, offset = tree.args.get("limit"), tree.args.get("offset")
    if limit_node is None and offset is None:
        if isinstance(tree, exp.Select) and _one_row_aggregate(tree):
            return query, True
        return f"{query.rstrip().rstrip(';').rstrip()}\nLIMIT {limit}", True
    value = limit_node.expression if isinstance(limit_node, exp.Limit) else None
    if isinstance(value, exp.Literal) and value.is_int and int(value.this) <= limit:
        return query, True
    return query, False


def _one_row_aggregate(select: Any) -> bool:
    """``SELECT count(*), max(x) FROM ...`` without GROUP BY: one row whatever the limit (and the engine
    answers a plain count from the manifest, which a LIMIT would turn into a scan)."""
    from sqlglot import exp

    return (
        not select.args.get("group")
        and bool(select.expressions)
        and all(e.find(exp.AggFunc) for e in select.expressions)
        and select.find(exp.Window) is None
    )


def cmd_sql(args: argparse.Namespace) -> pa.Table:
    query = text_argument(args.query, "query")
    db = _connect(args.uri)
    if args.limit is None:
        return db.sql(query)
    text, capped = _limited_sql(query, args.limit)
    rows = db.sql(text)
    return rows if capped else rows.slice(0, args.limit)


def cmd_versions(args: argparse.Namespace) -> pa.Table:
    return _rows_of(_open(args).versions(), ["version"])


def cmd_optimize(args: argparse.Namespace) -> pa.Table:
    return _one_row(_open(args).optimize(args.target_rows, target_bytes=args.target_bytes))


def cmd_cleanup(args: argparse.Namespace) -> pa.Table:
    table = _open(args)
    options = {"dry_run": args.dry_run, "safety_margin": args.safety_margin}
    if args.older_than is None:
        return _one_row(table.cleanup(**options))
    return _one_row(table.cleanup(args.older_than, **options))


def cmd_restore(args: argparse.Namespace) -> pa.Table:
    return _one_row({"version": _open(args).restore(args.restore_version)})


def cmd_upgrade(args: argparse.Namespace) -> pa.Table:
    """Convert a table (or every table) written by an older superfile to the current format."""
    db = superfile.Connection(args.uri)  # an upgrade rewrites storage directly: embedded only
    names = [args.table] if args.table else db.table_names()
    return _rows_of([{"table": name, "version": db.upgrade_table(name)} for name in names], ["table", "version"])


def cmd_changes(args: argparse.Namespace) -> pa.Table:
    """One row per changed row: ``_change`` ("insert"/"delete"), ``_id``, then the columns."""
    return _open(args).changes(args.from_version, args.to_version, columns=args.columns)


# -- the parser --------------------------------------------------------------------------------------------------
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


def _output_options() -> _Parser:
    """The options of every command that prints rows."""
    p = _Parser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        default="table",
        help="table: aligned text (default); json: one JSON object per line; csv; parquet (to --output, or to "
        "stdout when it is not a terminal)",
    )
    g.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    g.add_argument(
        "--truncate", type=_positive, metavar="N", help="table format: cut values to N characters (default: in full)"
    )
    g.add_argument("--no-header", dest="header", action="store_false", help="table and csv formats: no header row")
    return p


def _time_travel(p: argparse.ArgumentParser) -> None:
    at = p.add_mutually_exclusive_group()
    at.add_argument("--version", type=int, metavar="N", help="read this past (retained) version")
    at.add_argument(
        "--as-of", type=_point_in_time, help="read the version current at this time: epoch ms or ISO 8601 (UTC)"
    )


def _package_version() -> str:
    try:
        return version("superfile")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


_URI = "storage URI (file://./data, memory://name, s3://bucket/prefix) or a gateway (http://host:port)"
_WHERE = "a SQL predicate over the table's columns, e.g. \"id < 10 AND author = 'x'\""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="superfile",
        description="Supertable from the shell: read, search, write and maintain tables (docs/cli.md).",
        epilog="Every command has --help. Errors print one line on stderr: exit code 1, 2 for a usage error.",
    )
    p.add_argument("--version", action="version", version=f"superfile {_package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    output = _output_options()

    def add(name: str, fn: Any, help_: str, table: bool = True, prints: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_, parents=[output] if prints else [])
        sp.set_defaults(fn=fn)
        if name != "demo":
            sp.add_argument("uri", help=_URI)
            if table:
                sp.add_argument("table", help="the table's name")
        return sp

    d = add("demo", cmd_demo, "load the Cranfield sample into a table and show it (make run does)", prints=False)
    d.add_argument("--uri", default="file://./data", help="where to create the table (default file://./data)")
    d.add_argument("--table", default="cranfield", help="the table's name (default cranfield; replaced if it exists)")
    d.add_argument("--data", default=str(_SAMPLE), help="the Parquet file loaded (default: the Cranfield sample)")
    d.add_argument("--batch-rows", type=_positive, default=200, help="rows per append, one version each (default 200)")
    d.add_argument("--serve", action="store_true", help="then serve it over HTTP on 127.0.0.1 (make run does)")
    d.add_argument("--port", type=int, default=8000, help="the port --serve listens on (default 8000)")

    q = add("sql", cmd_sql, "run one read-only SQL query over the tables (docs/sql.md)", table=False)
    q.add_argument("query", help="the query; '-' reads it from stdin")
    q.add_argument("--limit", type=_positive, metavar="N", help="at most N rows: a LIMIT on the query itself")

    s = add("search", cmd_search, "search a table: BM25, prefix, tokens, exact, vector or hybrid (BM25 + vector)")
    s.add_argument("column", help="the full-text column searched (vector: the vector column)")
    s.add_argument(
        "query",
        nargs="?",
        help="the text searched for, '-' reads it from stdin (vector: the query vector as a JSON array, or --like)",
    )
    s.add_argument(
        "--kind",
        choices=["bm25", "prefix", "tokens", "exact", "vector", "hybrid"],
        default="bm25",
        help="bm25 (default): ranked by BM25; prefix: the query's last term as a prefix; tokens: every row with "
        "the tokens (unranked); exact: every row whose value equals QUERY; vector: the nearest rows; hybrid: "
        "BM25 and vector fused by reciprocal rank",
    )
    s.add_argument(
        "--limit",
        "-k",
        "--k",
        type=_positive,
        metavar="N",
        help=f"ranked kinds: the best N (default {_DEFAULT_K}); tokens and exact: the first N matches (default all)",
    )
    s.add_argument("--columns", type=_columns, help="comma-separated columns to return besides _id and score")
    s.add_argument(
        "--mode",
        choices=["any", "all", "and", "or"],
        help="bm25: any (default) or all terms; tokens: and (default) or or",
    )
    s.add_argument(
        "--vector", metavar="JSON", help="vector, hybrid: the query vector as a JSON array ('-': from stdin)"
    )
    s.add_argument("--like", metavar="WHERE", help="vector, hybrid: search with the vector of the row matching WHERE")
    s.add_argument("--vector-column", help="hybrid: the vector column (default: the table's only one)")
    s.add_argument("--where", help=f"vector: only rows matching {_WHERE} (filtered inside the search)")
    s.add_argument("--nprobe", type=_positive, help="vector: clusters probed (more: better recall, slower)")
    s.add_argument("--rerank", type=_positive, help="vector: candidates re-scored exactly")
    _time_travel(s)

    c = add("count", cmd_count, "count the rows (matching --where)")
    c.add_argument("--where", help=f"count only rows matching {_WHERE}")
    _time_travel(c)

    de = add("describe", cmd_describe, "the table's columns: type, nullability and indexes")
    _time_travel(de)

    sc = add("scan", cmd_scan, "print the rows (matching --where)")
    sc.add_argument("--where", help=f"only rows matching {_WHERE}")
    sc.add_argument("--columns", type=_columns, help="comma-separated columns (default: all, _id first)")
    sc.add_argument(
        "--limit", type=_positive, metavar="N", help="the first N rows; reads only the superfiles holding them"
    )
    _time_travel(sc)

    cr = add("create", cmd_create, "create a table with the schema of a Parquet, CSV or JSON-lines file")
    cr.add_argument("--schema-from", required=True, metavar="FILE", help="a file whose columns the table gets")
    cr.add_argument("--input-format", choices=INPUT_FORMATS, help="the file's format (default: from its extension)")
    cr.add_argument("--fts", nargs="*", metavar="COLUMN", help="full-text indexed columns")
    cr.add_argument(
        "--vector",
        nargs="*",
        type=_vector_arg,
        metavar="SPEC",
        help="vector columns as name:dim[:metric] (metric: cosine)",
    )
    cr.add_argument("--tokenizer", default="english", help="the full-text tokenizer (default english)")

    a = add("append", cmd_append, "append a Parquet, CSV or JSON-lines file in one commit (all of it or nothing)")
    a.add_argument("file", help="the file; '-' reads it from stdin")
    a.add_argument(
        "--input-format",
        choices=INPUT_FORMATS,
        help="the file's format (default: from its extension, else from its first bytes)",
    )
    a.add_argument(
        "--idempotency-key",
        help="record this key with the commit; appending again with the same key adds nothing",
    )
    a.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )

    dl = add("delete", cmd_delete, "delete the rows matching a SQL predicate, in one commit")
    dl.add_argument("where", help=_WHERE)
    add("stats", cmd_stats, "the table's size: rows, deleted rows, superfiles, manifest parts, cache")
    add("tables", cmd_tables, "list the tables", table=False)
    add("drop", cmd_drop, "drop a table and its files")
    add("versions", cmd_versions, "the retained versions: number, time, operation, rows")
    ch = add("changes", cmd_changes, "rows inserted and deleted between two versions (_change, _id, columns)")
    ch.add_argument("from_version", type=int, metavar="FROM", help="the version the changes start after")
    ch.add_argument("to_version", type=int, nargs="?", metavar="TO", help="the last version (default: the latest)")
    ch.add_argument("--columns", type=_columns, help="comma-separated columns besides _change and _id (default: all)")
    r = add("restore", cmd_restore, "publish a retained version's contents as the newest version")
    r.add_argument("restore_version", type=int, metavar="VERSION", help="the version restored")
    o = add("optimize", cmd_optimize, "compact small superfiles and drop deleted rows")
    size = o.add_mutually_exclusive_group()
    size.add_argument("--target-rows", type=int, help="rows per output superfile (default: the table's maximum)")
    size.add_argument("--target-bytes", type=int, help="size outputs to about this many bytes")
    cl = add("cleanup", cmd_cleanup, "delete the files no retained version needs")
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
    up = add("upgrade", cmd_upgrade, "convert tables of an older format, one commit each (embedded)", table=False)
    up.add_argument("table", nargs="?", help="the table (default: every table)")
    _add_installed_commands(sub, set(sub.choices))
    return p


# -- running -----------------------------------------------------------------------------------------------------
def _fail(message: str, code: int = 1) -> int:
    print(f"error: {_one_line(message)}", file=sys.stderr)
    return code


def _os_error(e: OSError) -> str:
    if e.filename is not None and e.strerror:
        return f"{e.strerror}: {e.filename}"
    return str(e) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    out = None
    if hasattr(args, "format"):
        out = Output(args.format, args.output, args.truncate, args.header)
        if out.format == "parquet" and out.path is None and sys.stdout.isatty():
            return _fail("--format parquet writes binary: give --output FILE or redirect stdout", 2)
    try:
        rows = args.fn(args)
        if rows is not None:
            write(rows, out or Output())
    except BrokenPipeError:  # the reader went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except _UsageError as e:
        return _fail(f"{e} (see superfile {args.command} --help)", 2)
    except SuperfileError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(_os_error(e))
    except pa.ArrowException as e:
        return _fail(str(e))
    except Exception as e:
        if os.environ.get("SUPERFILE_DEBUG"):
            raise
        return _fail(f"unexpected {type(e).__name__}: {e} (SUPERFILE_DEBUG=1 shows where)")
    return 0
