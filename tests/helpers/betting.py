"""Builders shared by the betting tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson

from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import Clock, OffsetClock
from tests.helpers.auth import ADMIN, RESULTS_SECRET, SERVICE, auth, new_id

ODDS = {
    "1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},
    "TOTALS_2_5": {"OVER": "1.95", "UNDER": "1.85"},
    "BTTS": {"YES": "1.70", "NO": "2.10"},
}


async def make_match(
    client: httpx.AsyncClient, starts_in: timedelta = timedelta(hours=2)
) -> dict[str, Any]:
    r = await client.post(
        "/api/matches",
        json={
            "externalId": f"ext-{uuid.uuid4()}",
            "home": "Liverpool",
            "away": "Manchester City",
            "startsAt": (datetime.now(UTC) + starts_in).isoformat(),
            "odds": ODDS,
        },
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def make_account(client: httpx.AsyncClient, balance: int) -> tuple[int, int]:
    """(account id, owner id) holding ``balance``."""
    owner = new_id()
    r = await client.post(
        "/api/accounts", json={"ownerId": owner, "currency": "EUR"}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    account = int(r.json()["id"])
    if balance:
        r = await client.post(
            f"/api/accounts/{account}/deposits",
            json={"amount": balance, "reference": f"dep-{uuid.uuid4()}"},
            headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
        )
        assert r.status_code == 201, r.text
    return account, owner


async def place(
    client: httpx.AsyncClient,
    account: int,
    owner: int,
    stake: int,
    selections: list[tuple[int, str, str]],
    odds: dict[str, dict[str, str]] | None = None,
) -> httpx.Response:
    table = odds or ODDS
    body = {
        "accountId": account,
        "stake": stake,
        "selections": [
            {"matchId": m, "market": k, "pick": p, "odds": table[k][p]} for m, k, p in selections
        ],
    }
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    return await client.post("/api/bets", json=body, headers=headers)


def result_body(
    external_id: str, home: int, away: int, status: str = "FINISHED", event: str | None = None
) -> bytes:
    return orjson.dumps(
        {
            "matchExternalId": external_id,
            "homeScore": home,
            "awayScore": away,
            "status": status,
            "providerEventId": event or f"prov-{uuid.uuid4()}",
        }
    )


async def post_result(
    client: httpx.AsyncClient, body: bytes, clock: Clock | None = None
) -> httpx.Response:
    """Signed now, or at ``clock``'s now (the server's, when a test moved it)."""
    t = None if clock is None else int(clock.now().timestamp())
    return await client.post(
        "/api/webhooks/match-results",
        content=body,
        headers={
            "X-Signature": sign_webhook(RESULTS_SECRET, body, t),
            "Content-Type": "application/json",
        },
    )


def kick_off(clock: Clock, *matches: dict[str, Any]) -> None:
    """Move the server's clock just past the latest start of ``matches``: a final
    result is refused before kick-off. Tokens live an hour (checked against this
    clock), so tests that still call the API afterwards use matches starting soon."""
    assert isinstance(clock, OffsetClock)
    latest = max(datetime.fromisoformat(m["startsAt"]) for m in matches)
    ahead = latest - clock.now() + timedelta(seconds=1)
    if ahead > timedelta(0):
        clock.advance(ahead)


async def balance(client: httpx.AsyncClient, account: int) -> int:
    r = await client.get(f"/api/accounts/{account}", headers=ADMIN)
    return int(r.json()["balance"])
