"""The gateway over object storage (the real S3 server): the same API, the same results as in-process."""

from __future__ import annotations

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


def test_gateway_cache_settings_are_checked() -> None:
    base = {"SUPERFILE_STORAGE": "memory://x", "SUPERFILE_NO_AUTH": "1"}
    assert Settings.from_env(base | {"SUPERFILE_CACHE_MEMORY_BYTES": "1024"}).cache_memory_bytes == 1024
    for bad in (
        {"SUPERFILE_CACHE_BUDGET_BYTES": "-1"},
        {"SUPERFILE_CACHE_MEMORY_BYTES": "0"},
        {"SUPERFILE_CACHE_BUDGET_BYTES": "x"},
    ):
        with pytest.raises(ConfigError):
            Settings.from_env(base | bad)
