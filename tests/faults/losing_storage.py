"""Lost answers on local disk: a wrapper around the real ``LocalStorage`` whose conditional writes act and
then, for a chosen share of them, raise as if the answer never came back.

On ``file://`` a write cannot lose its answer over a network, but a writer
can lose it all the same (killed, or timed out by its caller, right after
the rename); the commit protocol must treat both alike. The bytes are always
written by the real backend; only the answer is dropped.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from superfile.errors import StorageError
from superfile.io import Storage

__all__ = ["LosingStorage"]


class _Dice:
    """One seeded source of faults and their count, shared by a storage and its children."""

    def __init__(self, share: float, seed: int) -> None:
        self.share = share
        self.lost = 0
        self.writes = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def roll(self) -> bool:
        with self._lock:
            self.writes += 1
            hit = self._random.random() < self.share
            self.lost += hit
            return hit


class LosingStorage:
    """``inner`` with the answers of a share of its conditional writes lost after they took effect."""

    def __init__(self, inner: Storage, share: float, *, seed: int = 0, dice: _Dice | None = None) -> None:
        self._inner = inner
        self.dice = dice or _Dice(share, seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _maybe_lose(self, op: str, path: str, etag: str) -> str:
        if self.dice.roll():
            raise StorageError(f"{op} {path!r}: the answer was lost (injected; the write took effect)")
        return etag

    def write_if_absent(self, path: str, data: bytes) -> str:
        return self._maybe_lose("conditional PUT", path, self._inner.write_if_absent(path, data))

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        return self._maybe_lose("conditional PUT", path, self._inner.write_if_match(path, data, etag))

    def child(self, prefix: str) -> LosingStorage:
        return LosingStorage(self._inner.child(prefix), self.dice.share, dice=self.dice)
