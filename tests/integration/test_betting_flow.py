"""Betting through HTTP: placing bets, the result webhook, fallback resend,
settlement and payouts through the wallet."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import httpx

from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from tests.helpers.auth import auth
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


async def test_place_bet_debits_stake_and_refuses_bad_bets(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    match = await make_match(client, timedelta(minutes=5))
    account, owner = await make_account(client, 1_000)
    r = await place(client, account, owner, 300, [(match["id"], "1X2", "HOME")])
    assert r.status_code == 201, r.text
    bet = r.json()
    assert bet["status"] == "PENDING" and bet["potentialPayout"] == 540
    assert await balance(client, account) == 700
    # Changed odds, unaffordable stake, someone else's account.
    stale = {"1X2": {"HOME": "1.75", "DRAW": "3.40", "AWAY": "4.20"}}
    r = await place(client, account, owner, 10, [(match["id"], "1X2", "HOME")], stale)
    assert (r.status_code, r.json()["code"]) == (409, "odds_changed")
    r = await place(client, account, owner, 701, [(match["id"], "1X2", "HOME")])
    assert (r.status_code, r.json()["code"]) == (409, "insufficient_funds")
    r = await place(client, account, owner + 1, 10, [(match["id"], "1X2", "HOME")])
    assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    r = await place(client, account, owner, 10, [(match["id"], "1X2", "HOME")] * 2)
    assert r.status_code == 422
    assert await balance(client, account) == 700
    # Once the match started it takes no bets.
    clock.advance(timedelta(minutes=6))
    r = await place(client, account, owner, 10, [(match["id"], "BTTS", "YES")])
    assert (r.status_code, r.json()["code"]) == (409, "match_closed")
    r = await client.get(f"/api/bets/{bet['id']}", headers=auth("bettor", owner))
    assert r.status_code == 200 and r.json()["selections"][0]["status"] == "PENDING"


async def test_result_posted_twice_settles_once_and_pays_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    soon = timedelta(minutes=1)  # results are accepted once the matches started
    m1, m2 = await make_match(client, soon), await make_match(client, soon)
    winner, w_owner = await make_account(client, 1_000)
    loser, l_owner = await make_account(client, 1_000)
    acca, a_owner = await make_account(client, 1_000)
    r1 = await place(client, winner, w_owner, 100, [(m1["id"], "1X2", "HOME")])
    r2 = await place(client, loser, l_owner, 100, [(m1["id"], "BTTS", "NO")])
    r3 = await place(
        client, acca, a_owner, 100, [(m1["id"], "TOTALS_2_5", "OVER"), (m2["id"], "1X2", "DRAW")]
    )
    assert {r.status_code for r in (r1, r2, r3)} == {201}
    kick_off(clock, m1, m2)
    body = result_body(m1["externalId"], 2, 1)
    first, again = await post_result(client, body, clock), await post_result(client, body, clock)
    assert first.status_code == again.status_code == 202
    assert first.json() == {"accepted": True}
    await drain(container.module(Betting).resender, container.module(Outbox).relay)

    got = await client.get(f"/api/matches/{m1['id']}", headers=auth("bettor", w_owner))
    match = got.json()
    assert match["result"]["homeScore"] == 2
    assert match["settlement"] == {"status": "SETTLED", "pendingBets": 0, "settledBets": 3}
    assert await balance(client, winner) == 900 + 180
    assert await balance(client, loser) == 900
    assert await balance(client, acca) == 900  # still waiting for m2
    bet3 = (
        await client.get(f"/api/bets/{r3.json()['id']}", headers=auth("bettor", a_owner))
    ).json()
    assert bet3["status"] == "PENDING"
    assert [s["status"] for s in bet3["selections"]] == ["WON", "PENDING"]
    # The second leg settles the accumulator: floor(100 * 1.95 * 3.40) = 663.
    assert (
        await post_result(client, result_body(m2["externalId"], 1, 1), clock)
    ).status_code == 202
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    assert await balance(client, acca) == 900 + 663
    payouts = await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE kind = 'PAYOUT' AND reference = ANY($1)",
        [f"bet:{r1.json()['id']}", f"bet:{r3.json()['id']}"],
    )
    assert payouts == 2
    rows = await db.fetch(
        "SELECT status FROM webhook_events_fallback WHERE payload->>'matchExternalId' = $1",
        m1["externalId"],
    )
    assert [r["status"] for r in rows] == ["RESENT", "RESENT"]
    # One notification per settled bet, sent once, though the result came twice.
    sent = await db.fetch(
        "SELECT recipient, subject, status FROM notification"
        " WHERE topic = 'betting.match.bets-settled.v1' AND recipient = ANY($1) ORDER BY recipient",
        [w_owner, l_owner, a_owner],
    )
    assert sorted((r["recipient"], r["status"]) for r in sent) == sorted(
        [(w_owner, "SENT"), (l_owner, "SENT"), (a_owner, "SENT")]
    )
    assert {r["subject"] for r in sent} == {
        f"Bet #{r1.json()['id']} won",
        f"Bet #{r2.json()['id']} lost",
        f"Bet #{r3.json()['id']} won",
    }


async def test_cancelled_match_voids_and_refunds(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock
) -> None:
    m1, m2 = await make_match(client), await make_match(client, timedelta(minutes=1))
    account, owner = await make_account(client, 500)
    single = await place(client, account, owner, 100, [(m1["id"], "1X2", "AWAY")])
    acca = await place(
        client, account, owner, 100, [(m1["id"], "BTTS", "YES"), (m2["id"], "BTTS", "YES")]
    )
    assert single.status_code == acca.status_code == 201
    # Called off before kick-off (m1 starts in 2 hours): accepted, voids its legs.
    r = await post_result(client, result_body(m1["externalId"], 0, 0, status="CANCELLED"))
    assert r.status_code == 202, r.text
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    assert await balance(client, account) == 300 + 100  # the single refunded
    kick_off(clock, m2)
    await post_result(client, result_body(m2["externalId"], 1, 1), clock)
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    # The VOID leg counts 1.00: floor(100 * 1.70).
    assert await balance(client, account) == 400 + 170
    got = (
        await client.get(f"/api/bets/{single.json()['id']}", headers=auth("bettor", owner))
    ).json()
    assert got["status"] == "VOID" and got["payout"] == 100


async def test_malformed_and_unsigned_results(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    body = b'{"matchExternalId": "x", "status": "FINISHED", "providerEventId": "bad-1"}'
    r = await post_result(client, body)
    assert (r.status_code, r.json()["code"]) == (422, "validation_error")
    assert (
        await db.fetchval(
            "SELECT count(*) FROM webhook_events_rejected WHERE body = $1", body.decode()
        )
        == 1
    )
    r = await client.post(
        "/api/webhooks/match-results",
        content=result_body("x", 1, 0),
        headers={"X-Signature": "t=1,v1=00"},
    )
    assert (r.status_code, r.json()["code"]) == (401, "bad_signature")


async def test_concurrent_bets_never_overdraw(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    match = await make_match(client)
    account, owner = await make_account(client, 1_000)
    go = asyncio.Event()

    async def one() -> int:
        await go.wait()
        return (
            await place(client, account, owner, 150, [(match["id"], "1X2", "DRAW")])
        ).status_code

    tasks = [asyncio.create_task(one()) for _ in range(20)]
    go.set()
    codes = await asyncio.gather(*tasks)
    assert codes.count(201) == 6 and codes.count(409) == 14
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account) == 100
    assert await db.fetchval("SELECT count(*) FROM betting_bet WHERE account_id = $1", account) == 6
