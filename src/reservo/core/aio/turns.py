"""Per-key turns within one process: one holder per key at a time, the others
wait in line (FIFO). Keys nobody holds or waits for take no memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class Turns:
    def __init__(self) -> None:
        self._lines: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._lines)

    @asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[bool]:
        """Hold ``key`` for the block; yields True when the caller had to wait for
        another holder first (what that holder did may have changed things)."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = (asyncio.Lock(), [0])
        lock, users = line
        waited = users[0] > 0  # someone holds it or is in line before us
        users[0] += 1
        try:
            async with lock:
                yield waited
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._lines[key]
