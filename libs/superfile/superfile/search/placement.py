"""Which cache node holds which superfile: rendezvous (highest-random-weight) hashing.

Each superfile goes to the node with the highest weight of (node, superfile);
the other nodes, in falling weight order, are where it goes when that one
fails. No table of assignments is kept anywhere: every query root computes the
same order from the member list alone, a joining or leaving node moves only
the superfiles whose first choice it is or was (about 1/N of them), and the key
is the superfile's path, unique and immutable (as Sneller places blocks by
ETag). A weight is splitmix64's finalizer over the XOR of the two names'
hashes: one hash per name, then integer mixing, so a million superfiles over a
hundred nodes place in numpy in about a second.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["assign", "rank"]

_M64 = (1 << 64) - 1


@functools.lru_cache(maxsize=1 << 16)  # a root places the same superfiles and nodes on every read
def _hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix_array(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def rank(key: str, nodes: Sequence[str]) -> list[str]:
    """``nodes`` in the order ``key`` is tried: its owner first, then the fallbacks (ties broken by name)."""
    k = _hash(key)
    return sorted(nodes, key=lambda n: (-_mix(k ^ _hash(n)), n))


def assign(keys: Sequence[str], nodes: Sequence[str]) -> dict[str, list[str]]:
    """Each key under its owner among ``nodes`` (the first of :func:`rank`; every node present, perhaps
    with no keys)."""
    order = sorted(nodes)
    owned: dict[str, list[str]] = {n: [] for n in order}
    if not order or not keys:
        return owned
    key_hashes = np.fromiter((_hash(k) for k in keys), np.uint64, len(keys))
    best = np.zeros(len(keys), np.int64)
    top = np.zeros(len(keys), np.uint64)
    for i, node in enumerate(order):  # in name order, strictly greater: a tie keeps the smaller name, as rank
        w = _mix_array(key_hashes ^ np.uint64(_hash(node)))
        better = w > top if i else np.ones(len(keys), bool)
        best[better] = i
        top[better] = w[better]
    for key, i in zip(keys, best.tolist(), strict=True):
        owned[order[i]].append(key)
    return owned
