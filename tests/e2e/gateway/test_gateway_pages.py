"""The pages a person opens on the gateway, in headless Chromium (Debian's ``chromium``, driven by Playwright
through its executable path; ``make install-test`` installs both): the OpenAPI docs render with no network
but the gateway's own address, and the search playground at ``/`` runs BM25, vector-by-example, hybrid and SQL
and shows what the SDK returns for the same queries."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any, cast
from urllib.parse import urljoin, urlsplit

import httpx
import pyarrow as pa
import pytest
import superfile
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright
from superfile.remote import RemoteConnection
from superfile_gateway import BackgroundServer

READER = "reader-key"  # may read every table (gateway_helpers.KEYS), and nothing more
CHROMIUM_FLAGS = [  # root needs --no-sandbox; the rest keep Chromium from calling hosts this machine cannot reach
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = '<img src=x onerror="window.__xss = 1"> <b>flow</b> & "quotes"'


def chromium_path() -> str:
    found = os.environ.get("SUPERFILE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(found):
        pytest.fail(f"no Chromium at {found}: `make install-test` installs chromium, or set SUPERFILE_CHROMIUM")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def offline_page(browser: Browser, server: BackgroundServer) -> Iterator[tuple[Page, list[str]]]:
    """A page that can reach the gateway and nothing else; the list collects every other URL it asked for."""
    context = browser.new_context()
    page = context.new_page()
    own = urlsplit(server.url).netloc
    refused: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if urlsplit(route.request.url).netloc == own:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_gateway)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page, refused
    context.close()
    assert not errors, errors


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.urls.append(value)


def _urls_in(html: str) -> list[str]:
    parser = _Assets()
    parser.feed(html)
    return parser.urls + re.findall(r"""["'](https?://[^"']+|/[^"'\s]*\.(?:js|css|png|json))["']""", html)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/"])
def test_pages_load_only_their_own_assets(http: httpx.Client, server: BackgroundServer, path: str) -> None:
    """Every script, style sheet and icon a page names is on the gateway itself, and the gateway serves it."""
    page = http.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:300]
    urls = _urls_in(page.text)
    assert urls, page.text[:500]
    own = urlsplit(server.url).netloc
    for url in urls:
        absolute = urljoin(f"{server.url}{path}", url)
        assert urlsplit(absolute).netloc == own, f"{path} loads {url} from another host"
        if absolute.rsplit(".", 1)[-1] in ("js", "css", "png"):
            asset = http.get(absolute)
            assert asset.status_code == 200 and asset.content, absolute


def test_openapi_docs_render_offline(offline_page: tuple[Page, list[str]], server: BackgroundServer) -> None:
    """Swagger UI at /docs draws the operations from /openapi.json with every other host unreachable."""
    page, refused = offline_page
    page.goto(f"{server.url}/docs")
    operations = page.locator(".opblock-summary-path")
    expect(operations.first).to_be_visible(timeout=20_000)
    paths = {p.strip().replace("\u200b", "") for p in operations.all_inner_texts()}
    assert {"/tables", "/tables/{name}/search/bm25", "/tables/{name}/search/hybrid", "/sql"} <= paths, paths
    assert not refused, refused


# -- the playground ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def play(engine: superfile.Connection, server: BackgroundServer) -> str:
    """``play``: 30 rows with a text column, distinct 4-d vectors and one hostile title."""
    fields: list[pa.Field] = [
        pa.field("key", pa.int64()),
        pa.field("title", pa.string()),
        pa.field("emb", pa.list_(pa.float32(), 4)),
    ]
    schema = pa.schema(fields)
    table = engine.create_table("play", schema, fts_columns=["title"], vector_columns={"emb": 4})
    words = ["flow", "boundary", "layer", "shock", "wave", "wing"]
    rows = [
        {
            "key": i,
            "title": f"{words[i % 6]} {words[(i * 5 + 1) % 6]} flow study {i}" if i % 3 else f"{words[i % 6]} {i}",
            "emb": [1.0 + i % 5, float(i % 7), float((i * 3) % 11) / 3, 0.5 + i / 10],
        }
        for i in range(30)
    ]
    rows[4]["title"] = HOSTILE
    table.append(rows)
    return "play"


@pytest.fixture(scope="module")
def sdk(server: BackgroundServer) -> Iterator[RemoteConnection]:
    db = RemoteConnection(server.url, api_key=READER)
    yield db
    db.close()


def _results(page: Page) -> dict[str, Any]:
    """What the results table shows: its header and each row's cells, as text."""
    result: dict[str, Any] = page.eval_on_selector(
        "#results table",
        """t => ({
            columns: [...t.tHead.rows[0].cells].map(c => c.textContent),
            rows: [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent)),
        })""",
    )
    return result


