"""In order per key, keys concurrently: the order events promise is per
aggregate (the event key), and one transaction or send per item is latency
bound, so items of different keys need not wait for each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def by_key_in_order(
    items: Iterable[T], key: Callable[[T], Hashable], run: Callable[[T], Awaitable[object]]
) -> list[BaseException]:
    """Run ``run`` on every item: those of one key one after the other, in the
    given order; different keys concurrently. An item that raises stops its key
    (the later items of that key must wait for it); the other keys go on.
    Returns the errors, at most one per key, in the order the keys first appear."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)

    async def in_order(group: list[T]) -> None:
        for item in group:
            await run(item)

    outcomes = await asyncio.gather(
        *(in_order(group) for group in groups.values()), return_exceptions=True
    )
    return [o for o in outcomes if isinstance(o, BaseException)]
