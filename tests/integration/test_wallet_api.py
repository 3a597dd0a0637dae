"""Wallet HTTP contract: statement paging, refusals, idempotent replays."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from reservo.wallet.config import WalletSettings
from tests.helpers.auth import ADMIN, SERVICE, auth, new_id
from tests.helpers.betting import make_account


async def test_statement_is_keyset_paginated_newest_first(client: httpx.AsyncClient) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    headers = auth("bettor", owner)
    for amount in (10, 20, 30, 40):
        r = await client.post(
            "/api/transfers",
            json={"fromAccountId": a, "toAccountId": b, "amount": amount},
            headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
        )
        assert r.status_code == 201, r.text
    page = (await client.get(f"/api/accounts/{a}/statement?limit=3", headers=headers)).json()
    assert page["accountId"] == a and page["balance"] == 900
    assert [e["amount"] for e in page["entries"]] == [-40, -30, -20]
    assert [e["balanceAfter"] for e in page["entries"]] == [900, 940, 970]
    assert page["entries"][0]["kind"] == "TRANSFER"
    rest = await client.get(
        f"/api/accounts/{a}/statement?limit=3&before={page['nextBefore']}", headers=headers
    )
    tail = rest.json()
    assert [e["amount"] for e in tail["entries"]] == [-10, 1_000]
    assert tail["entries"][-1]["kind"] == "DEPOSIT" and tail["nextBefore"] is None
    other = await client.get(f"/api/accounts/{a}/statement", headers=auth("bettor", new_id()))
    assert (other.status_code, other.json()["code"]) == (404, "account_not_found")


async def test_transfer_refusals_and_replay(client: httpx.AsyncClient) -> None:
    a, owner = await make_account(client, 100)
    b, _ = await make_account(client, 0)
    headers = auth("bettor", owner)
    body = {"fromAccountId": a, "toAccountId": b, "amount": 60}
    r = await client.post("/api/transfers", json=body, headers=headers)
    assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required")
    key = {**headers, "Idempotency-Key": str(uuid.uuid4())}
    first = await client.post("/api/transfers", json=body, headers=key)
    again = await client.post("/api/transfers", json=body, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    r = await client.post(
        "/api/transfers", json=body, headers={**headers, "Idempotency-Key": str(uuid.uuid4())}
    )
    assert (r.status_code, r.json()["code"]) == (409, "insufficient_funds")
    usd = await client.post(
        "/api/accounts", json={"ownerId": owner, "currency": "USD"}, headers=ADMIN
    )
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": a, "toAccountId": usd.json()["id"], "amount": 1},
        headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (409, "currency_mismatch")
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": a, "toAccountId": 2**62, "amount": 1},
        headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": a, "toAccountId": b, "amount": "1"},
        headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 422
    r = await client.post(
        f"/api/accounts/{2**62}/deposits",
        json={"amount": 5, "reference": "x"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    assert (await client.get(f"/api/accounts/{a}", headers=headers)).json()["balance"] == 40


async def test_refusals_tell_nothing_about_the_other_account(client: httpx.AsyncClient) -> None:
    mine, owner = await make_account(client, 100)
    other = await client.post(
        "/api/accounts", json={"ownerId": new_id(), "currency": "NOK"}, headers=ADMIN
    )
    assert other.status_code == 201, other.text
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": mine, "toAccountId": other.json()["id"], "amount": 1},
        headers=headers,
    )
    assert (r.status_code, r.json()["code"]) == (409, "currency_mismatch")
    assert "NOK" not in r.text
    # Too little money: the detail names the caller's own account, in its own currency.
    theirs, _ = await make_account(client, 0)
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": mine, "toAccountId": theirs, "amount": 101},
        headers={**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert (r.status_code, r.json()["code"]) == (409, "insufficient_funds")
    assert r.json()["detail"] == f"account {mine} does not hold 101 EUR"


async def _open(client: httpx.AsyncClient, owner: int, currency: str) -> httpx.Response:
    body = {"ownerId": owner, "currency": currency}
    return await client.post("/api/accounts", json=body, headers=ADMIN)


async def test_currency_is_an_iso_4217_code(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    owner = new_id()
    for code in ("EUR", "VND", "CHF", "XAU"):
        r = await _open(client, owner, code)
        assert r.status_code == 201, (code, r.text)
        assert r.json()["currency"] == code
    # Three capital letters are not enough: ISO 4217 lists the codes.
    for code in ("ZZZ", "BTC", "ABC", "EUX"):
        r = await _open(client, owner, code)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), (code, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "ISO 4217" in r.json()["detail"]
    currencies = await db.fetch(
        "SELECT DISTINCT currency FROM wallet_account WHERE currency = ANY($1)",
        ["ZZZ", "BTC", "ABC", "EUX"],
    )
    assert currencies == []  # neither the owner's account nor the system accounts


@pytest.fixture
async def btc_client(base_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    container = build(base_settings.with_(wallet_currencies=" XBT, ZZT"), OffsetClock())
    transport = httpx.ASGITransport(app=create_app(container, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c
    await container.close()


async def test_the_operator_adds_currencies(btc_client: httpx.AsyncClient) -> None:
    owner = new_id()
    for code in ("XBT", "ZZT", "EUR"):
        r = await _open(btc_client, owner, code)
        assert r.status_code == 201, (code, r.text)
    r = await _open(btc_client, owner, "ZZZ")
    assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text


@pytest.mark.parametrize("bad", ["btc", "BTCX", "B1C", "EUR,,X"])
def test_a_bad_added_currency_stops_the_start(bad: str) -> None:
    with pytest.raises(ValidationError, match="not a currency code"):
        WalletSettings(currencies=bad)
