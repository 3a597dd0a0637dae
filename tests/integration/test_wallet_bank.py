"""Jepsen-style bank test through HTTP: many concurrent random transfers among a
few accounts, retries with the same keys, requests cut off mid-flight. Afterwards
the ledger in PostgreSQL must be consistent."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from typing import Any

import asyncpg
import httpx
import orjson

from tests.conftest import auth, new_id

ADMIN = auth("admin", 1)
SERVICE = auth("service", 1)
ACCOUNTS = 5
START = 1_000
OPS = 240


async def _account(client: httpx.AsyncClient, owner: int) -> int:
    r = await client.post(
        "/api/accounts", json={"ownerId": owner, "currency": "EUR"}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    account = int(r.json()["id"])
    r = await client.post(
        f"/api/accounts/{account}/deposits",
        json={"amount": START, "reference": f"seed-{uuid.uuid4()}"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    return account


async def test_bank_invariants_under_concurrency_retries_and_cutoffs(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    rng = random.Random(20260125)
    owners = [new_id() for _ in range(ACCOUNTS)]
    accounts = [await _account(client, o) for o in owners]
    owner_of = dict(zip(accounts, owners, strict=True))
    go = asyncio.Event()
    outcomes: dict[str, list[int]] = {}
    transfer_ids: dict[str, set[int]] = {}

    async def send(body: dict[str, Any], key: str) -> httpx.Response:
        headers = {**auth("bettor", owner_of[body["fromAccountId"]]), "Idempotency-Key": key}
        return await client.post("/api/transfers", json=body, headers=headers)

    async def op(i: int) -> None:
        src, dst = rng.sample(accounts, 2)
        body = {"fromAccountId": src, "toAccountId": dst, "amount": rng.randint(1, 450)}
        key = f"bank-{uuid.uuid4()}"
        cut = rng.random() < 0.25
        retries = rng.choice([0, 1, 2])
        delay = rng.random() * 0.02
        await go.wait()
        attempts = 0
        while True:
            attempts += 1
            if cut and attempts == 1:
                # Cut the request off mid-flight: cancelling the client task
                # aborts the request (and its transaction) wherever it was.
                task = asyncio.create_task(send(body, key))
                await asyncio.sleep(delay)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    r = await task
                    outcomes.setdefault(key, []).append(r.status_code)
                continue
            r = await send(body, key)
            outcomes.setdefault(key, []).append(r.status_code)
            if r.status_code in (200, 201):
                transfer_ids.setdefault(key, set()).add(r.json()["id"])
            if r.status_code == 409 and r.json()["code"] == "request_in_progress":
                await asyncio.sleep(0.05)
                continue
            if retries == 0:
                return
            retries -= 1

    tasks = [asyncio.create_task(op(i)) for i in range(OPS)]
    await asyncio.sleep(0.05)
    go.set()
    await asyncio.gather(*tasks)

    statuses = {s for codes in outcomes.values() for s in codes}
    assert statuses <= {200, 201, 409}, statuses
    assert any(s in (200, 201) for s in statuses) and 409 in statuses

    rows = await db.fetch("SELECT id, balance FROM wallet_account WHERE id = ANY($1)", accounts)
    balances = {r["id"]: r["balance"] for r in rows}
    # No negative balance; money conserved among the accounts (only transfers ran).
    assert all(b >= 0 for b in balances.values()), balances
    assert sum(balances.values()) == START * ACCOUNTS
    for account in accounts:
        total = await db.fetchval(
            "SELECT coalesce(sum(amount), 0) FROM wallet_entry WHERE account_id = $1", account
        )
        last = await db.fetchval(
            "SELECT balance_after FROM wallet_entry WHERE account_id = $1 ORDER BY id DESC LIMIT 1",
            account,
        )
        assert total == balances[account] == last
    # Every transfer is two entries that sum to zero.
    bad = await db.fetchval(
        """SELECT count(*) FROM (
               SELECT t.id FROM wallet_transfer t JOIN wallet_entry e ON e.transfer_id = t.id
                WHERE t.from_account_id = ANY($1)
                GROUP BY t.id HAVING count(*) <> 2 OR sum(e.amount) <> 0) x""",
        accounts,
    )
    assert bad == 0
    # Each key moved money at most once: every key that answered 2xx answered
    # with one transfer id, and the transfers that exist are exactly those.
    assert all(len(ids) == 1 for ids in transfer_ids.values())
    existing = {
        r["id"]
        for r in await db.fetch(
            "SELECT id FROM wallet_transfer WHERE kind = 'TRANSFER' AND from_account_id = ANY($1)",
            accounts,
        )
    }
    stored = await db.fetch(
        """SELECT key, response_body FROM idempotency_key
            WHERE endpoint = 'POST /api/transfers' AND key LIKE 'bank-%'
              AND status = 'DONE' AND response_status = 201
              AND key = ANY($1)""",
        list(outcomes),
    )
    stored_ids = [orjson.loads(r["response_body"])["id"] for r in stored]
    assert len(stored_ids) == len(set(stored_ids))
    assert set(stored_ids) == existing
    answered = {next(iter(ids)) for ids in transfer_ids.values()}
    assert answered <= existing
