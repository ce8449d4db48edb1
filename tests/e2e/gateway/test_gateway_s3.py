"""The gateway over object storage (the real S3 server): the same API, the same results as in-process."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import superfile
from gateway_helpers import SCHEMA, rows
from superfile_gateway import BackgroundServer, Settings
from superfile_gateway.settings import ConfigError


def test_gateway_over_s3(s3_uri: str, tmp_path: Path) -> None:
    env = {"SUPERFILE_STORAGE": s3_uri, "SUPERFILE_API_KEYS": "s3-key:*:rw", "SUPERFILE_CACHE_DIR": str(tmp_path)}
    settings = Settings.from_env(env | {"SUPERFILE_CACHE_BUDGET_BYTES": str(1 << 30)})
    assert settings.cache_budget_bytes == 1 << 30 and settings.cache_memory_bytes is None
    with BackgroundServer(settings) as srv, superfile.connect(srv.url, api_key="s3-key") as db:
        table = db.create_table("docs", SCHEMA, fts_columns=["title"], vector_columns={"emb": 4})
        assert table.append(rows(range(30))) == 2
        assert table.delete("key >= 25") == 3
        remote = table.bm25_search("title", "document 7 flow", k=5, projection=["key"])
        local = superfile.connect(s3_uri).open_table("docs")
        assert remote.equals(local.bm25_search("title", "document 7 flow", k=5, projection=["key"]))
        assert table.count_rows() == local.count_rows() == 25
        assert db.table_names() == ["docs"]
        # the gateway read its superfiles from the disk cache it was configured with
        stats = table.stats()
        assert stats["cache_budget_bytes"] == 1 << 30 and stats["cache_resident_superfiles"] >= 1
        assert any((tmp_path / "superfiles").iterdir())
        metrics = {
            line.split("{")[0].split(" ")[0]: float(line.split(" ")[-1])
            for line in httpx.get(f"{srv.url}/metrics").text.splitlines()
            if line.startswith("superfile_gateway_cache_")
        }
        assert metrics["superfile_gateway_cache_superfiles"] >= stats["cache_resident_superfiles"]
        assert metrics["superfile_gateway_cache_fetches_total"] >= 1
        assert metrics["superfile_gateway_cache_budget_bytes"] >= 1 << 30


def _metrics(url: str, prefix: str) -> dict[str, float]:
    return {
        line.split("{")[0].split(" ")[0]: float(line.split(" ")[-1])
        for line in httpx.get(f"{url}/metrics").text.splitlines()
        if line.startswith(prefix)
    }


def test_a_new_version_is_warmed_before_it_is_searched(s3_uri: str, tmp_path: Path) -> None:
    """A commit the gateway did not make (another writer's) is warmed in the background: its superfile is
    downloaded and opened before the next search, which then downloads nothing and answers as in-process."""
    env = {"SUPERFILE_STORAGE": s3_uri, "SUPERFILE_API_KEYS": "s3-key:*:rw", "SUPERFILE_CACHE_DIR": str(tmp_path)}
    settings = Settings.from_env(env | {"SUPERFILE_WARM_INTERVAL_S": "0.1"})
    assert settings.warm_interval_s == 0.1
    writer = superfile.connect(s3_uri, cache_budget_bytes=0)
    table = writer.create_table("docs", SCHEMA, fts_columns=["title"], vector_columns={"emb": 4})
    table.append(rows(range(30)))
    with BackgroundServer(settings) as srv, superfile.connect(srv.url, api_key="s3-key") as db:
        remote = db.open_table("docs")
        assert remote.count_rows() == 30  # the gateway reads the table from now on
        warmed = _metrics(srv.url, "superfile_gateway_warm_duration_seconds_count")
        version = table.append(rows(range(30, 60)))
        deadline = time.monotonic() + 30
        copies = tmp_path / "superfiles"
        while True:  # the new version warmed: every superfile of it has its copy in the gateway's cache
            whole = [p for p in copies.iterdir() if not p.name.endswith(".part")] if copies.exists() else []
            now = _metrics(srv.url, "superfile_gateway_warm_duration_seconds_count")
            if len(whole) >= len(table._snapshot.entries()) and now != warmed:
                break
            assert time.monotonic() < deadline, f"version {version} not warmed within 30 s"
            time.sleep(0.05)
        fetched = _metrics(srv.url, "superfile_gateway_cache_fetches_total")["superfile_gateway_cache_fetches_total"]
        got = remote.bm25_search("title", "document 42 flow", k=5, projection=["key"])
        assert got.equals(table.bm25_search("title", "document 42 flow", k=5, projection=["key"]))
        near = remote.vector_search("emb", [1.0, 0.0, 0.0, 0.0], k=5, projection=["key"])
        assert near.equals(table.vector_search("emb", [1.0, 0.0, 0.0, 0.0], k=5, projection=["key"]))
        after = _metrics(srv.url, "superfile_gateway_cache_fetches_total")["superfile_gateway_cache_fetches_total"]
        assert after == fetched  # nothing downloaded on the search path


def test_a_bounded_table_is_served_its_newest_version_once_warm(s3_uri: str, tmp_path: Path) -> None:
    """A ``bounded`` table's reads are served the version the warm prepared: another writer's commit becomes
    visible through the gateway without any read refreshing itself (its staleness bound here is an hour, which
    alone would keep the old version), and the search that first sees it downloads nothing."""
    env = {"SUPERFILE_STORAGE": s3_uri, "SUPERFILE_API_KEYS": "s3-key:*:rw", "SUPERFILE_CACHE_DIR": str(tmp_path)}
    settings = Settings.from_env(env | {"SUPERFILE_WARM_INTERVAL_S": "0.1"})
    writer = superfile.connect(s3_uri, cache_budget_bytes=0)
    table = writer.create_table(
        "docs", SCHEMA, fts_columns=["title"], vector_columns={"emb": 4}, consistency="bounded", max_staleness_s=3600.0
    )
    table.append(rows(range(30)))
    with BackgroundServer(settings) as srv, superfile.connect(srv.url, api_key="s3-key") as db:
        remote = db.open_table("docs")
        assert remote.count_rows() == 30  # the gateway reads the table from now on
        table.append(rows(range(30, 60)))
        deadline = time.monotonic() + 30
        while remote.version != table.version:  # the warm serves the new version; no read refreshes itself
            assert time.monotonic() < deadline, "the new version was not served within 30 s"
            time.sleep(0.05)
        fetched = _metrics(srv.url, "superfile_gateway_cache_fetches_total")["superfile_gateway_cache_fetches_total"]
        got = remote.bm25_search("title", "document 42 flow", k=5, projection=["key"])
        assert got.equals(table.bm25_search("title", "document 42 flow", k=5, projection=["key"]))
        assert remote.count_rows() == 60
        after = _metrics(srv.url, "superfile_gateway_cache_fetches_total")["superfile_gateway_cache_fetches_total"]
        assert after == fetched  # nothing downloaded on the search path


def test_the_follower_looks_at_versions_often_and_lists_tables_once_an_interval(tmp_path: Path) -> None:
    """Each look reads every followed table's newest version and acts once per new one; the list of tables
    (a storage listing in a query service) is asked again only once ``interval_s`` has passed."""
    from superfile_gateway.warm import FollowCommits

    uri = f"file://{tmp_path}/db"
    writer = superfile.connect(uri).create_table(
        "docs", SCHEMA, fts_columns=["title"], consistency="bounded", max_staleness_s=0.2
    )
    writer.append(rows(range(5)))
    handle = superfile.connect(uri).open_table("docs")
    listed: list[float] = []
    acted: list[int] = []

    def tables() -> list[superfile.Supertable]:
        listed.append(time.monotonic())
        return [handle]

    follow = FollowCommits(tables, lambda name, snapshot: acted.append(snapshot.version), interval_s=3600.0)
    try:
        follow.once()
        follow.once()
        writer.append(rows(range(5, 10)))
        follow.once()
        assert len(listed) == 1
        assert acted == [writer.version - 1, writer.version]
        assert handle.count_rows() == 10  # served by the last look, within its bound
    finally:
        follow.close()


def test_only_tables_used_lately_are_warmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warmer follows the tables the gateway used in the last ten minutes; one left idle longer drops out
    until it is used again. A gateway forwarding its reads to a query service has no warmer."""
    from superfile_gateway import gateway as gateway_module

    storage = f"file://{tmp_path}/db"
    superfile.connect(storage).create_table("docs", SCHEMA, fts_columns=["title"]).append(rows(range(5)))
    gw = gateway_module.Gateway(Settings(storage=storage, auth=False))
    try:
        assert gw.warmer is not None and gw.tables_in_use() == []
        gw.table("docs")
        assert [t.name for t in gw.tables_in_use()] == ["docs"]
        monkeypatch.setattr(gateway_module, "_WARM_IDLE_S", 0.5)
        time.sleep(0.6)
        assert gw.tables_in_use() == []
        gw.table("docs")
        assert [t.name for t in gw.tables_in_use()] == ["docs"]
    finally:
        gw.close()
    forwarding = Settings(storage=storage, auth=False, query_url="http://127.0.0.1:9", internal_token="t")
    gw = gateway_module.Gateway(forwarding)
    try:
        assert gw.warmer is None
    finally:
        gw.close()


def test_gateway_cache_settings_are_checked() -> None:
    base = {"SUPERFILE_STORAGE": "memory://x", "SUPERFILE_NO_AUTH": "1"}
    assert Settings.from_env(base | {"SUPERFILE_CACHE_MEMORY_BYTES": "1024"}).cache_memory_bytes == 1024
    for bad in (
        {"SUPERFILE_CACHE_BUDGET_BYTES": "-1"},
        {"SUPERFILE_CACHE_MEMORY_BYTES": "0"},
        {"SUPERFILE_CACHE_BUDGET_BYTES": "x"},
        {"SUPERFILE_WARM_INTERVAL_S": "-1"},
    ):
        with pytest.raises(ConfigError):
            Settings.from_env(base | bad)
