"""Shared fixtures: one moto S3 server per session, fresh buckets, a URI per backend, and a count of the
superfile readers a test opens.

``storage_uri`` is the fixture most tests want: it runs a test once per
backend (memory, file, s3) with a fresh, empty location each time. The S3
server only starts if a test asks for it.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

if importlib.util.find_spec("superfile") is None:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
from superfile_suite import start_moto

_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Endpoint URL of a moto S3 server shared by the session, with test credentials in the env."""
    with start_moto() as server, pytest.MonkeyPatch.context() as env:
        for name, value in _S3_ENV.items():
            env.setenv(name, value)
        yield server.url


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty, uniquely named bucket on the session's S3 server."""
    name = f"sf-test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["memory", "file", "s3"])
def storage_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty storage location for each backend, as a URI for ``from_uri``."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/{uuid.uuid4().hex[:8]}?endpoint_url={quote(endpoint, safe='')}"


@pytest.fixture
def opened_readers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every superfile reader opened from here on (``SuperfileReader.open`` counted)."""
    from superfile.format.reader import SuperfileReader

    seen: list[str] = []
    original = SuperfileReader.open.__func__

    def counted(cls: type[SuperfileReader], *args: Any, **kwargs: Any) -> SuperfileReader:
        seen.append(str(kwargs.get("name")))
        reader: SuperfileReader = original(cls, *args, **kwargs)
        return reader

    monkeypatch.setattr(SuperfileReader, "open", classmethod(counted))
    return seen
