"""Two-phase transfers through HTTP: a pending transfer reserves (available,
not balance), a post writes the entries (whole or part), a void or the
expiry releases, every other debit checks available, and who may act."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx

from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import make_account, make_match, place

EXPIRE = "wallet.expire-pending"


async def _pending(
    client: httpx.AsyncClient,
    source: int,
    target: int,
    owner: int,
    amount: int,
    timeout_s: int = 60,
) -> httpx.Response:
    return await client.post(
        "/api/transfers",
        json={
            "fromAccountId": source,
            "toAccountId": target,
            "amount": amount,
            "pending": True,
            "timeoutS": timeout_s,
        },
        headers={**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())},
    )


async def _account(client: httpx.AsyncClient, account: int, owner: int) -> dict[str, Any]:
    r = await client.get(f"/api/accounts/{account}", headers=auth("bettor", owner))
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _entries(client: httpx.AsyncClient, account: int, owner: int) -> list[int]:
    r = await client.get(f"/api/accounts/{account}/statement", headers=auth("bettor", owner))
    return [e["amount"] for e in r.json()["entries"]]


async def test_a_pending_transfer_reserves_and_its_post_writes_the_entries(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    a, owner = await make_account(client, 1_000)
    b, other = await make_account(client, 0)
    before = clock.now()
    r = await _pending(client, a, b, owner, 300, timeout_s=60)
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["status"] == "PENDING" and t["amount"] == 300
    expires = datetime.fromisoformat(t["expiresAt"])
    assert before + timedelta(seconds=60) <= expires <= clock.now() + timedelta(seconds=60)
    # Reserved: available shrinks, the balance and the statement do not.
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (1_000, 700)
    assert await _entries(client, a, owner) == [1_000]
    listed = await client.get(f"/api/accounts/{a}/pending-transfers", headers=auth("bettor", owner))
    assert listed.status_code == 200
    assert [i["id"] for i in listed.json()["items"]] == [t["id"]]
    assert listed.json()["next"] is None

    # No body at all: the whole pending amount.
    posted = await client.post(f"/api/transfers/{t['id']}/post", headers=auth("bettor", owner))
    assert posted.status_code == 200, posted.text
    assert (posted.json()["status"], posted.json()["amount"], posted.json()["id"]) == (
        "POSTED",
        300,
        t["id"],
    )
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (700, 700)
    assert (await _account(client, b, other))["balance"] == 300
    assert await _entries(client, a, owner) == [-300, 1_000]
    page = (await client.get(f"/api/accounts/{a}/statement", headers=auth("bettor", owner))).json()
    assert page["entries"][0]["transferId"] == t["id"]
    day = clock.now().date().isoformat()
    csv = await client.get(
        f"/api/accounts/{a}/statement.csv?from={day}&to={day}", headers=auth("bettor", owner)
    )
    assert [line.split(",")[3] for line in csv.text.strip().splitlines()[1:]] == ["1000", "-300"]
    # Resolved once: a second post or a void is 409 not_pending.
    for action in ("post", "void"):
        again = await client.post(
            f"/api/transfers/{t['id']}/{action}", json={}, headers=auth("bettor", owner)
        )
        assert (again.status_code, again.json()["code"]) == (409, "not_pending")
    empty = await client.get(f"/api/accounts/{a}/pending-transfers", headers=auth("bettor", owner))
    assert empty.json()["items"] == []


async def test_a_part_post_releases_the_rest_and_more_than_pending_is_422(
    client: httpx.AsyncClient,
) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    t = (await _pending(client, a, b, owner, 300)).json()
    url = f"/api/transfers/{t['id']}/post"
    over = await client.post(url, json={"amount": 301}, headers=auth("bettor", owner))
    assert (over.status_code, over.json()["code"]) == (422, "amount_above_pending")
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (1_000, 700)  # the refusal changed nothing
    part = await client.post(url, json={"amount": 120}, headers=auth("bettor", owner))
    assert (part.status_code, part.json()["status"], part.json()["amount"]) == (200, "POSTED", 120)
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (880, 880)
    assert await _entries(client, a, owner) == [-120, 1_000]


async def test_a_void_releases_everything_and_writes_nothing(client: httpx.AsyncClient) -> None:
    a, owner = await make_account(client, 500)
    b, _ = await make_account(client, 0)
    t = (await _pending(client, a, b, owner, 500)).json()
    assert (await _account(client, a, owner))["available"] == 0
    r = await client.post(f"/api/transfers/{t['id']}/void", headers=auth("bettor", owner))
    assert (r.status_code, r.json()["status"]) == (200, "VOIDED")
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (500, 500)
    assert await _entries(client, a, owner) == [500]
    again = await client.post(f"/api/transfers/{t['id']}/void", headers=auth("bettor", owner))
    assert (again.status_code, again.json()["code"]) == (409, "not_pending")
    post = await client.post(
        f"/api/transfers/{t['id']}/post", json={}, headers=auth("bettor", owner)
    )
    assert (post.status_code, post.json()["code"]) == (409, "not_pending")


async def test_every_other_debit_checks_available(client: httpx.AsyncClient) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    assert (await _pending(client, a, b, owner, 800)).status_code == 201
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    body = {"fromAccountId": a, "toAccountId": b, "amount": 201}
    plain = await client.post("/api/transfers", json=body, headers=headers)
    assert (plain.status_code, plain.json()["code"]) == (409, "insufficient_funds")
    second = await _pending(client, a, b, owner, 201)
    assert (second.status_code, second.json()["code"]) == (409, "insufficient_funds")
    match = await make_match(client)
    bet = await place(client, a, owner, 201, [(match["id"], "1X2", "HOME")])
    assert (bet.status_code, bet.json()["code"]) == (409, "insufficient_funds")
    # What is available may still be spent, to the last unit.
    bet = await place(client, a, owner, 150, [(match["id"], "1X2", "HOME")])
    assert bet.status_code == 201, bet.text
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    body = {"fromAccountId": a, "toAccountId": b, "amount": 50}
    assert (await client.post("/api/transfers", json=body, headers=headers)).status_code == 201
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (800, 0)


async def test_an_expired_pending_transfer_is_voided_once_and_reserves_nothing(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    t = (await _pending(client, a, b, owner, 600, timeout_s=30)).json()
    u = (await _pending(client, a, b, owner, 400, timeout_s=30)).json()
    job = await db.fetchrow(
        "SELECT id, run_at FROM scheduled_job"
        " WHERE category = $1 AND (payload->>'transferId')::bigint = $2",
        EXPIRE,
        t["id"],
    )
    assert job is not None and job["run_at"] == datetime.fromisoformat(t["expiresAt"])
    clock.advance(timedelta(seconds=31))
    # Past expiresAt it reserves nothing, before any job ran.
    acc = await _account(client, a, owner)
    assert (acc["balance"], acc["available"]) == (1_000, 1_000)
    listed = await client.get(f"/api/accounts/{a}/pending-transfers", headers=auth("bettor", owner))
    assert listed.json()["items"] == []
    late = await client.post(
        f"/api/transfers/{t['id']}/post", json={}, headers=auth("bettor", owner)
    )
    assert (late.status_code, late.json()["code"]) == (409, "pending_expired")
    # The job voids it, once (run twice: the second does nothing).
    handler = container.scheduler.handlers[EXPIRE]
    for _ in range(2):
        await handler(await container.scheduler.get(job["id"]))
    status = await db.fetchval("SELECT status FROM wallet_pending_transfer WHERE id = $1", t["id"])
    assert status == "VOIDED"
    late = await client.post(
        f"/api/transfers/{t['id']}/post", json={}, headers=auth("bettor", owner)
    )
    assert (late.status_code, late.json()["code"]) == (409, "not_pending")
    # `u` expired too, its job not run: a debit needing its money voids it first.
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    body = {"fromAccountId": a, "toAccountId": b, "amount": 1_000}
    assert (await client.post("/api/transfers", json=body, headers=headers)).status_code == 201
    row = await db.fetchrow(
        "SELECT p.status, a.pending_debits FROM wallet_pending_transfer p "
        "JOIN wallet_account a ON a.id = p.from_account_id WHERE p.id = $1",
        u["id"],
    )
    assert (row["status"], row["pending_debits"]) == ("VOIDED", 0)


async def test_only_the_creator_or_an_admin_may_post_void_or_list(
    client: httpx.AsyncClient,
) -> None:
    a, owner = await make_account(client, 1_000)
    b, target_owner = await make_account(client, 0)
    t = (await _pending(client, a, b, owner, 100)).json()
    for who in (auth("bettor", target_owner), auth("bettor", new_id())):
        for action in ("post", "void"):
            r = await client.post(f"/api/transfers/{t['id']}/{action}", json={}, headers=who)
            assert (r.status_code, r.json()["code"]) == (404, "transfer_not_found")
        r = await client.get(f"/api/accounts/{a}/pending-transfers", headers=who)
        assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    missing = await client.post(f"/api/transfers/{t['id'] + 10**9}/void", headers=ADMIN)
    assert (missing.status_code, missing.json()["code"]) == (404, "transfer_not_found")
    # Someone else's account cannot be the source of a pending transfer either.
    r = await _pending(client, a, b, target_owner, 10)
    assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    listed = await client.get(f"/api/accounts/{a}/pending-transfers", headers=ADMIN)
    assert [i["id"] for i in listed.json()["items"]] == [t["id"]]
    r = await client.post(f"/api/transfers/{t['id']}/void", headers=ADMIN)
    assert (r.status_code, r.json()["status"]) == (200, "VOIDED")


async def test_pending_needs_a_timeout_and_a_timeout_needs_pending(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    base = {"fromAccountId": a, "toAccountId": b, "amount": 10}
    for extra in ({"pending": True}, {"timeoutS": 60}, {"pending": True, "timeoutS": 0}):
        headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
        r = await client.post("/api/transfers", json={**base, **extra}, headers=headers)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), extra
    assert (
        await db.fetchval(
            "SELECT count(*) FROM wallet_pending_transfer WHERE from_account_id = $1", a
        )
        == 0
    )
    assert (await _account(client, a, owner))["available"] == 1_000


async def test_a_pending_transfer_is_created_once_per_key_and_listed_in_pages(
    client: httpx.AsyncClient,
) -> None:
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    body = {"fromAccountId": a, "toAccountId": b, "amount": 10, "pending": True, "timeoutS": 60}
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    first = await client.post("/api/transfers", json=body, headers=headers)
    again = await client.post("/api/transfers", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    ids = [first.json()["id"]] + [
        (await _pending(client, a, b, owner, 10)).json()["id"] for _ in range(2)
    ]
    assert (await _account(client, a, owner))["available"] == 970
    url = f"/api/accounts/{a}/pending-transfers?limit=2"
    one = (await client.get(url, headers=auth("bettor", owner))).json()
    two = (await client.get(f"{url}&after={one['next']}", headers=auth("bettor", owner))).json()
    assert [i["id"] for i in one["items"] + two["items"]] == ids and two["next"] is None
    bad = await client.get(f"{url}&after=nope", headers=auth("bettor", owner))
    assert bad.status_code == 422
