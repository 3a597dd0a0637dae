"""Jepsen-style bank test through HTTP: many concurrent random transfers among a
few accounts, retries with the same keys, requests cut off mid-flight. Afterwards
the ledger in PostgreSQL must be consistent."""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import jwt
import orjson
import pytest

from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from reservo.wallet.pending import NotYetDue
from reservo.wallet.setup import Wallet
from tests.helpers.auth import JWT_SECRET, auth, new_id

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


# -- two-phase transfers racing posts, voids and expiries ---------------------------

PENDING_OPS = 40


async def _retrying(send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    """As a client does with a 503 (nothing was written; Retry-After): the same
    request again (a create with its same key), and again while that key's
    first attempt still holds it (409 request_in_progress: a claim whose
    release the 503 prevented is free at the end of its lease). A loaded
    2-core machine can make a request wait past the pool's acquire timeout."""
    deadline = time.monotonic() + 90
    while True:
        r = await send()
        busy = r.status_code == 409 and r.json()["code"] == "request_in_progress"
        if not (r.status_code == 503 or busy) or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.5)


async def test_bank_with_pending_transfers_racing_posts_voids_and_expiries(
    client: httpx.AsyncClient,
    container: Container,
    clock: OffsetClock,
    db: asyncpg.Connection,
    database_url: str,
) -> None:
    """Phase one: pending transfers (some expiring soon) race plain transfers out
    of the same accounts. Phase two, past the short ones' expiry: each pending
    transfer's post, void and expiry job race each other and more plain
    transfers. Every client of a phase is released together. Money is
    conserved, `available` is never negative (watched throughout), and each
    pending transfer is resolved exactly once."""
    rng = random.Random(20261207)
    owners = [new_id() for _ in range(ACCOUNTS)]
    accounts = [await _account(client, o) for o in owners]
    owner_of = dict(zip(accounts, owners, strict=True))
    pending = container.module(Wallet).pending
    watching = True
    negative: list[asyncpg.Record] = []

    async def watch() -> None:
        # Its own connection samples every account while the clients run.
        conn = await asyncpg.connect(database_url)
        try:
            while watching:
                negative.extend(
                    await conn.fetch(
                        "SELECT id, balance, pending_debits FROM wallet_account"
                        " WHERE id = ANY($1) AND balance - pending_debits < 0",
                        accounts,
                    )
                )
                await asyncio.sleep(0.005)
        finally:
            await conn.close()

    async def plain(go: asyncio.Event) -> None:
        src, dst = rng.sample(accounts, 2)
        body = {"fromAccountId": src, "toAccountId": dst, "amount": rng.randint(1, 300)}
        headers = {**auth("bettor", owner_of[src]), "Idempotency-Key": str(uuid.uuid4())}
        await go.wait()
        r = await _retrying(lambda: client.post("/api/transfers", json=body, headers=headers))
        assert r.status_code == 201 or r.json()["code"] == "insufficient_funds", r.text

    created: list[dict[str, Any]] = []

    async def reserve(go: asyncio.Event) -> None:
        src, dst = rng.sample(accounts, 2)
        body = {
            "fromAccountId": src,
            "toAccountId": dst,
            "amount": rng.randint(1, 400),
            "pending": True,
            "timeoutS": rng.choice([30, 3600]),
        }
        headers = {**auth("bettor", owner_of[src]), "Idempotency-Key": str(uuid.uuid4())}
        await go.wait()
        r = await _retrying(lambda: client.post("/api/transfers", json=body, headers=headers))
        if r.status_code == 201:
            created.append(r.json())
        else:
            assert r.json()["code"] == "insufficient_funds", r.text

    watcher = asyncio.create_task(watch())
    go = asyncio.Event()
    tasks = [asyncio.create_task(reserve(go)) for _ in range(PENDING_OPS)]
    tasks += [asyncio.create_task(plain(go)) for _ in range(PENDING_OPS // 2)]
    await asyncio.sleep(0.05)
    go.set()
    await asyncio.gather(*tasks)
    # Some were refused: the reservations asked for more than was there.
    assert 10 < len(created) < PENDING_OPS, len(created)
    # Plain transfers racing each other while every reservation is held: they
    # may spend only what the reservations leave.
    go = asyncio.Event()
    tasks = [asyncio.create_task(plain(go)) for _ in range(PENDING_OPS // 2)]
    await asyncio.sleep(0.05)
    go.set()
    await asyncio.gather(*tasks)
    reserved = await db.fetch(
        "SELECT a.id, a.balance, a.pending_debits,"
        " (SELECT coalesce(sum(p.amount), 0) FROM wallet_pending_transfer p"
        "   WHERE p.from_account_id = a.id AND p.status = 'PENDING') AS held"
        " FROM wallet_account a WHERE a.id = ANY($1)",
        accounts,
    )
    for r in reserved:
        assert r["pending_debits"] == r["held"] and r["balance"] >= r["pending_debits"], r

    clock.advance(timedelta(seconds=31))  # the 30 s ones are past their expiry now
    short = {t["id"] for t in created if datetime.fromisoformat(t["expiresAt"]) <= clock.now()}
    assert short and len(short) < len(created)
    wins: dict[int, list[str]] = {t["id"]: [] for t in created}
    posted: dict[int, int] = {}

    async def post(go: asyncio.Event, t: dict[str, Any]) -> None:
        amount = rng.randint(1, t["amount"])
        headers = auth("bettor", owner_of[t["fromAccountId"]])
        await go.wait()
        url = f"/api/transfers/{t['id']}/post"
        r = await _retrying(lambda: client.post(url, json={"amount": amount}, headers=headers))
        if r.status_code == 200:
            wins[t["id"]].append("post")
            posted[t["id"]] = amount
        else:
            assert r.status_code == 409, r.text
            assert r.json()["code"] in ("not_pending", "pending_expired"), r.text

    async def void(go: asyncio.Event, t: dict[str, Any]) -> None:
        headers = ADMIN if rng.random() < 0.3 else auth("bettor", owner_of[t["fromAccountId"]])
        await go.wait()
        url = f"/api/transfers/{t['id']}/void"
        r = await _retrying(lambda: client.post(url, headers=headers))
        if r.status_code == 200:
            wins[t["id"]].append("void")
        else:
            assert (r.status_code, r.json()["code"]) == (409, "not_pending"), r.text

    async def expire(go: asyncio.Event, t: dict[str, Any]) -> None:
        await go.wait()
        try:
            if await pending.expire(t["id"]):
                wins[t["id"]].append("expiry")
        except NotYetDue:
            assert t["id"] not in short

    go = asyncio.Event()
    tasks = []
    for t in created:
        racers = [post, void, expire]
        # Every one is resolved: a live one has a post or a void among its
        # racers, an expired one a void or its expiry job.
        chosen = rng.sample(racers, rng.choice([2, 3]))
        if not {void, post if t["id"] not in short else expire} & set(chosen):
            chosen.append(void)
        tasks += [asyncio.create_task(racer(go, t)) for racer in chosen]
    tasks += [asyncio.create_task(plain(go)) for _ in range(PENDING_OPS // 2)]
    rng.shuffle(tasks)
    await asyncio.sleep(0.05)
    go.set()
    await asyncio.gather(*tasks)
    watching = False
    await watcher

    assert negative == []
    rows = await db.fetch(
        "SELECT id, status, posted_amount, amount FROM wallet_pending_transfer"
        " WHERE from_account_id = ANY($1)",
        accounts,
    )
    assert {r["id"] for r in rows} == set(wins)
    for r in rows:
        won = wins[r["id"]]
        # Exactly once: one racer won, or (an expired one) a plain transfer
        # needing its money voided it first; nothing is left pending.
        assert len(won) <= 1, (r["id"], won)
        assert r["status"] in ("POSTED", "VOIDED"), r
        if r["id"] in short:
            assert "post" not in won and r["status"] == "VOIDED"
        else:
            assert len(won) == 1, (r["id"], won)
        if r["status"] == "POSTED":
            assert won == ["post"] and r["posted_amount"] == posted[r["id"]]
        else:
            assert "post" not in won and r["posted_amount"] is None
    balances = {
        r["id"]: (r["balance"], r["pending_debits"])
        for r in await db.fetch(
            "SELECT id, balance, pending_debits FROM wallet_account WHERE id = ANY($1)", accounts
        )
    }
    assert all(p == 0 for _, p in balances.values()), balances
    assert all(b >= 0 for b, _ in balances.values()), balances
    assert sum(b for b, _ in balances.values()) == START * ACCOUNTS
    for account in accounts:
        total = await db.fetchval(
            "SELECT coalesce(sum(amount), 0) FROM wallet_entry WHERE account_id = $1", account
        )
        last = await db.fetchval(
            "SELECT balance_after FROM wallet_entry WHERE account_id = $1 ORDER BY id DESC LIMIT 1",
            account,
        )
        assert total == balances[account][0] == last
    # A posted one is one transfer of what was posted, its two entries under its
    # id; a voided one wrote nothing.
    moved = {
        r["id"]: (r["amount"], r["entries"], r["total"])
        for r in await db.fetch(
            "SELECT t.id, t.amount, count(e.id) AS entries, sum(e.amount) AS total"
            " FROM wallet_transfer t JOIN wallet_entry e ON e.transfer_id = t.id"
            " WHERE t.id = ANY($1) GROUP BY t.id",
            list(wins),
        )
    }
    assert moved == {i: (amount, 2, 0) for i, amount in posted.items()}


# -- system accounts: money enters only by deposits --------------------------------------

# One currency per test (session-unique): its WORLD and HOUSE accounts and the whole
# money supply then belong to that test alone. No ISO currency but QAR starts with Q;
# the others are an operator's own codes (RESERVO_WALLET_CURRENCIES), added below.
_Q_CODES = [f"Q{a}{b}" for a in string.ascii_uppercase for b in string.ascii_uppercase]
_CURRENCIES = iter(_Q_CODES)


@pytest.fixture
def base_settings(base_settings: Settings) -> Settings:
    wallet = base_settings.wallet.model_copy(update={"currencies": ",".join(_Q_CODES)})
    return base_settings.model_copy(update={"wallet": wallet})


def _currency() -> str:
    code = next(_CURRENCIES)
    return code if code != "QAR" else next(_CURRENCIES)


def _sub_zero_bettor() -> dict[str, str]:
    """A well-signed bettor token whose sub is "0", the owner_id the system accounts
    used to have. (Signed by hand: the token layer may refuse to mint it.)"""
    exp = int(time.time()) + 3600
    raw = jwt.encode({"sub": "0", "role": "bettor", "exp": exp}, JWT_SECRET, algorithm="HS256")
    return {"Authorization": f"Bearer {raw}"}


async def _customer(client: httpx.AsyncClient, currency: str, deposit: int) -> tuple[int, int]:
    owner = new_id()
    r = await client.post(
        "/api/accounts", json={"ownerId": owner, "currency": currency}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    account = int(r.json()["id"])
    if deposit:
        r = await client.post(
            f"/api/accounts/{account}/deposits",
            json={"amount": deposit, "reference": f"seed-{uuid.uuid4()}"},
            headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
        )
        assert r.status_code == 201, r.text
    return account, owner


async def _system(db: asyncpg.Connection, currency: str) -> tuple[int, list[int]]:
    """(WORLD id, HOUSE ids) of a currency."""
    rows = await db.fetch(
        "SELECT id, kind FROM wallet_account WHERE currency = $1 AND kind <> 'CUSTOMER'"
        " ORDER BY shard",
        currency,
    )
    world = [r["id"] for r in rows if r["kind"] == "WORLD"]
    houses = [r["id"] for r in rows if r["kind"] == "HOUSE"]
    assert len(world) == 1 and houses
    return world[0], houses


async def _ledger(db: asyncpg.Connection, currency: str) -> dict[str, Any]:
    """Every balance of the currency, its sum over all accounts (0: double entry),
    the money customers hold, and the money that entered by deposits."""
    rows = await db.fetch(
        "SELECT id, kind, balance FROM wallet_account WHERE currency = $1", currency
    )
    deposited = await db.fetchval(
        """SELECT coalesce(sum(t.amount), 0) FROM wallet_transfer t
             JOIN wallet_account a ON a.id = t.to_account_id
            WHERE t.kind = 'DEPOSIT' AND a.currency = $1""",
        currency,
    )
    return {
        "balances": {r["id"]: r["balance"] for r in rows},
        "total": sum(r["balance"] for r in rows),
        "customers": sum(r["balance"] for r in rows if r["kind"] == "CUSTOMER"),
        "deposited": deposited,
    }


async def _move(
    client: httpx.AsyncClient, headers: dict[str, str], src: int, dst: int, amount: int
) -> httpx.Response:
    return await client.post(
        "/api/transfers",
        json={"fromAccountId": src, "toAccountId": dst, "amount": amount},
        headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
    )


async def test_bettor_owning_nothing_cannot_move_world_or_house_money(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    currency = _currency()
    account, owner = await _customer(client, currency, 1_000)
    world, houses = await _system(db, currency)
    before = await _ledger(db, currency)
    nobody = auth("bettor", new_id())
    for source in (world, houses[0], houses[-1]):
        # sub "0" matched the system accounts' old owner_id 0 (the probe got 201):
        # the token layer refuses it now, as no user id (core/http/auth.py).
        r = await _move(client, _sub_zero_bettor(), source, account, 5_000_000)
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), r.text
        # Nobody's account is answered to a bettor as one that does not exist.
        r = await _move(client, nobody, source, account, 5_000_000)
        assert (r.status_code, r.json()["code"]) == (404, "account_not_found"), r.text
        # Nor does the bettor who owns the target.
        r = await _move(client, auth("bettor", owner), source, account, 5_000_000)
        assert (r.status_code, r.json()["code"]) == (404, "account_not_found"), r.text
    assert await _ledger(db, currency) == before
    assert before["customers"] == 1_000 == before["deposited"] and before["total"] == 0


async def test_admin_cannot_move_money_out_of_world_or_house(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    currency = _currency()
    account, _ = await _customer(client, currency, 500)
    world, houses = await _system(db, currency)
    before = await _ledger(db, currency)
    for source in (world, houses[0]):
        r = await _move(client, ADMIN, source, account, 5_000_000)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
        assert r.json()["detail"] == "system accounts cannot be moved through transfers"
    # Between two system accounts neither.
    r = await _move(client, ADMIN, world, houses[0], 1)
    assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
    after = await _ledger(db, currency)
    assert after == before  # every balance, the money supply and the deposits
    assert after["customers"] == after["deposited"] == 500
    assert not await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE kind = 'TRANSFER'"
        " AND (from_account_id = ANY($1) OR to_account_id = ANY($1))",
        [world, *houses],
    )


async def test_nobody_transfers_into_a_system_account(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    currency = _currency()
    account, owner = await _customer(client, currency, 300)
    world, houses = await _system(db, currency)
    before = await _ledger(db, currency)
    for target in (world, houses[0]):
        for headers in (ADMIN, auth("bettor", owner)):
            r = await _move(client, headers, account, target, 100)
            assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
    assert await _ledger(db, currency) == before


async def test_deposits_are_the_only_way_money_enters(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    currency = _currency()
    a, a_owner = await _customer(client, currency, 0)
    b, _ = await _customer(client, currency, 0)
    world, houses = await _system(db, currency)
    for amount in (700, 50):
        r = await client.post(
            f"/api/accounts/{a}/deposits",
            json={"amount": amount, "reference": f"dep-{uuid.uuid4()}"},
            headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
        )
        assert r.status_code == 201, r.text
        assert r.json()["fromAccountId"] == world
    # Customers still move their own money among themselves.
    assert (await _move(client, auth("bettor", a_owner), a, b, 150)).status_code == 201
    # A system account takes no deposit (it is not a customer's).
    r = await client.post(
        f"/api/accounts/{houses[0]}/deposits",
        json={"amount": 10, "reference": f"dep-{uuid.uuid4()}"},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 404, r.text
    for src, dst in ((world, a), (houses[0], b), (a, world)):
        assert (await _move(client, ADMIN, src, dst, 10)).status_code == 403
    ledger = await _ledger(db, currency)
    assert ledger["balances"][a] == 600 and ledger["balances"][b] == 150
    assert ledger["balances"][world] == -750
    assert ledger["customers"] == ledger["deposited"] == 750 and ledger["total"] == 0


async def test_system_accounts_belong_to_nobody(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    currency = _currency()
    await _customer(client, currency, 10)
    world, houses = await _system(db, currency)
    for system in (world, houses[0]):
        r = await client.get(f"/api/accounts/{system}", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["ownerId"] is None and r.json()["currency"] == currency
        # Sub "0" is no user (the token is refused); a bettor is told nobody's
        # account does not exist.
        for headers, answer in (
            (_sub_zero_bettor(), (401, "unauthenticated")),
            (auth("bettor", new_id()), (404, "account_not_found")),
        ):
            for path in (f"/api/accounts/{system}", f"/api/accounts/{system}/statement"):
                r = await client.get(path, headers=headers)
                assert (r.status_code, r.json()["code"]) == answer, r.text
        r = await client.get(f"/api/accounts/{system}", headers=auth("bettor", new_id()))
        assert (r.status_code, r.json()["code"]) == (404, "account_not_found")
    # A customer account needs a real owner: 0 (the old "system" owner) or less is refused.
    customers = await db.fetchval(
        "SELECT count(*) FROM wallet_account WHERE currency = $1", currency
    )
    for owner in (0, -1):
        r = await client.post(
            "/api/accounts", json={"ownerId": owner, "currency": currency}, headers=ADMIN
        )
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text
    assert (
        await db.fetchval("SELECT count(*) FROM wallet_account WHERE currency = $1", currency)
        == customers
    )
    # The database holds the rule too.
    assert not await db.fetchval(
        "SELECT count(*) FROM wallet_account WHERE (kind = 'CUSTOMER') <> (owner_id IS NOT NULL)"
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute(
            "INSERT INTO wallet_account (owner_id, currency, created_at) VALUES (0, $1, now())",
            currency,
        )
