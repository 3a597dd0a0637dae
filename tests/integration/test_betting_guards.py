"""Betting refusals found by a black-box probe: a payout cap, no final result
before kick-off, and match starts inside the accepted range."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.betting.events import RESULT_TOPIC
from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.failures import Rejected, is_transient
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from tests.helpers.auth import ADMIN, JWT_SECRET, auth
from tests.helpers.betting import (
    ODDS,
    balance,
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.helpers.waiting import drain

LONG = {"1X2": {"HOME": "1000", "DRAW": "1000", "AWAY": "1000"}}
CAP = 1_000_000_000  # RESERVO_BETTING_MAX_PAYOUT's default


async def _long_odds_match(client: httpx.AsyncClient) -> int:
    r = await client.post(
        "/api/matches",
        json={
            "externalId": f"long-{uuid.uuid4()}",
            "home": "Underdogs",
            "away": "Favourites",
            "startsAt": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
            "odds": LONG,
        },
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def _bets(db: asyncpg.Connection, account: int) -> int:
    n: int = await db.fetchval("SELECT count(*) FROM betting_bet WHERE account_id = $1", account)
    return n


async def test_potential_payout_above_the_cap_is_refused_at_the_stake(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    matches = [await _long_odds_match(client) for _ in range(20)]
    account, owner = await make_account(client, 1_000)
    legs = [(m, "1X2", "HOME") for m in matches]
    # The probe's bet (6 legs at 1000, stake 1: 10^18), one just over the cap, and
    # one whose payout (10^72) no bigint holds.
    for stake, n in ((1, 6), (2, 3), (10**12, 20)):
        r = await place(client, account, owner, stake, legs[:n], LONG)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text
        assert any(e["loc"][-1] == "stake" for e in r.json()["errors"]), r.json()
    assert await _bets(db, account) == 0
    assert await balance(client, account) == 1_000
    # Exactly at the cap: accepted.
    r = await place(client, account, owner, 1, legs[:3], LONG)
    assert r.status_code == 201, r.text
    assert r.json()["potentialPayout"] == CAP
    assert await _bets(db, account) == 1
    assert await balance(client, account) == 999


async def test_final_result_before_kick_off_is_refused_and_stores_nothing(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    match = await make_match(client, timedelta(days=1))
    account, owner = await make_account(client, 1_000)
    bet = await place(client, account, owner, 100, [(match["id"], "1X2", "HOME")])
    assert bet.status_code == 201, bet.text
    event = f"prov-{uuid.uuid4()}"
    body = result_body(match["externalId"], 2, 0, event=event)

    r = await post_result(client, body, clock)
    assert (r.status_code, r.json()["code"]) == (409, "match_not_started"), r.text
    await drain(container.module(Betting).resender, container.module(Outbox).relay)

    async def stored() -> dict[str, Any]:
        row = await db.fetchrow(
            "SELECT result_status, settlement_status FROM betting_match WHERE id = $1",
            match["id"],
        )
        return {
            "match": tuple(row),
            "bet": await db.fetchval(
                "SELECT status FROM betting_bet WHERE id = $1", bet.json()["id"]
            ),
            "fallback": await db.fetchval(
                "SELECT count(*) FROM webhook_events_fallback WHERE provider_event_id = $1", event
            ),
            "inbox": await db.fetchval(
                "SELECT count(*) FROM betting_result_inbox WHERE provider_event_id = $1", event
            ),
            "payouts": await db.fetchval(
                "SELECT count(*) FROM wallet_transfer WHERE kind = 'PAYOUT' AND reference = $1",
                f"bet:{bet.json()['id']}",
            ),
        }

    assert await stored() == {
        "match": (None, "OPEN"),
        "bet": "PENDING",
        "fallback": 0,
        "inbox": 0,
        "payouts": 0,
    }
    assert await balance(client, account) == 900

    # The same result once the match started (the server's clock moved a day on):
    # accepted and settled.
    kick_off(clock, match)
    r = await post_result(client, body, clock)
    assert r.status_code == 202, r.text
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    assert await stored() == {
        "match": ("FINISHED", "SETTLED"),
        "bet": "WON",
        "fallback": 1,
        "inbox": 1,
        "payouts": 1,
    }
    # A token minted by the server's (moved) clock: one valid for days from now
    # would pass the server's clock but not the maximum token lifetime.
    minted = mint_token(JWT_SECRET, "bettor", owner, timedelta(hours=1), clock.now())
    later = {"Authorization": f"Bearer {minted}"}
    got = await client.get(f"/api/accounts/{account}", headers=later)
    assert got.json()["balance"] == 900 + 180


async def test_the_settlement_consumer_rejects_a_result_the_intake_could_not_check(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """With PostgreSQL away at intake the result still goes out (the provider never
    resends); the consumer applies the same rule and rejects it: it is parked as a
    dead letter, nothing recorded, the bet still pending."""
    match = await make_match(client, timedelta(days=1))
    account, owner = await make_account(client, 1_000)
    bet = await place(client, account, owner, 100, [(match["id"], "1X2", "HOME")])
    payload = orjson.loads(result_body(match["externalId"], 2, 0, event=f"p-{uuid.uuid4()}"))
    event = Event(uuid.uuid4(), RESULT_TOPIC, match["externalId"], payload, datetime.now(UTC))
    with pytest.raises(Rejected, match="no result yet"):
        await container.module(Betting).settlement.handle(event)
    assert not is_transient(Rejected("x"))  # so every transport parks it at once
    row = await db.fetchrow(
        "SELECT result_status, settlement_status FROM betting_match WHERE id = $1", match["id"]
    )
    assert tuple(row) == (None, "OPEN")
    status = await db.fetchval("SELECT status FROM betting_bet WHERE id = $1", bet.json()["id"])
    assert status == "PENDING"


async def test_cancelled_before_kick_off_and_unknown_matches_are_still_accepted(
    client: httpx.AsyncClient, container: Container
) -> None:
    match = await make_match(client, timedelta(days=1))
    account, owner = await make_account(client, 500)
    bet = await place(client, account, owner, 200, [(match["id"], "BTTS", "NO")])
    assert bet.status_code == 201, bet.text
    # Called off before kick-off: voids the bet and refunds the stake at once.
    r = await post_result(client, result_body(match["externalId"], 0, 0, status="CANCELLED"))
    assert r.status_code == 202, r.text
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    assert await balance(client, account) == 500
    got = await client.get(f"/api/bets/{bet.json()['id']}", headers=auth("bettor", owner))
    assert (got.json()["status"], got.json()["payout"]) == ("VOID", 200)
    # A result for a match this server does not know: accepted (the settlement
    # consumer keeps it until the match is created).
    r = await post_result(client, result_body(f"unknown-{uuid.uuid4()}", 1, 0))
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("starts_at", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"])
async def test_match_start_outside_the_accepted_range_is_refused(
    client: httpx.AsyncClient, db: asyncpg.Connection, starts_at: str
) -> None:
    external_id = f"far-{uuid.uuid4()}"
    r = await client.post(
        "/api/matches",
        json={
            "externalId": external_id,
            "home": "Past",
            "away": "Future",
            "startsAt": starts_at,
            "odds": ODDS,
        },
        headers=ADMIN,
    )
    assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text
    assert not await db.fetchval(
        "SELECT count(*) FROM betting_match WHERE external_id = $1", external_id
    )
    # The database's copy of the rule (NOT VALID: it checks new rows, legacy ones stay).
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute(
            "INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)"
            " VALUES ($1, 'a', 'b', $2::text::timestamptz, '{}', now())",
            external_id,
            starts_at,
        )


async def test_odds_are_ascii_decimals(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    """Arabic-Indic "1.80" is 1.80 to Decimal, but no client writes odds that way: 422."""
    before = await db.fetchval("SELECT count(*) FROM betting_match")
    body = {
        "externalId": f"ext-{uuid.uuid4()}",
        "home": "A",
        "away": "B",
        "startsAt": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
        "odds": {"1X2": {"HOME": "\u0661.\u0668\u0660", "DRAW": "3.40", "AWAY": "4.20"}},
    }
    r = await client.post("/api/matches", json=body, headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text
    assert await db.fetchval("SELECT count(*) FROM betting_match") == before
