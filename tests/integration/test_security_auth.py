"""Findings of the black-box probe, through HTTP: token claims, webhook signatures,
request body size, driver text in errors, and JSON payload hygiene."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import orjson
import pytest

from reservo.bootstrap import Container
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.errors import DomainError
from tests.helpers.auth import PAY_SECRET, RESULTS_SECRET, auth, forge_token, new_id
from tests.helpers.betting import make_account, result_body
from tests.helpers.rentals import at, hold, make_car

ADMIN = auth("admin", 1)
NON_ASCII_MAC = "\u00e9" * 64
SERVICE = auth("service", 1)
ARABIC_INDIC = str.maketrans(
    "0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
)


def problem(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


def bearer(sub: str, role: str = '"bettor"', exp: str | None = None) -> dict[str, str]:
    """A correctly signed token with hand-written claims (any JSON literal)."""
    exp = exp or str(int((datetime.now(UTC) + timedelta(hours=1)).timestamp()))
    return {"Authorization": "Bearer " + forge_token(f'{{"sub":{sub},"role":{role},"exp":{exp}}}')}


# -- tokens ----------------------------------------------------------------------------


async def test_a_sub_0_token_does_not_own_the_system_accounts(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_account(client, 100)  # the first deposit creates the system accounts
    system = await db.fetchval("SELECT id FROM wallet_account WHERE kind = 'WORLD' LIMIT 1")
    assert system is not None
    r = await client.get(f"/api/accounts/{system}", headers=bearer('"0"'))
    assert problem(r) == (401, "unauthenticated")
    # Nor may it move their money.
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": system, "toAccountId": system, "amount": 1},
        headers={**bearer('"0"'), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert problem(r) == (401, "unauthenticated")


async def test_only_the_canonical_spelling_of_a_user_id_is_accepted(
    client: httpx.AsyncClient,
) -> None:
    account, owner = await make_account(client, 0)
    url = f"/api/accounts/{account}"
    r = await client.get(url, headers=bearer(f'"{owner}"'))
    assert r.status_code == 200, r.text
    aliases = [f'"0{owner}"', f'"{str(owner).translate(ARABIC_INDIC)}"', f'"{owner} "', str(owner)]
    for sub in aliases:
        assert problem(await client.get(url, headers=bearer(sub))) == (401, "unauthenticated"), sub


@pytest.mark.parametrize(
    "sub",
    [
        '"0"',
        '"01"',
        '"\u0660"',
        '"\u0661"',
        '"-1"',
        '"99999999999999999999"',
        '"9223372036854775808"',
    ],
)
async def test_tokens_with_a_sub_no_user_has_are_401(client: httpx.AsyncClient, sub: str) -> None:
    for role in ('"bettor"', '"admin"'):
        r = await client.get("/api/accounts/1", headers=bearer(sub, role=role))
        assert problem(r) == (401, "unauthenticated")


@pytest.mark.parametrize(
    ("role", "exp"),
    [
        ('["admin"]', None),  # was a 500: a list is unhashable in the role set
        ('{"admin":1}', None),
        ("1", None),
        ('"admin"', "NaN"),  # NaN compared False with now: never expired
        ('"admin"', "Infinity"),
        ('"admin"', "1e400"),
        ('"admin"', "true"),
    ],
)
async def test_odd_role_or_exp_types_are_401(
    client: httpx.AsyncClient, role: str, exp: str | None
) -> None:
    headers = bearer('"1"', role=role, exp=exp)
    r = await client.post("/api/doctors", json={"name": "X", "timezone": "UTC"}, headers=headers)
    assert problem(r) == (401, "unauthenticated")


async def test_a_token_whose_parser_overflows_is_401(client: httpx.AsyncClient) -> None:
    exp = int((datetime.now(UTC) + timedelta(hours=1)).timestamp())
    for payload in (
        f'{{"sub":"1","role":"admin","exp":{exp},"iat":Infinity}}',
        f'{{"sub":"1","role":"admin","exp":{exp},"nbf":1e400}}',
        f'{{"sub":"1","role":"admin","exp":{"9" * 5000}}}',
    ):
        headers = {"Authorization": "Bearer " + forge_token(payload)}
        r = await client.get("/api/accounts/1", headers=headers)
        assert problem(r) == (401, "unauthenticated")


# -- webhook signatures -----------------------------------------------------------------


def bad_signatures(body: bytes, now: int) -> list[str]:
    good_mac = sign_webhook("whatever", body, now).split("v1=")[1]
    return [
        f"t={'9' * 300},v1={good_mac}",
        f"t={'9' * 400},v1={good_mac}",  # int() of it overflowed the float comparison
        f"t={str(now).translate(ARABIC_INDIC)},v1={good_mac}",
        f"t={now},v1={NON_ASCII_MAC}",  # compare_digest refused non-ASCII text
    ]


async def send_raw_signature(
    client: httpx.AsyncClient, url: str, body: bytes, signature: str
) -> httpx.Response:
    # Header values go out as latin-1 bytes, exactly as a hostile client sends them.
    return await client.post(
        url,
        content=body,
        headers=[
            (b"X-Signature", signature.encode("utf-8")),
            (b"Content-Type", b"application/json"),
        ],
    )


async def test_malformed_payment_signatures_are_bad_signature_and_nothing_is_paid(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    booking = (await hold(client, car["id"], new_id(), at(30), at(40))).json()
    body = orjson.dumps(
        {
            "bookingId": booking["bookingId"],
            "providerTxnId": f"txn-{uuid.uuid4().hex}",
            "amount": booking["depositAmount"],
            "status": "SUCCEEDED",
        }
    )
    now = int(clock.now().timestamp())
    for signature in bad_signatures(body, now):
        r = await send_raw_signature(client, "/api/payments/webhook", body, signature)
        assert problem(r) == (401, "bad_signature"), signature
    paid = "SELECT count(*) FROM payment WHERE booking_id = $1"
    assert await db.fetchval(paid, booking["bookingId"]) == 0
    # The same body, properly signed, is processed: the refusals were the signature's.
    good = sign_webhook(PAY_SECRET, body, now)
    r = await send_raw_signature(client, "/api/payments/webhook", body, good)
    assert r.status_code == 200, r.text
    assert await db.fetchval(paid, booking["bookingId"]) == 1


async def test_malformed_result_signatures_are_bad_signature_and_nothing_is_kept(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    event = f"prov-{uuid.uuid4()}"
    body = result_body(f"ext-{uuid.uuid4()}", 2, 1, event=event)
    rejected_before = await db.fetchval("SELECT count(*) FROM webhook_events_rejected")
    for signature in bad_signatures(body, int(datetime.now(UTC).timestamp())):
        r = await send_raw_signature(client, "/api/webhooks/match-results", body, signature)
        assert problem(r) == (401, "bad_signature"), signature
    kept = "SELECT count(*) FROM webhook_events_fallback WHERE provider_event_id = $1"
    assert await db.fetchval(kept, event) == 0
    assert await db.fetchval("SELECT count(*) FROM webhook_events_rejected") == rejected_before
    good = sign_webhook(RESULTS_SECRET, body)
    r = await send_raw_signature(client, "/api/webhooks/match-results", body, good)
    assert r.status_code == 202, r.text
    assert await db.fetchval(kept, event) == 1


# -- request body limit -----------------------------------------------------------------


async def test_a_declared_oversized_body_is_413_before_auth_and_unread(
    client: httpx.AsyncClient, container: Container
) -> None:
    limit = container.settings.max_body_bytes
    bad_token = {"Authorization": "Bearer not-a-token"}
    r = await client.post("/api/jobs", content=b"x" * (limit + 1), headers=bad_token)
    assert problem(r) == (413, "payload_too_large")
    # The body is never read: not one chunk is pulled from the sender.
    pulled = 0

    async def stream() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(1000):
            pulled += 1
            yield b"x" * 65536

    headers = {**bad_token, "Content-Length": str(50 * 1024 * 1024)}
    r = await client.post("/api/jobs", content=stream(), headers=headers)
    assert problem(r) == (413, "payload_too_large")
    assert pulled == 0
    # Without a token, and on a webhook route (which reads the raw body), too.
    r = await client.post("/api/payments/webhook", content=b" " * (limit + 1))
    assert problem(r) == (413, "payload_too_large")


async def test_an_unsized_body_is_cut_off_once_it_passes_the_limit(
    client: httpx.AsyncClient, container: Container
) -> None:
    limit = container.settings.max_body_bytes
    chunk = 64 * 1024
    pulled = 0

    async def stream() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(limit // chunk + 100):
            pulled += 1
            yield b" " * chunk

    for url, headers in (("/api/jobs", SERVICE), ("/api/payments/webhook", {})):
        pulled = 0
        r = await client.post(url, content=stream(), headers=headers)
        assert "content-length" not in r.request.headers  # sent chunked
        assert problem(r) == (413, "payload_too_large")
        # Reading stopped at the first chunk past the limit.
        assert pulled == limit // chunk + 1


async def test_a_body_just_under_the_limit_is_served_normally(
    client: httpx.AsyncClient, clock: OffsetClock, container: Container, db: asyncpg.Connection
) -> None:
    limit = container.settings.max_body_bytes
    car = await make_car(client)
    booking = (await hold(client, car["id"], new_id(), at(50), at(60))).json()
    body = orjson.dumps(
        {
            "bookingId": booking["bookingId"],
            "providerTxnId": f"txn-{uuid.uuid4().hex}",
            "amount": booking["depositAmount"],
            "status": "SUCCEEDED",
        }
    )
    body += b" " * (limit - len(body))  # JSON allows trailing whitespace
    assert len(body) == limit
    signature = sign_webhook(PAY_SECRET, body, int(clock.now().timestamp()))

    async def stream() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 100_000):
            yield body[i : i + 100_000]

    r = await client.post("/api/payments/webhook", content=body, headers={"X-Signature": signature})
    assert r.status_code == 200, r.text
    assert r.json() == {"result": "confirmed"}
    # The same size, streamed without a length: a replay, so the duplicate answer.
    r = await client.post(
        "/api/payments/webhook", content=stream(), headers={"X-Signature": signature}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"result": "duplicate"}


# -- no driver text in errors -------------------------------------------------------------


async def test_a_bet_whose_payout_overflows_bigint_is_a_plain_422(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    account, owner = await make_account(client, 0)
    long_shot = {"1X2": {"HOME": "1000", "DRAW": "1000", "AWAY": "1000"}}
    matches = []
    for _ in range(3):
        r = await client.post(
            "/api/matches",
            json={
                "externalId": f"ext-{uuid.uuid4()}",
                "home": "A",
                "away": "B",
                "startsAt": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
                "odds": long_shot,
            },
            headers=ADMIN,
        )
        assert r.status_code == 201, r.text
        matches.append(r.json()["id"])
    # 10^12 x 1000^3 = 10^21: more than a bigint holds. It reached the driver,
    # whose message ("invalid input for query argument $5 ...") went to the client.
    # (With the betting payout cap, merged separately, it never reaches the database.)
    body = {
        "accountId": account,
        "stake": 10**12,
        "selections": [
            {"matchId": m, "market": "1X2", "pick": "HOME", "odds": "1000"} for m in matches
        ],
    }
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    r = await client.post("/api/bets", json=body, headers=headers)
    assert problem(r) == (422, "validation_error")
    assert_no_driver_text(r.text)
    assert await db.fetchval("SELECT count(*) FROM betting_bet WHERE account_id = $1", account) == 0


def assert_no_driver_text(text: str) -> None:
    for leak in ("$", "asyncpg", "query argument", "int64", "bigint"):
        assert leak not in text, (leak, text)


async def test_the_database_net_gives_no_driver_text(container: Container) -> None:
    # The last line of defence (core.db) for values validation missed.
    for value in (2**64, -(2**64)):
        with pytest.raises(DomainError) as info:
            async with container.db.connection() as conn:
                await conn.fetchval("SELECT $1::bigint", value)
        err = info.value
        assert (err.status, err.code) == (422, "validation_error")
        assert_no_driver_text(orjson.dumps(err.problem()).decode())


# -- JSON payload hygiene -------------------------------------------------------------------

FAR = (datetime.now(UTC) + timedelta(days=30)).isoformat()


def job_body(extra: str) -> bytes:
    url = '"url":"http://x.test/"'
    return f'{{"category":"http","runAt":"{FAR}","payload":{{{url},"body":{extra}}}}}'.encode()


@pytest.mark.parametrize(
    "extra",
    ["NaN", "Infinity", "-Infinity", '[1, {"y": NaN}]', "[" * 300 + "]" * 300, "[" * 33 + "]" * 33],
    ids=["nan", "infinity", "-infinity", "nested-nan", "300-deep", "35-deep"],
)
async def test_non_json_numbers_and_deep_nesting_are_422_and_store_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, extra: str
) -> None:
    before = await db.fetchval("SELECT count(*) FROM scheduled_job")
    headers = {**SERVICE, "Content-Type": "application/json"}
    r = await client.post("/api/jobs", content=job_body(extra), headers=headers)
    assert problem(r) == (422, "validation_error")
    assert "finite" in r.text or "nest" in r.text, r.text
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == before


async def test_ordinary_nesting_is_still_accepted(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Body (1) > payload (2) > "body" (3..32): the deepest accepted.
    r = await client.post(
        "/api/jobs",
        content=job_body("[" * 30 + "1.5" + "]" * 30),
        headers={**SERVICE, "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text
    await client.delete(f"/api/jobs/{r.json()['jobId']}", headers=SERVICE)