def _run(page: Page, tab: str, fields: dict[str, str]) -> dict[str, Any]:
    """Open ``tab``, fill its form, run it and wait for its answer."""
    done = int(page.locator("#status").get_attribute("data-runs") or 0)
    page.click(f"[data-tab={tab}]")
    form = page.locator(f"#form-{tab}")
    expect(form).to_be_visible()
    for other in {"bm25", "vector", "hybrid", "sql"} - {tab}:
        expect(page.locator(f"#form-{other}")).to_be_hidden()
    for name, value in fields.items():
        field = form.locator(f"[name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    form.locator("button[type=submit]").click()
    expect(page.locator("#status")).to_have_attribute("data-runs", str(done + 1), timeout=20_000)
    assert page.locator("#status").get_attribute("data-state") == "ok", page.locator("#status").inner_text()
    return _results(page)


def _ids_and_scores(shown: dict[str, Any]) -> list[tuple[int, float]]:
    i, s = shown["columns"].index("_id"), shown["columns"].index("score")
    return [(int(row[i]), float(row[s])) for row in shown["rows"]]


def _expected(table: pa.Table) -> list[tuple[int, float]]:
    ids = cast(list[int], table.column("_id").to_pylist())
    scores = cast(list[float], table.column("score").to_pylist())
    return list(zip(ids, scores, strict=True))


def _same(shown: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    assert [i for i, _ in shown] == [i for i, _ in expected], (shown, expected)
    assert [s for _, s in shown] == pytest.approx([s for _, s in expected], rel=1e-6), (shown, expected)


def test_playground_runs_every_kind_and_shows_what_the_sdk_returns(
    offline_page: tuple[Page, list[str]], server: BackgroundServer, play: str, sdk: RemoteConnection
) -> None:
    page, refused = offline_page
    page.goto(f"{server.url}/")
    page.fill("#api-key", READER)
    page.click("#load-tables")
    expect(page.locator("#table option[value=play]")).to_have_count(1, timeout=20_000)
    page.select_option("#table", "play")
    expect(page.locator("#form-bm25 [name=column] option[value=title]")).to_have_count(1, timeout=20_000)
    table = sdk.open_table("play")
    shown_columns = ["_id", "score", "key", "title"]  # the page projects the columns that are not vectors

    bm25 = _run(page, "bm25", {"column": "title", "query": "flow study", "k": "7"})
    assert bm25["columns"] == shown_columns
    _same(_ids_and_scores(bm25), _expected(table.bm25_search("title", "flow study", k=7)))
    assert len(bm25["rows"]) == 7

    example = table.to_arrow(columns=["emb"], where="_id = 12").column("emb").to_pylist()[0]
    vector = _run(page, "vector", {"column": "emb", "example": "12", "k": "5"})
    assert vector["columns"] == shown_columns
    expected_vector = _expected(table.vector_search("emb", example, k=5))
    _same(_ids_and_scores(vector), expected_vector)
    assert expected_vector[0][0] == 12  # the example is its own nearest neighbour

    hybrid = _run(
        page,
        "hybrid",
        {"text_column": "title", "query": "shock wave", "vector_column": "emb", "example": "12", "k": "6"},
    )
    assert hybrid["columns"] == shown_columns
    _same(_ids_and_scores(hybrid), _expected(table.hybrid_search("title", "shock wave", "emb", example, k=6)))

    query = "SELECT _id, score, key FROM bm25_search('play', 'title', 'boundary', 4) ORDER BY score DESC, _id"
    sql = _run(page, "sql", {"query": query})
    assert sql["columns"] == ["_id", "score", "key"]
    _same(_ids_and_scores(sql), _expected(sdk.sql(query)))
    assert [int(r[2]) for r in sql["rows"]] == sdk.sql(query).column("key").to_pylist()

    # values are text, never markup: the hostile title shows as typed and adds no element
    hostile = _run(page, "sql", {"query": "SELECT key, title FROM play WHERE key = 4"})
    assert hostile["rows"] == [["4", HOSTILE]]
    assert page.locator("#results img, #results b").count() == 0
    assert page.evaluate("window.__xss") is None
    assert not refused, refused


def test_playground_keeps_the_key_for_the_session_and_says_what_went_wrong(
    offline_page: tuple[Page, list[str]], server: BackgroundServer, play: str
) -> None:
    page, _ = offline_page
    page.goto(f"{server.url}/")
    page.fill("#api-key", "not-a-key")
    page.click("#load-tables")
    expect(page.locator("#status")).to_have_attribute("data-state", "error", timeout=20_000)
    expect(page.locator("#status")).to_contain_text("AuthenticationError")
    page.fill("#api-key", READER)
    page.click("#load-tables")
    expect(page.locator("#table option[value=play]")).to_have_count(1, timeout=20_000)
    page.reload()  # the key stays for the tab's session (sessionStorage), not in the URL or a cookie
    assert page.locator("#api-key").input_value() == READER
    assert page.evaluate("document.cookie") == "" and READER not in page.url
    page.select_option("#table", "play")
    expect(page.locator("#form-bm25 [name=column] option[value=title]")).to_have_count(1, timeout=20_000)
    page.locator("#form-bm25 [name=column]").select_option("title")
    failed_runs = int(page.locator("#status").get_attribute("data-runs") or 0)
    page.click("[data-tab=sql]")
    page.locator("#form-sql [name=query]").fill("SELECT nope FROM play")
    page.locator("#form-sql button[type=submit]").click()
    expect(page.locator("#status")).to_have_attribute("data-runs", str(failed_runs + 1), timeout=20_000)
    assert page.locator("#status").get_attribute("data-state") == "error"
    expect(page.locator("#status")).to_contain_text("400")
