"""A leaf request's body: the root encodes a read's arguments once and splices them into each node's body."""

from __future__ import annotations

import json

import numpy as np
import pytest
from superfile.errors import InvalidInputError
from superfile.search.leaf import LeafRequest


def test_encoded_body_is_the_request() -> None:
    args = {"column": "emb", "vector": np.linspace(-1, 1, 384).tolist(), "k": 10, "filter": None, "where": "a > 1"}
    request = LeafRequest("docs", "_manifests/00000000000000000001-ab.json", ("data/a.superfile",), "vector", args)
    for body in (request.encode(), request.encode(json.dumps(args))):
        decoded = json.loads(body)
        assert decoded == request.to_json()
        assert LeafRequest.from_json(decoded) == request
    hedge = LeafRequest(request.table, request.manifest, request.superfiles, request.op, args, transient=True)
    assert json.loads(hedge.encode(json.dumps(args)))["transient"] is True


def test_a_body_naming_no_op_is_refused() -> None:
    body = json.loads(LeafRequest("docs", "m", (), "count", {}).encode())
    body["op"] = "drop"
    with pytest.raises(InvalidInputError):
        LeafRequest.from_json(body)
