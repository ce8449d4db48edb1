"""Static analysis of a query with sqlglot: which tables it names, which columns it may need, what to push down.

Everything here is a *hint* that must stay conservative: the columns found are
a superset of the ones the query reads, and a pushed-down filter is only ever
a conjunct of the ``WHERE`` of a ``SELECT`` whose only input is that table, so
the full query (which DataFusion still runs unchanged) gives the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

__all__ = ["QueryHints", "analyze"]

_DIALECTS = ("postgres", "duckdb", None)


@dataclass
class QueryHints:
    """What the query may touch, as far as a parse can tell."""

    parsed: bool = False
    star: bool = True  # ``*`` (or an unparsable query): every scalar column may be needed
    identifiers: set[str] = field(default_factory=set)  # every identifier, as written and lower-cased
    words: set[str] = field(default_factory=set)  # every word of the text (table discovery fallback)
    tables: set[str] | None = (
        None  # names in FROM / JOIN positions but CTEs', as written and lower-cased (None: unparsed)
    )
    pushdown: dict[str, list[exp.Expression]] = field(default_factory=dict)  # table name -> its WHERE conjuncts
    count: tuple[str, str] | None = None  # (table, result column) of ``SELECT count(*) FROM table [WHERE pushed]``
    fetch: tuple[str, list[str]] | None = None  # (table, columns) of ``SELECT column, ... FROM table WHERE pushed``

    def mentions_table(self, name: str) -> bool:
        """Whether the query may scan table ``name`` (table functions load their tables on their own)."""
        names = self.words if self.tables is None else self.tables
        return name in names or name.lower() in names

    def columns(self, names: Iterable[str]) -> list[str] | None:
        """The subset of ``names`` the query may read (``None``: all of them)."""
        if self.star:
            return None
        return [n for n in names if n in self.identifiers or n.lower() in self.identifiers]


def _parse(query: str) -> Any:
    for dialect in _DIALECTS:
        try:
            statements = sqlglot.parse(query, read=dialect)
        except Exception:
            continue
        if len(statements) == 1 and statements[0] is not None:
            return statements[0]
    return None


def _named_tables(tree: exp.Expression) -> list[exp.Table]:
    return [t for t in tree.find_all(exp.Table) if isinstance(t.this, exp.Identifier)]


def _conjuncts(node: Any) -> list[Any]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


_SIMPLE = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Neg,
    exp.Paren,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.In,
    exp.Between,
    exp.Is,
    exp.Not,
    exp.Or,
    exp.And,
)  # LIKE is left to DataFusion: it cannot prune superfiles, and DataFusion's matcher is faster than Arrow's


def _pushable(conjunct: exp.Expression, qualifiers: set[str]) -> bool:
    """Only column-vs-literal comparisons (and their AND/OR/NOT): no arithmetic, casts, functions or subqueries,
    so the engine's predicate evaluator and DataFusion cannot disagree on coercions."""
    if not all(isinstance(n, _SIMPLE) for n in conjunct.walk()):
        return False
    cols = list(conjunct.find_all(exp.Column))
    if not cols:
        return False
    return all(not c.table or c.table in qualifiers for c in cols)


def _find_pushdown(tree: exp.Expression, hints: QueryHints) -> None:
    named = _named_tables(tree)
    counts: dict[str, int] = {}
    for t in named:
        counts[t.name] = counts.get(t.name, 0) + 1
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    for t in named:
        if counts[t.name] != 1 or t.name in ctes or t.args.get("db") or t.args.get("catalog"):
            continue
        select = t.parent_select
        if select is None or select.args.get("joins") or t.find_ancestor(exp.Join) is not None:
            continue
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None or from_.this is not t:
            continue
        where = select.args.get("where")
        if where is None:
            continue
        qualifiers = {t.name, t.alias_or_name}
        pushed = [
            # qualifiers are dropped: the predicate is evaluated over this table alone
            c.transform(lambda n: exp.column(n.name, quoted=True) if isinstance(n, exp.Column) else n)
            for c in _conjuncts(where.this)
            if _pushable(c, qualifiers)
        ]
        if pushed:
            hints.pushdown[t.name] = pushed


