"""Bloom filter over a superfile's terms: lets term queries skip superfiles from the manifest alone."""

from __future__ import annotations

import base64
import functools
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["BloomFilter"]

_FALSE_POSITIVE_RATE = 0.01


def _hashes(terms: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    digests = b"".join(hashlib.blake2b(t.encode(), digest_size=16).digest() for t in terms)
    words = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
    return words[:, 0], words[:, 1] | np.uint64(1)


@functools.lru_cache(maxsize=1024)
def _query_hashes(terms: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_hashes` of a query's terms, cached: a query checks the same terms against every superfile's
    filter. (Builds hash a superfile's whole term list once and stay out of the cache.)"""
    h1, h2 = _hashes(terms)
    h1.setflags(write=False)
    h2.setflags(write=False)
    return h1, h2


@dataclass(frozen=True)
class BloomFilter:
    """Double-hashed bloom filter (Kirsch-Mitzenmacher) sized for a 1% false-positive rate."""

    bits: bytes
    num_hashes: int

    @classmethod
    def build(cls, terms: list[str]) -> BloomFilter:
        n = max(len(terms), 1)
        m = max(64, math.ceil(-n * math.log(_FALSE_POSITIVE_RATE) / math.log(2) ** 2))
        m = (m + 63) // 64 * 64
        k = max(1, round(m / n * math.log(2)))
        bits = np.zeros(m // 8, dtype=np.uint8)
        if terms:
            idx = cls._positions(*_hashes(terms), m, k).ravel()
            np.bitwise_or.at(bits, idx >> 3, (1 << (idx & 7)).astype(np.uint8))
        return cls(bits.tobytes(), k)

    @staticmethod
    def _positions(h1: np.ndarray, h2: np.ndarray, m: int, k: int) -> np.ndarray:
        i = np.arange(k, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return ((h1[:, None] + i[None, :] * h2[:, None]) % np.uint64(m)).astype(np.int64)

    def might_contain_many(self, terms: list[str]) -> np.ndarray:
        """One bool per term; False means the term is certainly absent."""
        if not terms:
            return np.zeros(0, dtype=bool)
        bits = np.frombuffer(self.bits, dtype=np.uint8)
        idx = self._positions(*_query_hashes(tuple(terms)), len(self.bits) * 8, self.num_hashes)
        return ((bits[idx >> 3] >> (idx & 7)) & 1).all(axis=1)

    def to_json(self) -> list[object]:
        return [self.num_hashes, base64.b64encode(self.bits).decode()]

    @classmethod
    def from_json(cls, v: list[object]) -> BloomFilter:
        return cls(base64.b64decode(str(v[1])), int(v[0]))  # type: ignore[call-overload]
