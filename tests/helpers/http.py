"""Answers as the tests read them: problem+json refusals, requests released together."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


async def post_together(
    client: httpx.AsyncClient, path: str, calls: list[tuple[dict[str, Any], dict[str, str]]]
) -> list[httpx.Response]:
    """POST ``path`` once per (body, headers), all released at once (a barrier)."""
    gate = asyncio.Event()

    async def one(body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        await gate.wait()
        return await client.post(path, json=body, headers=headers)

    tasks = [asyncio.create_task(one(b, h)) for b, h in calls]
    await asyncio.sleep(0.05)
    gate.set()
    return list(await asyncio.gather(*tasks))


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert body["status"] == status and body["code"] == code
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


async def together(
    n: int, request: Callable[[int], Awaitable[httpx.Response]]
) -> list[httpx.Response]:
    """Start n requests, hold each at a barrier until all n are waiting, then release them."""
    release = asyncio.Event()
    waiting = 0

    async def one(i: int) -> httpx.Response:
        nonlocal waiting
        waiting += 1
        if waiting == n:
            release.set()
        await release.wait()
        return await request(i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def codes(responses: list[httpx.Response]) -> Counter[tuple[int, str | None]]:
    return Counter(
        (r.status_code, r.json().get("code") if r.status_code >= 400 else None) for r in responses
    )
