"""Idempotency keys: an append tagged with a key commits at most once, across processes.

Like the index object of seed 004 (a tree of inserted source objects
referenced from the table's root), the committed keys live in immutable
*key blocks* referenced from the manifest, not inline in it: the manifest
property ``idempotency_keys`` is a short list of ``[path, count]`` block
references, oldest first. Each block maps up to ``BLOCK_KEYS`` keys to the
version that committed them. A commit with keys rewrites only the newest
(open) block, or starts a new one when it is full.

Retention: the newest ``MAX_BLOCKS`` blocks are kept, i.e. at least
``(MAX_BLOCKS - 1) * BLOCK_KEYS`` (99,000) of the most recent keys are
remembered; a key older than that may commit again. Blocks dropped from the
reference list are ordinary garbage for ``cleanup()``.

The check runs twice: when the append is staged (a known key stages
nothing), and in the commit itself (a change's ``record_keys``: ``publish``
calls :func:`record_new`), against the manifest each publish attempt
builds on: of two writers racing with one key, the loser's retry sees the
winner's key, drops the rows staged under it and publishes the rest of its
transaction (if anything is left). Keys are per append, not per transaction:
a duplicate key never discards other staged work.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from superfile._lru import LRU
from superfile.errors import SuperfileError
from superfile.io import Storage, write_new
from superfile.manifest.model import ManifestList

__all__ = [
    "BLOCK_KEYS",
    "MAX_BLOCKS",
    "PREFIX",
    "PROPERTY",
    "AlreadyCommitted",
    "block_paths",
    "committed_keys",
    "committed_version",
    "record",
    "record_new",
]

PROPERTY = "idempotency_keys"
PREFIX = "_idempotency/"
BLOCK_KEYS = 1000
MAX_BLOCKS = 100

_blocks = LRU(256)  # immutable objects named by uuid: safe to share between tables and handles


class AlreadyCommitted(SuperfileError):
    """Raised inside a commit when earlier commits already recorded some of its idempotency keys."""

    def __init__(self, keys: Mapping[str, int]) -> None:
        super().__init__(f"{len(keys)} idempotency key(s) already committed (at version {max(keys.values())})")
        self.keys = dict(keys)  # key -> version that committed it


def block_paths(properties: Mapping[str, Any]) -> list[str]:
    """Paths of the key blocks a manifest references (for cleanup)."""
    return [path for path, _ in properties.get(PROPERTY, [])]


def _load(storage: Storage, path: str) -> dict[str, int]:
    keys, _ = _blocks.get_or_load(f"{storage.uri}#{path}", lambda: dict(json.loads(storage.read(path))["keys"]))
    return keys


def committed_keys(storage: Storage, properties: Mapping[str, Any], keys: Iterable[str]) -> dict[str, int]:
    """Which of ``keys`` retained blocks record, each with the version that committed it."""
    wanted = set(keys)
    found: dict[str, int] = {}
    for path in reversed(block_paths(properties)) if wanted else ():
        block = _load(storage, path)
        for key in wanted - found.keys():
            if key in block:
                found[key] = block[key]
        if len(found) == len(wanted):
            break
    return found


def committed_version(storage: Storage, properties: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    """The version that committed any of ``keys`` (the newest, if several did), or None."""
    found = committed_keys(storage, properties, keys)
    return max(found.values()) if found else None


def record(storage: Storage, properties: Mapping[str, Any], keys: Iterable[str], version: int) -> list[list[Any]]:
    """The new ``idempotency_keys`` property with ``keys`` committed at ``version`` (writes one block)."""
    refs = [list(ref) for ref in properties.get(PROPERTY, [])]
    new = dict.fromkeys(keys, version)
    # the open block grows until full; then a new block starts
    block = {**_load(storage, refs.pop()[0]), **new} if refs and refs[-1][1] + len(new) <= BLOCK_KEYS else new
    path = f"{PREFIX}{uuid.uuid4().hex}.json"
    write_new(storage, path, json.dumps({"keys": block}, separators=(",", ":")).encode())
    _blocks.get_or_load(f"{storage.uri}#{path}", lambda: block)
    refs.append([path, len(block)])
    return refs[-MAX_BLOCKS:]


def record_new(storage: Storage, current: ManifestList, keys: list[str]) -> dict[str, Any]:
    """The properties a commit of ``keys`` on top of ``current`` adds; raises :class:`AlreadyCommitted` when
    ``current`` (a concurrent commit, or this one's own earlier attempt) has some of them already."""
    done = committed_keys(storage, current.properties, keys)
    if done:
        raise AlreadyCommitted(done)
    return {PROPERTY: record(storage, current.properties, keys, current.version + 1)}
