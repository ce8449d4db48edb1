"""The gateway over object storage (the real S3 server): the same API, the same results as in-process."""

from __future__ import annotations

import superfile
from gateway_helpers import SCHEMA, rows
from superfile_gateway import BackgroundServer, Settings, parse_api_keys


def test_gateway_over_s3(s3_uri: str) -> None:
    settings = Settings(storage=s3_uri, api_keys=parse_api_keys("s3-key:*:rw"))
    with BackgroundServer(settings) as srv, superfile.connect(srv.url, api_key="s3-key") as db:
        table = db.create_table("docs", SCHEMA, fts_columns=["title"], vector_columns={"emb": 4})
        assert table.append(rows(range(30))) == 2
        assert table.delete("key >= 25") == 3
        remote = table.bm25_search("title", "document 7 flow", k=5, projection=["key"])
        local = superfile.connect(s3_uri).open_table("docs")
        assert remote.equals(local.bm25_search("title", "document 7 flow", k=5, projection=["key"]))
        assert table.count_rows() == local.count_rows() == 25
        assert db.table_names() == ["docs"]
