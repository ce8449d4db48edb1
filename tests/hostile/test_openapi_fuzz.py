"""Schemathesis against the gateway's own OpenAPI document: generated requests to every operation (a bounded
number each, with a key that may read and write) never get a 5xx, and the gateway stays up."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import schemathesis
import superfile
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from e2e_support import GatewayProcess

KEY = "fuzz-owner-key"
EXAMPLES = 25  # per operation: ~30 operations, about 700 requests in all


@pytest.fixture(scope="module")
def fuzzed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    db = superfile.connect(f"file://{root}")
    table = db.create_table("a", pa.schema([("id", pa.int64()), ("text", pa.string())]), fts_columns=["text"])
    table.append({"id": list(range(50)), "text": [f"row {i}" for i in range(50)]})
    gateway = GatewayProcess(SUPERFILE_STORAGE=f"file://{root}", SUPERFILE_API_KEYS=f"{KEY}:*:rw")
    yield gateway
    assert httpx.get(f"{gateway.url}/healthz", timeout=5).status_code == 200, gateway.output()[-3000:]
    gateway.stop()


@pytest.fixture(scope="module")
def api_schema(fuzzed_gateway: GatewayProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzzed_gateway.url}/openapi.json")


def test_no_operation_answers_a_server_error(
    api_schema: schemathesis.BaseSchema, fuzzed_gateway: GatewayProcess
) -> None:
    # schemathesis's pytest plugin does not load under this pytest: its strategies run under hypothesis here
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 25  # every route of the API (28 today)

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def call(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzzed_gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

        call()
    assert not failures, failures[:5]
