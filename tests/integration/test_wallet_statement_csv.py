"""GET /api/accounts/{id}/statement.csv through HTTP against real PostgreSQL:
order, running balances, the date range, escaping, who may read it, and a
stream of 20,000 entries read and sent a chunk at a time."""

from __future__ import annotations

import csv
import io
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from reservo.wallet.export import HEADER, StatementCut, StatementExport
from reservo.wallet.setup import Wallet
from tests.helpers.auth import ADMIN, SERVICE, auth, new_id
from tests.helpers.betting import make_account

ENTRIES = "SELECT id FROM wallet_entry WHERE account_id = $1 ORDER BY id"


def statement_url(account: int, start: str, end: str) -> str:
    return f"/api/accounts/{account}/statement.csv?from={start}&to={end}"


def parse(r: httpx.Response) -> list[dict[str, str]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    lines = list(csv.reader(io.StringIO(r.text, newline="")))
    assert tuple(lines[0]) == HEADER
    return [dict(zip(HEADER, line, strict=True)) for line in lines[1:]]


async def deposit(client: httpx.AsyncClient, account: int, amount: int, reference: str) -> None:
    r = await client.post(
        f"/api/accounts/{account}/deposits",
        json={"amount": amount, "reference": reference},
        headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text


async def send(
    client: httpx.AsyncClient, owner: int, source: int, target: int, amount: int
) -> None:
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": source, "toAccountId": target, "amount": amount},
        headers={**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text


def problem(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


async def test_statement_lists_a_days_entries_oldest_first_with_running_balances_and_escapes(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    a, owner = await make_account(client, 0)
    b, _ = await make_account(client, 0)
    await deposit(client, a, 1_000, "before")
    tricky = ["a,b", 'say "hi"', "two\r\nlines", "=SUM(A1:A9)", "-1+2", "plain ü"]
    for i, ref in enumerate(tricky):
        await deposit(client, a, 10 * (i + 1), ref)
    await send(client, owner, a, b, 75)
    await send(client, owner, a, b, 5)
    await deposit(client, a, 7, "after")
    # The first entry two days before the range, the last the day after it.
    day = datetime(2030, 6, 15, tzinfo=UTC)
    ids = [r["id"] for r in await db.fetch(ENTRIES, a)]
    shifted = [day - timedelta(days=2)] + [day + timedelta(hours=1)] * 8 + [day + timedelta(days=1)]
    await db.executemany(
        "UPDATE wallet_entry SET created_at = $2 WHERE id = $1",
        list(zip(ids, shifted, strict=True)),
    )
    r = await client.get(
        statement_url(a, "2030-06-15", "2030-06-15"), headers=auth("bettor", owner)
    )
    rows = parse(r)
    assert [int(x["amount"]) for x in rows] == [10, 20, 30, 40, 50, 60, -75, -5]
    ids = [int(x["entry_id"]) for x in rows]
    assert ids == sorted(ids)
    # The balance carried from before the range, each line adding its amount.
    assert [int(x["balance_after"]) for x in rows] == [
        1010,
        1030,
        1060,
        1100,
        1150,
        1210,
        1135,
        1130,
    ]
    assert [x["kind"] for x in rows] == ["DEPOSIT"] * 6 + ["TRANSFER"] * 2
    # Escaped, not split: commas, quotes, line breaks; a would-be formula is defused.
    assert [x["reference"] for x in rows[:6]] == [
        "a,b",
        'say "hi"',
        "two\r\nlines",
        "'=SUM(A1:A9)",
        "'-1+2",
        "plain ü",
    ]
    assert rows[-1]["reference"] == "" and rows[-1]["transfer_id"].isdigit()
    for x in rows:
        at = datetime.fromisoformat(x["created_at"].replace("Z", "+00:00"))
        assert at.date() == day.date() and at.tzinfo is not None and x["created_at"].endswith("Z")
    # The whole range: the first and the last deposit too, ending on the balance.
    whole = parse(
        await client.get(
            statement_url(a, "2030-06-13", "2030-06-16"),
            headers=ADMIN,
        )
    )
    assert [x["reference"] for x in (whole[0], whole[-1])] == ["before", "after"]
    balance = (await client.get(f"/api/accounts/{a}", headers=ADMIN)).json()["balance"]
    assert int(whole[-1]["balance_after"]) == balance == 1_137
    # A range with nothing in it: the header alone.
    empty = await client.get(statement_url(a, "2001-01-01", "2001-12-31"), headers=ADMIN)
    assert parse(empty) == []


async def test_statement_range_rules_and_who_may_read_it(client: httpx.AsyncClient) -> None:
    a, owner = await make_account(client, 100)
    mine = auth("bettor", owner)
    assert parse(await client.get(statement_url(a, "2024-01-01", "2024-12-31"), headers=mine)) == []
    refused = [
        ("2024-01-01", "2025-01-01", "to"),  # 367 days
        ("2024-02-01", "2024-01-31", "to"),  # reversed
        ("2024-1-01", "2024-01-31", "from"),
        ("2024-02-30", "2024-03-01", "from"),
        ("1999-12-31", "2000-01-05", "from"),
        ("2099-12-01", "2100-01-01", "to"),
        ("2024-01-01T00:00", "2024-01-02", "from"),
        ("\uff11\uff12\uff13\uff14-01-01", "2024-01-02", "from"),  # full-width digits
    ]
    for start, end, field in refused:
        r = await client.get(statement_url(a, start, end), headers=mine)
        assert problem(r) == (422, "validation_error"), (start, end)
        assert r.json()["errors"][0]["loc"][-1] == field, (start, end, r.json())
    r = await client.get(f"/api/accounts/{a}/statement.csv?from=2024-01-01", headers=mine)
    assert problem(r) == (422, "validation_error")
    # Not yours, or no such account: 404 alike; a role that has no accounts: 403.
    other = await client.get(
        statement_url(a, "2024-01-01", "2024-01-02"), headers=auth("bettor", new_id())
    )
    assert problem(other) == (404, "account_not_found")
    gone = await client.get(statement_url(2**62, "2024-01-01", "2024-01-02"), headers=ADMIN)
    assert problem(gone) == (404, "account_not_found")
    host = await client.get(
        statement_url(a, "2024-01-01", "2024-01-02"), headers=auth("host", owner)
    )
    assert problem(host) == (403, "forbidden")
    assert (await client.get(statement_url(a, "2024-01-01", "2024-01-02"))).status_code == 401


async def seed(db: asyncpg.Connection, account: int, n: int, at: datetime) -> int:
    """``n`` ledger entries of ``account`` at ``at`` (plus a microsecond each),
    written in SQL as the bench does; returns the balance after the last."""
    await db.execute(
        """
        INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind,
                                  reference, created_at)
        SELECT $1, g, 1 + g % 7, sum(1 + g % 7) OVER (ORDER BY g), 'DEPOSIT',
               'ref-' || g || '-' || repeat('x', 80), $3::timestamptz + g * interval '1 microsecond'
          FROM generate_series(1, $2::int) AS g
        """,
        account,
        n,
        at,
    )
    return int(await db.fetchval("SELECT sum(1 + g % 7) FROM generate_series(1, $1::int) g", n))


async def stream_through_the_app(
    container: Container, path: str, query: str, owner: int
) -> tuple[int, list[int], int]:
    """GET ``path`` straight through the ASGI app, keeping each body message as
    the app sends it (httpx's in-process transport would join them), and the
    peak of the memory Python allocated meanwhile (tracemalloc): the app's own,
    since the messages are only counted here, never joined."""
    app = create_app(container, owns_container=False)
    bearer = auth("bettor", owner)["Authorization"].encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"reservo.test"), (b"authorization", bearer)],
        "client": ("127.0.0.1", 40000),
        "server": ("reservo.test", 80),
    }
    status = 0
    sizes: list[int] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])  # type: ignore[call-overload]
        elif message["type"] == "http.response.body":
            body = message["body"]
            assert isinstance(body, bytes)
            if body:
                sizes.append(body.count(b"\r\n"))

    tracemalloc.start()
    try:
        await app(scope, receive, send)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return status, sizes, peak


