"""Result corrections and voids: POST /api/matches/{id}/resettle and /void, and
the results webhook's corrections; reversals in the ledger, negative balances."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import httpx
import orjson

from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from tests.helpers.auth import ADMIN, auth
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

SOON = timedelta(minutes=1)


async def settle_posted(container: Container) -> None:
    """Settle what the webhook took (fallback path) and what an admin reopened."""
    betting = container.module(Betting)
    await drain(betting.resender, container.module(Outbox).relay)
    await betting.resettlement.wait()
    await drain(container.module(Outbox).relay)


async def resettle(
    client: httpx.AsyncClient,
    match_id: int,
    home: int | None,
    away: int | None,
    status: str = "FINISHED",
) -> httpx.Response:
    body = {"result": {"status": status, "homeScore": home, "awayScore": away}}
    return await client.post(f"/api/matches/{match_id}/resettle", json=body, headers=ADMIN)


def correction(external_id: str, home: int, away: int, sequence: int) -> bytes:
    return orjson.dumps(
        {
            "matchExternalId": external_id,
            "homeScore": home,
            "awayScore": away,
            "status": "FINISHED",
            "providerEventId": f"prov-{uuid.uuid4()}",
            "correction": True,
            "sequence": sequence,
        }
    )


async def ledger_balanced(db: asyncpg.Connection) -> None:
    """Double entry: every transfer's entries sum to zero, every account's balance
    is the sum of its entries, and all balances together are zero."""
    assert (
        await db.fetchval(
            "SELECT count(*) FROM (SELECT transfer_id FROM wallet_entry"
            " GROUP BY transfer_id HAVING sum(amount) <> 0) x"
        )
        == 0
    )
    assert (
        await db.fetchval(
            "SELECT count(*) FROM wallet_account a WHERE a.balance <>"
            " coalesce((SELECT sum(amount) FROM wallet_entry e WHERE e.account_id = a.id), 0)"
        )
        == 0
    )
    assert await db.fetchval("SELECT coalesce(sum(balance), 0) FROM wallet_account") == 0


def code(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json().get("code")


async def test_resettle_and_void_answer_their_codes(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock
) -> None:
    m = await make_match(client, SOON)
    account, owner = await make_account(client, 1_000)
    assert (await place(client, account, owner, 100, [(m["id"], "1X2", "HOME")])).status_code == 201
    assert code(await resettle(client, 999_999_999, 1, 0)) == (404, "match_not_found")
    r = await client.post("/api/matches/999999999/void", json={"reason": "x"}, headers=ADMIN)
    assert code(r) == (404, "match_not_found")
    assert code(await resettle(client, m["id"], 1, 0)) == (409, "not_settled")
    bettor = auth("bettor", owner)
    r = await client.post(
        f"/api/matches/{m['id']}/resettle",
        json={"result": {"status": "FINISHED", "homeScore": 1, "awayScore": 0}},
        headers=bettor,
    )
    assert r.status_code == 403
    r = await client.post(f"/api/matches/{m['id']}/void", json={"reason": "x"}, headers=bettor)
    assert r.status_code == 403
    r = await client.post(f"/api/matches/{m['id']}/void", json={}, headers=ADMIN)
    assert code(r) == (422, "validation_error")
    assert code(await resettle(client, m["id"], None, None)) == (422, "validation_error")

    kick_off(clock, m)
    assert (await post_result(client, result_body(m["externalId"], 2, 1), clock)).status_code == 202
    await settle_posted(container)
    assert code(await resettle(client, m["id"], 2, 1)) == (409, "same_result")
    assert (await resettle(client, m["id"], 0, 1)).status_code == 202
    await settle_posted(container)
    assert code(await resettle(client, m["id"], 0, 1)) == (409, "same_result")
    r = await client.post(f"/api/matches/{m['id']}/void", json={"reason": "fixed"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    r = await client.post(f"/api/matches/{m['id']}/void", json={"reason": "again"}, headers=ADMIN)
    assert code(r) == (409, "already_void")

    # A match voided before any result: its result is the admin's, which no
    # provider event carried; the match and the lists still show it.
    early = await make_match(client, SOON)
    r = await client.post(f"/api/matches/{early['id']}/void", json={"reason": "x"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    seen = await client.get(f"/api/matches/{early['id']}", headers=ADMIN)
    assert seen.status_code == 200, seen.text
    assert seen.json()["result"]["providerEventId"] is None


async def test_correction_reverses_payouts_and_a_spent_payout_goes_negative(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    m1, m2 = await make_match(client, SOON), await make_match(client, SOON)
    winner, w_owner = await make_account(client, 100)
    loser, l_owner = await make_account(client, 100)
    acca, a_owner = await make_account(client, 100)
    elsewhere, _ = await make_account(client, 0)
    w = await place(client, winner, w_owner, 100, [(m1["id"], "1X2", "HOME")])
    lo = await place(client, loser, l_owner, 100, [(m1["id"], "1X2", "AWAY")])
    ac = await place(
        client, acca, a_owner, 100, [(m1["id"], "BTTS", "YES"), (m2["id"], "1X2", "DRAW")]
    )
    assert {r.status_code for r in (w, lo, ac)} == {201}
    kick_off(clock, m1, m2)
    await post_result(client, result_body(m1["externalId"], 2, 1), clock)
    await post_result(client, result_body(m2["externalId"], 1, 1), clock)
    await settle_posted(container)
    assert await balance(client, winner) == 180
    assert await balance(client, loser) == 0
    assert await balance(client, acca) == 578  # floor(100 * 1.70 * 3.40)
    # The winner spends most of the payout.
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": winner, "toAccountId": elsewhere, "amount": 150},
        headers={**auth("bettor", w_owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text

    # The provider corrects: 0-1. HOME lost, AWAY won, BTTS NO: the accumulator lost.
    assert (await resettle(client, m1["id"], 0, 1)).status_code == 202
    await settle_posted(container)
    assert await balance(client, winner) == 30 - 180
    assert await balance(client, loser) == 420  # floor(100 * 4.20)
    assert await balance(client, acca) == 0
    got = (await client.get(f"/api/matches/{m1['id']}", headers=ADMIN)).json()
    assert got["result"]["homeScore"] == 0 and got["settlement"]["status"] == "SETTLED"
    bet = (await client.get(f"/api/bets/{w.json()['id']}", headers=auth("bettor", w_owner))).json()
    assert (bet["status"], bet["payout"]) == ("LOST", 0)
    # Reversals in the ledger: the first payouts stay, each taken back once.
    rows = await db.fetch(
        "SELECT kind, reference, amount FROM wallet_entry WHERE account_id = $1 ORDER BY id",
        winner,
    )
    assert [(r["kind"], r["amount"]) for r in rows] == [
        ("DEPOSIT", 100),
        ("STAKE", -100),
        ("PAYOUT", 180),
        ("TRANSFER", -150),
        ("REVERSAL", -180),
    ]
    statement = (
        await client.get(f"/api/accounts/{winner}/statement", headers=auth("bettor", w_owner))
    ).json()
    assert statement["entries"][0]["kind"] == "REVERSAL"
    assert statement["balance"] == -150
    await ledger_balanced(db)

    # Below zero: no bet, no transfer out; listed for the admin.
    m3 = await make_match(client, timedelta(hours=2))
    r = await place(client, winner, w_owner, 1, [(m3["id"], "1X2", "HOME")])
    assert code(r) == (409, "insufficient_funds")
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": winner, "toAccountId": elsewhere, "amount": 1},
        headers={**auth("bettor", w_owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert code(r) == (409, "insufficient_funds")
    listed = await client.get("/api/accounts", params={"negative": "true"}, headers=ADMIN)
    assert listed.status_code == 200
    assert [(a["id"], a["balance"]) for a in listed.json()["items"]] == [(winner, -150)]
    r = await client.get(
        "/api/accounts", params={"negative": "true"}, headers=auth("bettor", w_owner)
    )
    assert r.status_code == 403
    # Back at zero (a deposit), it may bet again.
    r = await client.post(
        f"/api/accounts/{winner}/deposits",
        json={"amount": 160, "reference": f"dep-{uuid.uuid4()}"},
        headers={**auth("service", 1), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    assert (
        await place(client, winner, w_owner, 10, [(m3["id"], "1X2", "HOME")])
    ).status_code == 201
    listed = await client.get("/api/accounts", params={"negative": "true"}, headers=ADMIN)
    assert listed.json()["items"] == []


async def test_void_refunds_singles_and_counts_one_in_accumulators(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    m1, m2 = await make_match(client, SOON), await make_match(client, SOON)
    account, owner = await make_account(client, 300)
    single = await place(client, account, owner, 100, [(m1["id"], "1X2", "HOME")])
    acca = await place(
        client, account, owner, 100, [(m1["id"], "BTTS", "YES"), (m2["id"], "BTTS", "YES")]
    )
    assert single.status_code == acca.status_code == 201
    kick_off(clock, m1, m2)
    await post_result(client, result_body(m1["externalId"], 2, 1), clock)
    await post_result(client, result_body(m2["externalId"], 1, 1), clock)
    await settle_posted(container)
    assert await balance(client, account) == 100 + 180 + 289  # floor(100 * 1.70 * 1.70)
    r = await client.post(f"/api/matches/{m1['id']}/void", json={"reason": "fixed"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    await settle_posted(container)
    # The single refunded its stake; the accumulator's void leg counts 1.00.
    assert await balance(client, account) == 100 + 100 + 170
    got = (
        await client.get(f"/api/bets/{single.json()['id']}", headers=auth("bettor", owner))
    ).json()
    assert (got["status"], got["payout"]) == ("VOID", 100)
    match = await db.fetchrow(
        "SELECT settlement_generation, voided_reason, result_status"
        " FROM betting_match WHERE id = $1",
        m1["id"],
    )
    assert tuple(match) == (2, "fixed", "CANCELLED")
    # Each bet paid once per generation: generation 1 and 2 references.
    sid = single.json()["id"]
    refs = await db.fetch(
        "SELECT kind, reference FROM wallet_transfer WHERE reference = ANY($1) ORDER BY id",
        [f"bet:{sid}", f"bet:{sid}:g2", f"bet:{sid}:g3"],
    )
    assert [(r["kind"], r["reference"]) for r in refs] == [
        ("STAKE", f"bet:{sid}"),
        ("PAYOUT", f"bet:{sid}"),
        ("REVERSAL", f"bet:{sid}"),
        ("REFUND", f"bet:{sid}:g2"),
    ]
    await ledger_balanced(db)


async def test_void_before_any_result_voids_the_legs_and_closes_the_match(
    client: httpx.AsyncClient, container: Container
) -> None:
    m = await make_match(client)
    account, owner = await make_account(client, 100)
    assert (await place(client, account, owner, 100, [(m["id"], "1X2", "HOME")])).status_code == 201
    r = await client.post(f"/api/matches/{m['id']}/void", json={"reason": "storm"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    await settle_posted(container)
    assert await balance(client, account) == 100
    assert code(await place(client, account, owner, 10, [(m["id"], "1X2", "HOME")])) == (
        409,
        "match_closed",
    )


async def test_webhook_corrections_apply_in_sequence_and_a_stale_one_is_parked(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    m = await make_match(client, SOON)
    home, h_owner = await make_account(client, 100)
    away, a_owner = await make_account(client, 100)
    await place(client, home, h_owner, 100, [(m["id"], "1X2", "HOME")])
    await place(client, away, a_owner, 100, [(m["id"], "1X2", "AWAY")])
    kick_off(clock, m)
    await post_result(client, result_body(m["externalId"], 1, 0), clock)
    await settle_posted(container)
    assert (await balance(client, home), await balance(client, away)) == (180, 0)
    ext = m["externalId"]
    assert (await post_result(client, correction(ext, 0, 2, sequence=5), clock)).status_code == 202
    await settle_posted(container)
    assert (await balance(client, home), await balance(client, away)) == (0, 420)
    # An older correction sent before sequence 5 arrives late: parked, nothing changes.
    assert (await post_result(client, correction(ext, 3, 0, sequence=4), clock)).status_code == 202
    await settle_posted(container)
    assert (await balance(client, home), await balance(client, away)) == (0, 420)
    parked = await db.fetch(
        "SELECT error FROM dead_letter WHERE consumer = 'betting.settlement' AND key = $1",
        f"match:{ext}",
    )
    assert len(parked) == 1 and "stale_correction" in parked[0]["error"]
    # A plain (non-correction) different result stays parked as before.
    await post_result(client, result_body(ext, 4, 4), clock)
    await settle_posted(container)
    assert (await balance(client, home), await balance(client, away)) == (0, 420)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM dead_letter WHERE consumer = 'betting.settlement' AND key = $1",
            f"match:{ext}",
        )
        == 2
    )
    await ledger_balanced(db)
