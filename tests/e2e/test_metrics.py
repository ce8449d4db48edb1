"""Every metric a service documents is on its ``/metrics`` from the start: scraped from a fresh process that has
served nothing, the exposition parses (the Prometheus client library's own parser) and lists exactly the metrics
its doc names, with a zero series for each label value the doc enumerates (``{kind=bm25|prefix|...}``).

The gateway, a query root, a cache node and the builder run as real processes; the ingest job's metrics are its
driver's, read in a fresh interpreter that imports them (starting Spark adds nothing to them)."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_support import BuilderProcess, GatewayProcess, wait_until
from prometheus_client.parser import text_string_to_metric_families
from superfile_suite import free_port, start_cache_node, start_query

ROOT = Path(__file__).resolve().parents[2]


def documented(doc: str, prefix: str) -> dict[str, dict[str, set[str]]]:
    """The series ``docs/<doc>`` names with ``prefix`` (as `name` or `name{label,label=a|b}`, `a\\|b` in a table):
    name -> the label values it enumerates."""
    names: dict[str, dict[str, set[str]]] = {}
    for name, labels in re.findall(r"`(" + prefix + r"\w+)(?:\{([^}`]*)\})?`", (ROOT / "docs" / doc).read_text()):
        values = names.setdefault(name, {})
        for label in filter(None, labels.split(",")):
            key, _, listed = label.partition("=")
            if listed and not listed.startswith('"'):  # (a PromQL selector, kind="x", names one series)
                values.setdefault(key.strip(), set()).update(listed.replace("\\", "").split("|"))  # \| in a table
    return names


def exposed(text: str, prefix: str) -> dict[str, list[dict[str, str]]]:
    """The series in an exposition by the names a query uses (counters with ``_total``, histograms by their base
    name, with the labels of their ``_count`` series): name -> the label sets present."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        sample = {"counter": name, "histogram": f"{name}_count"}.get(family.type, name)
        found[name] = [s.labels for s in family.samples if s.name == sample]
    return found


def check(text: str, doc: str, prefix: str) -> None:
    wanted = documented(doc, prefix)
    assert wanted, f"docs/{doc} names no {prefix}* metric"
    have = exposed(text, prefix)
    assert sorted(wanted) == sorted(have), (
        f"missing from a fresh /metrics: {sorted(set(wanted) - set(have))}; "
        f"not in docs/{doc}: {sorted(set(have) - set(wanted))}"
    )
    for name, labels in wanted.items():
        for label, values in labels.items():
            present = {series.get(label) for series in have[name]}
            assert values <= present, f"{name}: no zero series for {label}={sorted(values - present)}"


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_gateway_lists_every_metric_from_the_start(tmp_path: Path) -> None:
    gateway = GatewayProcess(SUPERFILE_STORAGE=f"file://{tmp_path}")
    try:
        check(scrape(gateway.url), "gateway.md", "superfile_gateway_")
    finally:
        gateway.stop()


def test_query_root_and_cache_node_list_every_metric_from_the_start(tmp_path: Path) -> None:
    uri, token = f"file://{tmp_path / 'tables'}", "t" * 32
    with start_cache_node(uri, str(tmp_path / "cache"), token) as node, start_query(uri, [node.url], token) as root:
        check(scrape(root.url), "query.md", "superfile_query_")
        check(scrape(node.url), "query.md", "superfile_cache_")


def test_builder_lists_every_metric_from_the_start(builders: Callable[..., BuilderProcess]) -> None:
    """Before any table exists: every family, without per-table series yet."""
    port = free_port()
    builder = builders(["not_created_yet"], metrics_port=port)

    def answers() -> str | None:
        assert builder.alive, builder.output()
        try:
            return scrape(f"http://127.0.0.1:{port}")
        except OSError:
            return None

    check(wait_until(answers, 60, "the builder's /metrics"), "builder.md", "superfile_builder_")


def test_ingest_job_lists_every_metric_from_the_start() -> None:
    code = "import sys, superfile_ingest; from superfile.telemetry import render; sys.stdout.write(render().decode())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    check(out.stdout, "ingest.md", "superfile_ingest_")


@pytest.mark.parametrize(
    ("doc", "prefix"),
    [
        ("gateway.md", "superfile_gateway_"),
        ("query.md", "superfile_query_"),
        ("query.md", "superfile_cache_"),
        ("builder.md", "superfile_builder_"),
        ("ingest.md", "superfile_ingest_"),
    ],
)
def test_docs_name_every_metric_in_full(doc: str, prefix: str) -> None:
    """No elided names (``..._events_applied_total``) in a metrics section: the lists above are read from them."""
    text = (ROOT / "docs" / doc).read_text()
    assert not re.findall(r"`\.\.\._\w+`|`_\w+_total`", text), doc
    assert documented(doc, prefix)
