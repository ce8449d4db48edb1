"""Fixtures of the builder tests: fresh table names (``builders`` is shared, in ``tests/e2e/conftest.py``)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def table_name() -> str:
    """A table name no other test (nor an earlier run against the same broker) has used."""
    return f"t{uuid.uuid4().hex[:10]}"
