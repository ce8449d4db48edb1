"""One local Spark session for all the ingest tests (~15 s to start), its Python workers able to reach the S3 server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from superfile_ingest.example import local_session
from superfile_suite import Server


@pytest.fixture(scope="session")
def spark(s3: Server) -> Iterator[SparkSession]:
    """Started with the S3 client settings in the environment: Spark's Python processes inherit it at launch."""
    with pytest.MonkeyPatch.context() as env:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": s3.url,
        }.items():
            env.setenv(key, value)
        session = local_session(app_name="superfile-ingest-tests")
        yield session
        session.stop()


@pytest.fixture(autouse=True)
def _no_query_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test must not leave a streaming query running in the shared session."""
    yield
    if "spark" in request.fixturenames:
        session: SparkSession = request.getfixturevalue("spark")
        for query in session.streams.active:
            query.stop()
