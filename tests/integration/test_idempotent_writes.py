"""Idempotent writes under concurrent duplicates (POST /api/transfers and
POST /api/jobs): one is created, every duplicate gets its replay (none is 409:
a duplicate waits for the request in flight), a refusal is replayed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx

from tests.helpers.auth import auth
from tests.helpers.betting import make_account

SERVICE = auth("service", 1)
DUPLICATES = 24


def _n(n: int) -> dict[str, int]:
    return {"n": n}


async def _barrier_posts(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> list[httpx.Response]:
    """DUPLICATES identical requests released together."""
    gate = asyncio.Event()

    async def one() -> httpx.Response:
        await gate.wait()
        return await client.post(url, json=body, headers=headers)

    tasks = [asyncio.create_task(one()) for _ in range(DUPLICATES)]
    await asyncio.sleep(0.05)
    gate.set()
    return list(await asyncio.gather(*tasks))


def _one_created(responses: list[httpx.Response]) -> dict[str, Any]:
    """Exactly one 201; every other answer is the replay (200) of that same body."""
    created = [r for r in responses if r.status_code == 201]
    assert len(created) == 1, [r.status_code for r in responses]
    first: dict[str, Any] = created[0].json()
    for r in responses:
        assert r.status_code in (200, 201), r.text
        assert r.json() == first
    return first


async def test_concurrent_duplicate_transfers_move_money_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, owner = await make_account(client, 1_000)
    target, _ = await make_account(client, 0)
    key = f"t-{uuid.uuid4()}"
    headers = {**auth("bettor", owner), "Idempotency-Key": key}
    body = {"fromAccountId": source, "toAccountId": target, "amount": 70}
    responses = await _barrier_posts(client, "/api/transfers", body, headers)
    first = _one_created(responses)
    again = await client.post("/api/transfers", json=body, headers=headers)
    assert (again.status_code, again.json()) == (200, first)
    balances = dict(
        await db.fetch(
            "SELECT id, balance FROM wallet_account WHERE id = ANY($1::bigint[])", [source, target]
        )
    )
    assert balances == {source: 930, target: 70}
    transfers = await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE from_account_id = $1 AND kind = 'TRANSFER'",
        source,
    )
    assert transfers == 1
    row = await db.fetchrow(
        "SELECT status, response_status FROM idempotency_key WHERE key = $1", key
    )
    assert tuple(row) == ("DONE", 201)


async def test_concurrent_duplicate_jobs_create_one_job(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    key = f"j-{uuid.uuid4()}"
    marker = str(uuid.uuid4())
    body = {
        "category": "http",
        "delayMs": 3_600_000,
        "payload": {"url": "https://callbacks.example.com/hook", "body": {"m": marker}},
    }
    responses = await _barrier_posts(client, "/api/jobs", body, {**SERVICE, "Idempotency-Key": key})
    first = _one_created(responses)
    jobs = await db.fetch("SELECT id FROM scheduled_job WHERE payload->'body'->>'m' = $1", marker)
    assert [r["id"] for r in jobs] == [first["jobId"]]


async def test_a_refused_transfer_is_replayed_even_once_it_could_pass(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, owner = await make_account(client, 10)
    target, _ = await make_account(client, 0)
    headers = {**auth("bettor", owner), "Idempotency-Key": f"r-{uuid.uuid4()}"}
    body = {"fromAccountId": source, "toAccountId": target, "amount": 50}
    refused = await client.post("/api/transfers", json=body, headers=headers)
    assert (refused.status_code, refused.json()["code"]) == (409, "insufficient_funds")
    deposit = await client.post(
        f"/api/accounts/{source}/deposits",
        json={"amount": 100, "reference": f"top-up-{uuid.uuid4()}"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert deposit.status_code == 201
    again = await client.post("/api/transfers", json=body, headers=headers)
    assert (again.status_code, again.json()) == (409, refused.json())
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", source) == 110


async def test_a_transfer_from_somebody_elses_account_is_not_stored_and_moves_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, _ = await make_account(client, 100)
    target, intruder = await make_account(client, 0)
    key = f"f-{uuid.uuid4()}"
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": source, "toAccountId": target, "amount": 1},
        headers={**auth("bettor", intruder), "Idempotency-Key": key},
    )
    # Somebody else's account is answered as one that does not exist.
    assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    assert await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = $1", key) == 0
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", source) == 100