_NOT_A_PLAIN_COUNT = ("joins", "group", "having", "order", "limit", "offset", "distinct", "qualify", "with_", "with")


def _find_count(tree: exp.Expression, hints: QueryHints) -> None:
    """``SELECT count(*) [AS n] FROM t [WHERE ...]`` with every conjunct of its WHERE pushed into ``t``'s scan:
    the answer is the number of rows the scan keeps, so the snapshot counts them (from the indexes alone where
    they answer the predicate) and no row goes to DataFusion."""
    if not isinstance(tree, exp.Select) or any(tree.args.get(k) for k in _NOT_A_PLAIN_COUNT):
        return
    if len(tree.expressions) != 1:
        return
    projection = tree.expressions[0]
    counted = projection.this if isinstance(projection, exp.Alias) else projection
    if not (isinstance(counted, exp.Count) and isinstance(counted.this, exp.Star)):
        return
    from_ = tree.args.get("from_") or tree.args.get("from")
    table = from_.this if from_ is not None else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        return
    if table.args.get("db") or table.args.get("catalog"):
        return
    where = tree.args.get("where")
    if where is not None and len(hints.pushdown.get(table.name, ())) != len(_conjuncts(where.this)):
        return
    column = "count(*)"
    if isinstance(projection, exp.Alias):
        alias = projection.args["alias"]
        column = alias.name if alias.quoted else alias.name.lower()  # DataFusion folds unquoted names
    hints.count = (table.name, column)


_A_FETCH = {"expressions", "from", "from_", "where"}  # all a plain fetch has


def _find_fetch(tree: exp.Expression, hints: QueryHints) -> None:
    """``SELECT a, b FROM t WHERE ...`` (distinct plain columns, nothing else) with every conjunct of its WHERE
    pushed into ``t``'s scan: the answer is the rows the scan keeps, so DataFusion is not needed. The columns
    are named as DataFusion resolves them: unquoted names folded to lower case."""
    if not isinstance(tree, exp.Select) or any(v for k, v in tree.args.items() if k not in _A_FETCH):
        return
    from_ = tree.args.get("from_") or tree.args.get("from")
    table = from_.this if from_ is not None else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        return
    if any(table.args.get(k) for k in ("db", "catalog", "alias")):
        return
    where = tree.args.get("where")
    if where is None or len(hints.pushdown.get(table.name, ())) != len(_conjuncts(where.this)):
        return
    columns = []
    for projection in tree.expressions:
        if (
            not isinstance(projection, exp.Column)
            or projection.table
            or not isinstance(projection.this, exp.Identifier)
        ):
            return
        ident = projection.this
        columns.append(ident.name if ident.quoted else ident.name.lower())
    if columns and len(set(columns)) == len(columns):
        hints.fetch = (table.name, columns)


def analyze(query: str) -> QueryHints:
    """Hints for ``query``; an unparsable query gets the fully conservative hints."""
    hints = QueryHints(words={w for w in re.findall(r"[A-Za-z0-9_\-]+", query)})
    hints.words |= {w.lower() for w in hints.words}
    tree = _parse(query)
    if tree is None:
        return hints
    hints.parsed = True
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    named = {t.name for t in _named_tables(tree)}
    hints.tables = {n for n in named | {n.lower() for n in named} if n.lower() not in ctes}
    hints.star = any(isinstance(s.parent, exp.Select | exp.Column) for s in tree.find_all(exp.Star))
    for ident in tree.find_all(exp.Identifier):
        hints.identifiers.add(ident.name)
        hints.identifiers.add(ident.name.lower())
    try:
        _find_pushdown(tree, hints)
        _find_count(tree, hints)
        _find_fetch(tree, hints)
    except Exception:
        hints.pushdown.clear()
        hints.count = None
        hints.fetch = None
    return hints
