"""The leaf of a fan-out: one request runs one kind of per-superfile work over a share of a pinned snapshot.

A query root (``superfile.search.root``) plans a read against one manifest,
splits the superfiles it kept among cache nodes, and sends each node a
:class:`LeafRequest` naming the manifest, the node's share and the work. The
node runs the same engine code an embedded search runs (``Searcher`` over the
share, with the root's table-wide BM25 statistics), so every search kind has
one implementation whichever process runs it. Tables come back as Arrow IPC;
statistics as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from superfile.errors import InvalidInputError
from superfile.expressions import parse_predicate
from superfile.format.fulltext import CorpusStats
from superfile.search.request import VectorSearch
from superfile.table.search import Searcher
from superfile.table.snapshot import Snapshot

__all__ = ["OPS", "PARTS", "LeafRequest", "run"]

# the first five answer a table (Arrow IPC), the other three statistics (JSON); bm25_stats also superfile by
# superfile ("superfiles": [[path, df per term, length], ...]), which a query root keeps across versions
OPS = frozenset({"bm25", "token_match", "exact_match", "vector", "scan", "bm25_stats", "prefix_terms", "count"})
PARTS = "superfile.parts"  # a scan's schema metadata: [[superfile path, rows], ...] in the order of its rows


@dataclass(frozen=True)
class LeafRequest:
    """One node's share of one read: which table version, which of its superfiles, what to run on them."""

    table: str
    manifest: str
    superfiles: tuple[str, ...]
    op: str
    args: Mapping[str, Any] = field(default_factory=dict)
    # a hedge to a node that does not own these superfiles: read what the work needs, keep no copies
    transient: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "manifest": self.manifest,
            "superfiles": list(self.superfiles),
            "op": self.op,
            "args": dict(self.args),
            "transient": self.transient,
        }

    def encode(self, args_json: str | None = None) -> bytes:
        """The request's JSON body; ``args_json``: its ``args`` already encoded (a root encodes a read's
        arguments, a query vector among them, once for all its leaf calls)."""
        head = {k: v for k, v in self.to_json().items() if k != "args"}
        args = json.dumps(dict(self.args)) if args_json is None else args_json
        return f'{json.dumps(head)[:-1]}, "args": {args}}}'.encode()

    @classmethod
    def from_json(cls, body: object) -> LeafRequest:
        """The request a JSON body describes; an :class:`InvalidInputError` naming what is wrong otherwise."""
        if not isinstance(body, dict):
            raise InvalidInputError("a leaf request is a JSON object")
        for name, kind in (("table", str), ("manifest", str), ("op", str), ("superfiles", list), ("args", dict)):
            if not isinstance(body.get(name), kind):
                raise InvalidInputError(f"a leaf request needs {name!r} as a {kind.__name__}")
        if body["op"] not in OPS:
            raise InvalidInputError(f"unknown leaf op {body['op']!r}; one of {sorted(OPS)}")
        if not all(isinstance(p, str) for p in body["superfiles"]):
            raise InvalidInputError("superfiles must be a list of paths")
        transient = body.get("transient", False)
        if not isinstance(transient, bool):
            raise InvalidInputError("transient must be a boolean")
        return cls(body["table"], body["manifest"], tuple(body["superfiles"]), body["op"], body["args"], transient)


def _arg(args: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    value = args.get(name, default)
    if value is ...:
        raise InvalidInputError(f"leaf op needs the argument {name!r}")
    if value is not None and not isinstance(value, kind):
        raise InvalidInputError(f"leaf argument {name!r} has the wrong type")
    return value


def run(snapshot: Snapshot, request: LeafRequest) -> pa.Table | dict[str, Any]:
    """Run ``request`` over its share of ``snapshot`` (the manifest it names)."""
    share = snapshot.restricted(request.superfiles)
    held = {e.path for e in share.entries()}
    unknown = [p for p in request.superfiles if p not in held]
    if unknown:
        raise InvalidInputError(
            f"{len(unknown)} superfiles are not live in manifest {request.manifest!r}, e.g. {unknown[0]!r}"
        )
    a = request.args
    op = request.op
    projection = _arg(a, "projection", list, None)
    if op == "bm25":
        terms = _arg(a, "terms", list)
        corpus = CorpusStats(
            _arg(a, "num_docs", int), _arg(a, "total_tokens", int), dict(zip(terms, _arg(a, "df", list), strict=True))
        )
        return Searcher(share, corpus).bm25(
            _arg(a, "column", str), terms, _arg(a, "k", int), _arg(a, "mode", str), projection
        )
    if op == "bm25_stats":
        terms = _arg(a, "terms", list)
        each = Searcher(share).term_stats_each(_arg(a, "column", str), terms)
        df, deleted_tokens = Searcher.summed(each, len(terms))
        return {
            "df": df,
            "deleted_tokens": deleted_tokens,
            "superfiles": [[path, counts, length] for path, counts, length in each],
        }
    if op == "prefix_terms":
        return {"terms": Searcher(share).prefix_terms(_arg(a, "column", str), _arg(a, "term", str))}
    if op == "token_match":
        return Searcher(share).token_match(
            _arg(a, "column", str),
            _arg(a, "tokens", list),
            _arg(a, "mode", str),
            projection,
            _arg(a, "max_rows", int, None),
        )
    if op == "exact_match":
        return Searcher(share).exact_match(
            _arg(a, "column", str), _arg(a, "value", str), projection, _arg(a, "max_rows", int, None)
        )
    if op == "vector":  # through search(), which counts it in flight: a busy node keeps each on one core
        return Searcher(share).search(
            VectorSearch(
                column=_arg(a, "column", str),
                vector=_arg(a, "vector", list),
                k=_arg(a, "k", int),
                nprobe=_arg(a, "nprobe", int, None),
                rerank=_arg(a, "rerank", int, None),
                filter=_arg(a, "filter", dict, None),
                where=_arg(a, "where", str, None),
                projection=projection,
            )
        )
    where_text = _arg(a, "where", str, None)
    where = parse_predicate(where_text, share.schema) if where_text is not None else None
    if op == "count":
        return {"count": share.count(where)}
    columns = _arg(a, "columns", list)
    named = share.scan_named(columns, where)
    schema = pa.schema([share.schema.field(c) for c in columns])
    table = pa.concat_tables([t for _, t in named]) if named else schema.empty_table()
    return table.replace_schema_metadata({PARTS: json.dumps([[path, t.num_rows] for path, t in named])})