async def test_20000_entries_are_read_and_sent_a_chunk_at_a_time(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    a, owner = await make_account(client, 0)
    total = await seed(db, a, 20_000, datetime(2031, 3, 5, 12, tzinfo=UTC))
    url = statement_url(a, "2031-03-05", "2031-03-05")
    # The whole body, through HTTP: every entry once, oldest first, adding up.
    r = await client.get(url, headers=auth("bettor", owner))
    rows = list(csv.reader(io.StringIO(r.text, newline="")))[1:]
    assert len(rows) == 20_000
    assert [int(x[0]) for x in rows] == sorted(int(x[0]) for x in rows)
    assert int(rows[-1][4]) == total
    # The same download as the app sends it: one message per cursor fetch, none
    # holding more than a fetch's rows, and the app's memory peak the same as
    # for a quarter of the entries (nothing grows with the statement's length).
    prefetch = container.settings.wallet.statement_prefetch
    path, query = url.split("?")
    status, sizes, peak = await stream_through_the_app(container, path, query, owner)
    assert status == 200
    assert sum(sizes) == 20_001  # the header and every entry
    assert len(sizes) > 20_000 // prefetch and max(sizes) <= prefetch
    small, small_owner = await make_account(client, 0)
    await seed(db, small, 5_000, datetime(2031, 3, 5, 12, tzinfo=UTC))
    path, query = statement_url(small, "2031-03-05", "2031-03-05").split("?")
    status, _, small_peak = await stream_through_the_app(container, path, query, small_owner)
    assert status == 200
    print(f"app peak: {small_peak} B for 5,000 entries, {peak} B for 20,000 ({len(r.content)} B)")
    assert peak < 1.5 * small_peak, (small_peak, peak)


async def _client_with(
    base_settings: Settings, clock: OffsetClock, **update: object
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    c = build(base_settings.with_(**update), clock)
    app = create_app(c, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as client:
        yield client, c
    await c.close()


@pytest.fixture
async def bounded(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    async for pair in _client_with(
        base_settings, clock, wallet_statement_streams=1, wallet_statement_prefetch=100
    ):
        yield pair


async def test_downloads_beyond_the_limit_wait_their_turn_and_a_long_one_is_cut(
    bounded: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, container = bounded
    a, owner = await make_account(client, 0)
    await seed(db, a, 5_000, datetime(2032, 1, 1, tzinfo=UTC))
    url = statement_url(a, "2032-01-01", "2032-01-01")
    export: StatementExport = container.module(Wallet).export
    # One download in progress (its first step holds the slot and the connection).
    held = export.lines(a, datetime(2032, 1, 1, tzinfo=UTC), datetime(2032, 1, 2, tzinfo=UTC))
    await anext(held)
    busy = await client.get(url, headers=auth("bettor", owner))
    assert problem(busy) == (503, "statement_busy") and busy.headers["Retry-After"] == "5"
    await held.aclose()
    assert export.running == 0
    assert len(parse(await client.get(url, headers=auth("bettor", owner)))) == 5_000
    # Past its time the body is cut (never a short statement that looks whole),
    # and the slot and the read transaction are given back.
    kept = export.config
    export.config = kept.model_copy(update={"statement_max_s": 0.001})
    with pytest.raises(StatementCut):
        await client.get(url, headers=auth("bettor", owner))
    assert export.running == 0
    export.config = kept
    assert len(parse(await client.get(url, headers=ADMIN))) == 5_000
