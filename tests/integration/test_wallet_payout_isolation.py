"""Money that cannot land blocks nobody else's: one bettor who cannot be paid
leaves the other bettors of the same payout event paid and is parked alone,
replayable once fixed; and no system account (WORLD, HOUSE) full to its range
stops a deposit, a stake or a payout, while a customer's own balance past its
range is a 422 for that movement only. Each test runs on a database of its own,
so the whole bank can be checked: sums per currency are 0 and every balance is
its ledger."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from reservo.app import create_app
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.settings import Settings
from reservo.wallet import PAYOUT_REQUESTED, repo
from reservo.wallet.setup import Wallet
from tests.helpers.auth import ADMIN, SERVICE, auth
from tests.helpers.betting import (
    balance,
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.helpers.waiting import drain

PAYOUTS = {"consumer": "wallet.payouts"}
BALANCE_MAX = 2**63 - 1  # a bigint


@pytest.fixture
async def own(base_settings: Settings, own_database: str) -> AsyncIterator[Container]:
    c = build(base_settings.with_(database_url=own_database), OffsetClock())
    yield c
    await c.close()


@pytest.fixture
async def api(own: Container) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(own, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
        yield client


async def _system(c: Container, kind: str, shard: int = 0) -> int:
    async with c.db.connection() as conn:
        found = await repo.system_account(conn, kind, "EUR", shard)
    assert found is not None
    return found


async def _seed(c: Container, source: int, target: int, amount: int, kind: str) -> None:
    """The wallet's own movement statement, with amounts beyond the API's cap
    per request: the state a bank reaches after years (or a bank whose system
    accounts an older version filled), with its ledger intact."""
    async with c.db.transaction() as conn:
        row = await repo.apply_transfer(
            conn, source, target, amount, kind, f"seed-{uuid.uuid4()}", c.clock.now()
        )
    assert row is not None


async def _bank_holds(c: Container) -> None:
    """Double entry and every balance equal to its ledger, for the whole bank."""
    async with c.db.connection() as conn:
        sums = await conn.fetch("SELECT currency, sum(balance) AS s FROM wallet_account GROUP BY 1")
        assert sums and all(r["s"] == 0 for r in sums), sums
        unbalanced = await conn.fetch(
            """SELECT t.id FROM wallet_transfer t JOIN wallet_entry e ON e.transfer_id = t.id
                GROUP BY t.id HAVING count(*) <> 2 OR sum(e.amount) <> 0"""
        )
        assert unbalanced == []
        off_ledger = await conn.fetch(
            """SELECT a.id FROM wallet_account a
                WHERE a.balance <> (SELECT coalesce(sum(e.amount), 0) FROM wallet_entry e
                                     WHERE e.account_id = a.id)"""
        )
        assert off_ledger == []


async def _paid(c: Container, bet_id: int) -> list[int]:
    async with c.db.connection() as conn:
        rows = await conn.fetch(
            "SELECT amount FROM wallet_transfer WHERE kind = 'PAYOUT' AND reference = $1",
            f"bet:{bet_id}",
        )
    return [r["amount"] for r in rows]


async def _letters(api: httpx.AsyncClient) -> list[dict[str, object]]:
    r = await api.get("/api/ops/dead-letters", params=PAYOUTS, headers=ADMIN)
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


async def test_one_bettor_who_cannot_be_paid_blocks_no_other_and_is_replayed_once(
    own: Container, api: httpx.AsyncClient
) -> None:
    match = await make_match(api, timedelta(minutes=1))
    a, a_owner = await make_account(api, 1_000)
    b, b_owner = await make_account(api, 1_000)
    full, full_owner = await make_account(api, 0)
    # An account so rich that its winnings do not fit in it (a bigint).
    await _seed(own, await _system(own, "WORLD"), full, BALANCE_MAX - 2_000, "DEPOSIT")
    bets = {}
    for account, owner in ((a, a_owner), (b, b_owner), (full, full_owner)):
        r = await place(api, account, owner, 1_000, [(match["id"], "1X2", "AWAY")])
        assert r.status_code == 201, r.text
        bets[account] = int(r.json()["id"])
    kick_off(own.clock, match)
    r = await post_result(api, result_body(match["externalId"], 0, 2), own.clock)
    assert r.status_code == 202, r.text
    await drain(own.module(Betting).resender, own.module(Outbox).relay)

    # The two others are paid (4.20 * 1,000) although the third cannot be.
    assert (await balance(api, a), await balance(api, b)) == (4_200, 4_200)
    assert await balance(api, full) == BALANCE_MAX - 3_000
    letters = await _letters(api)
    assert len(letters) == 1 and "balance_out_of_range" in str(letters[0]["error"]), letters
    letter = letters[0]["id"]
    # Still unpayable: refused again, stays parked, nothing moved.
    r = await api.post(f"/api/ops/dead-letters/{letter}/replay", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "not_replayable"), r.text
    assert (await _letters(api))[0]["replayedAt"] is None

    # The cause fixed (the owner moves money out), the replay pays it, once.
    r = await api.post(
        "/api/transfers",
        json={"fromAccountId": full, "toAccountId": b, "amount": 1_000_000},
        headers={**auth("bettor", full_owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    for _ in range(2):
        r = await api.post(f"/api/ops/dead-letters/{letter}/replay", headers=ADMIN)
        assert (r.status_code, r.json()) == (200, {"replayed": True}), r.text
    # A redelivery of the original event pays nothing twice either.
    async with own.db.connection() as conn:
        row = await conn.fetchrow(
            "SELECT event_id, topic, key, payload, created_at FROM outbox WHERE topic = $1",
            PAYOUT_REQUESTED,
        )
    await own.module(Wallet).payouts.handle(Event(row[0], row[1], row[2], row[3], row[4]))
    await drain(own.module(Betting).resender, own.module(Outbox).relay)

    assert await balance(api, full) == BALANCE_MAX - 3_000 - 1_000_000 + 4_200
    assert (await balance(api, a), await balance(api, b)) == (4_200, 4_200 + 1_000_000)
    for bet in bets.values():
        assert await _paid(own, bet) == [4_200]
    assert len(await _letters(api)) == 1
    await _bank_holds(own)


async def test_system_accounts_full_to_their_range_stop_no_deposit_stake_or_payout(
    own: Container, api: httpx.AsyncClient
) -> None:
    match = await make_match(api, timedelta(minutes=1))
    bettor, owner = await make_account(api, 0)  # funded once WORLD is full
    shards = own.settings.wallet.house_shards
    stakes_to = bettor % shards
    # WORLD filled by one whale; the bettor's stake shard filled up to its range
    # by the whale's stakes; every other house shard emptied down to its range by
    # payouts (to customers then full to theirs).
    whale, _ = await make_account(api, 0)
    await _seed(own, await _system(own, "WORLD"), whale, BALANCE_MAX, "DEPOSIT")
    await _seed(own, whale, await _system(own, "HOUSE", stakes_to), BALANCE_MAX - 10, "STAKE")
    full: list[int] = []
    for shard in range(shards):
        if shard != stakes_to:
            full.append((await make_account(api, 0))[0])
            await _seed(own, await _system(own, "HOUSE", shard), full[-1], BALANCE_MAX, "PAYOUT")

    # Deposits go on: many at once, released together, each opens or finds a
    # WORLD sub-account with room (one is opened, once).
    accounts = [await make_account(api, 0) for _ in range(12)]
    gate = asyncio.Barrier(len(accounts))

    async def deposit(account: int) -> httpx.Response:
        await gate.wait()
        return await api.post(
            f"/api/accounts/{account}/deposits",
            json={"amount": 500, "reference": "after-the-world-filled"},
            headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
        )

    answers = await asyncio.gather(*(deposit(a) for a, _ in accounts))
    assert [r.status_code for r in answers] == [201] * len(accounts), answers[0].text
    async with own.db.connection() as conn:
        worlds = await conn.fetchval("SELECT count(*) FROM wallet_account WHERE kind = 'WORLD'")
    assert worlds == 2
    fresh, fresh_owner = accounts[0]
    # A customer's own range is that deposit's problem alone: 422, nothing moved.
    r = await api.post(
        f"/api/accounts/{full[0]}/deposits",
        json={"amount": 1, "reference": "one-too-many"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (422, "balance_out_of_range"), r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    # The same for a transfer into a full account (the batch path).
    r = await api.post(
        "/api/transfers",
        json={"fromAccountId": fresh, "toAccountId": full[0], "amount": 1},
        headers={**auth("bettor", fresh_owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (422, "balance_out_of_range"), r.text
    assert (await balance(api, fresh), await balance(api, full[0])) == (500, BALANCE_MAX)

    # Stakes and payouts go on.
    r = await api.post(
        f"/api/accounts/{bettor}/deposits",
        json={"amount": 1_000, "reference": "stake-money"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    r = await place(api, bettor, owner, 100, [(match["id"], "1X2", "AWAY")])
    assert r.status_code == 201, r.text
    bet = int(r.json()["id"])
    kick_off(own.clock, match)
    r = await post_result(api, result_body(match["externalId"], 0, 2), own.clock)
    assert r.status_code == 202, r.text
    await drain(own.module(Betting).resender, own.module(Outbox).relay)
    assert await balance(api, bettor) == 900 + 420
    assert await _paid(own, bet) == [420]
    assert await _letters(api) == []
    await _bank_holds(own)
