"""Betting, second release, through HTTP: the match lists, PATCH of odds and
suspension (and its race with bets), and an account's bets."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.app import create_app
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import ODDS, make_account, make_match, place, post_result, result_body
from tests.helpers.plans import plans_of
from tests.helpers.waiting import drain

NEW_ODDS = {
    "1X2": {"HOME": "2.05", "DRAW": "3.30", "AWAY": "3.60"},
    "TOTALS_2_5": {"OVER": "1.90", "UNDER": "1.90"},
    "BTTS": {"YES": "1.75", "NO": "2.00"},
}


@pytest.fixture
async def own(base_settings: Settings, own_database: str) -> AsyncIterator[Container]:
    """A database of its own: the lists show every match, so counts must not
    include other tests' matches."""
    c = build(base_settings.with_(database_url=own_database), OffsetClock())
    yield c
    await c.close()


@pytest.fixture
async def oc(own: Container) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(own, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c


async def _all_pages(
    client: httpx.AsyncClient, url: str, params: dict[str, Any], headers: dict[str, str]
) -> list[list[dict[str, Any]]]:
    pages, after = [], None
    while True:
        q = {**params, **({"after": after} if after else {})}
        r = await client.get(url, params=q, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append(body["items"])
        after = body["next"]
        if after is None:
            return pages


def _cursor(*key: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")


# -- GET /api/matches ---------------------------------------------------------------------


async def test_matches_by_status_soonest_first_page_by_page(
    oc: httpx.AsyncClient, own: Container
) -> None:
    bettor = auth("bettor", new_id())
    # Two matches at the same instant: the id breaks the tie.
    same = timedelta(hours=3)
    upcoming = [
        await make_match(oc, timedelta(hours=5)),
        await make_match(oc, same),
        await make_match(oc, timedelta(hours=1)),
        await make_match(oc, same),
        await make_match(oc, timedelta(minutes=30)),
    ]
    started = [
        await make_match(oc, timedelta(hours=-2)),
        await make_match(oc, timedelta(hours=-1)),
    ]
    settled = await make_match(oc, timedelta(hours=-3))
    r = await post_result(oc, result_body(settled["externalId"], 1, 0))
    assert r.status_code == 202, r.text
    await drain(own.module(Betting).resender, own.module(Outbox).relay)
    # Cancelled before kick-off, its bets not voided yet: no longer upcoming,
    # not settled: STARTED.
    cancelled = await make_match(oc, timedelta(hours=4))
    async with own.db.transaction() as conn:
        await conn.execute(
            "UPDATE betting_match SET result_status = 'CANCELLED', result_event_id = 'x',"
            " settlement_status = 'SETTLING' WHERE id = $1",
            cancelled["id"],
        )

    def order(ms: list[dict[str, Any]]) -> list[int]:
        return [m["id"] for m in sorted(ms, key=lambda m: (m["startsAt"], m["id"]))]

    pages = await _all_pages(oc, "/api/matches", {"status": "UPCOMING", "limit": 2}, bettor)
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [m["id"] for p in pages for m in p] == order(upcoming)
    first = pages[0][0]
    assert first["suspended"] is False and first["odds"] == ODDS
    assert first["settlement"] == {"status": "OPEN", "settledBets": 0}
    # The default status is UPCOMING, the default limit 50.
    r = await oc.get("/api/matches", headers=bettor)
    assert [m["id"] for m in r.json()["items"]] == order(upcoming) and r.json()["next"] is None

    pages = await _all_pages(oc, "/api/matches", {"status": "STARTED", "limit": 1}, bettor)
    assert [m["id"] for p in pages for m in p] == [*order(started), cancelled["id"]]
    assert pages[-1][0]["result"]["status"] == "CANCELLED"

    pages = await _all_pages(oc, "/api/matches", {"status": "SETTLED"}, bettor)
    assert [m["id"] for p in pages for m in p] == [settled["id"]]
    assert pages[0][0]["result"]["homeScore"] == 1
    assert pages[0][0]["settlement"]["status"] == "SETTLED"

    # Time moves on (server clock): the soonest upcoming match has started.
    assert isinstance(own.clock, OffsetClock)
    own.clock.advance(timedelta(minutes=31))
    r = await oc.get("/api/matches", params={"status": "STARTED"}, headers=bettor)
    assert upcoming[4]["id"] in [m["id"] for m in r.json()["items"]]
    r = await oc.get("/api/matches", params={"status": "UPCOMING"}, headers=bettor)
    assert upcoming[4]["id"] not in [m["id"] for m in r.json()["items"]]


@pytest.mark.parametrize(
    "params",
    [
        {"status": "FINISHED"},
        {"status": "upcoming"},
        {"limit": 0},
        {"limit": 201},
        {"limit": "ten"},
        {"after": "not-a-cursor!"},
        {"after": _cursor(1)},  # an id cursor (another list's): one key short
        {"after": _cursor("2030-01-01", 1)},
        {"after": _cursor(1, 1)},  # 1970: no match starts there
        {"after": _cursor(2**62, 1)},  # far past 2100
        {"after": _cursor(10**15 * 2, 0)},
    ],
)
async def test_match_list_refuses_bad_queries(
    client: httpx.AsyncClient, params: dict[str, Any]
) -> None:
    r = await client.get("/api/matches", params=params, headers=auth("bettor", 1))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "validation_error"


async def test_match_list_needs_a_token(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/matches")
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


# -- PATCH /api/matches/{matchId} --------------------------------------------------------------


async def test_patch_odds_and_suspension(client: httpx.AsyncClient) -> None:
    match = await make_match(client)
    account, owner = await make_account(client, 10_000)
    mid = match["id"]

    r = await client.patch(f"/api/matches/{mid}", json={"odds": NEW_ODDS}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["odds"] == NEW_ODDS and r.json()["suspended"] is False
    assert r.json()["settlement"] == {"status": "OPEN", "pendingBets": 0, "settledBets": 0}
    r = await place(client, account, owner, 100, [(mid, "1X2", "HOME")])
    assert r.status_code == 409 and r.json()["code"] == "odds_changed", r.text
    r = await place(client, account, owner, 100, [(mid, "1X2", "HOME")], NEW_ODDS)
    assert r.status_code == 201, r.text
    assert r.json()["selections"][0]["odds"] == "2.05"

    r = await client.patch(f"/api/matches/{mid}", json={"suspended": True}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["suspended"] is True, r.text
    assert r.json()["odds"] == NEW_ODDS  # untouched
    assert r.json()["settlement"]["pendingBets"] == 1
    r = await client.get(f"/api/matches/{mid}", headers=auth("bettor", owner))
    assert r.json()["suspended"] is True
    r = await place(client, account, owner, 100, [(mid, "1X2", "HOME")], NEW_ODDS)
    assert r.status_code == 409 and r.json()["code"] == "market_suspended", r.text
    # An accumulator with one suspended leg is refused as a whole.
    other = await make_match(client)
    await client.patch(f"/api/matches/{other['id']}", json={"odds": NEW_ODDS}, headers=ADMIN)
    r = await place(
        client, account, owner, 100, [(other["id"], "BTTS", "NO"), (mid, "BTTS", "NO")], NEW_ODDS
    )
    assert r.status_code == 409 and r.json()["code"] == "market_suspended", r.text
    r = await client.get(f"/api/accounts/{account}", headers=ADMIN)
    assert r.json()["balance"] == 10_000 - 100  # only the accepted bet was debited

    r = await client.patch(
        f"/api/matches/{mid}", json={"suspended": False, "odds": ODDS}, headers=ADMIN
    )
    assert r.status_code == 200 and r.json()["suspended"] is False, r.text
    r = await place(client, account, owner, 100, [(mid, "1X2", "HOME")])
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"odds": None, "suspended": None},
        {"suspended": "yes"},
        {"suspended": 1},
        {"odds": {}},
        {"odds": {"1X2": {"HOME": "1.80", "DRAW": "3.40"}}},  # incomplete market
        {"odds": {"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "0.90"}}},
        {"odds": {"CORNERS": {"OVER": "1.80", "UNDER": "1.90"}}},
        {"odds": {"1X2": {"HOME": 1.8, "DRAW": "3.40", "AWAY": "4.20"}}},
        {"suspended": True, "startsAt": "2030-01-01T00:00:00Z"},  # not changeable
    ],
)
async def test_patch_refuses_bad_bodies(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    match = await make_match(client)
    r = await client.patch(f"/api/matches/{match['id']}", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error"
    r = await client.get(f"/api/matches/{match['id']}", headers=ADMIN)
    assert r.json()["odds"] == ODDS and r.json()["suspended"] is False


async def test_patch_is_for_admins_of_known_open_matches(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock
) -> None:
    match = await make_match(client, timedelta(minutes=10))
    mid = match["id"]
    for role in ("bettor", "service", "patient"):
        r = await client.patch(
            f"/api/matches/{mid}", json={"suspended": True}, headers=auth(role, 1)
        )
        assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    r = await client.patch(f"/api/matches/{mid}", json={"suspended": True})
    assert r.status_code == 401
    r = await client.patch("/api/matches/999999999999", json={"suspended": True}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["code"] == "match_not_found", r.text
    r = await client.patch("/api/matches/0", json={"suspended": True}, headers=ADMIN)
    assert r.status_code == 422

    # Cancelled before kick-off: it has a result.
    cancelled = await make_match(client, timedelta(hours=5))
    body = result_body(cancelled["externalId"], 0, 0, status="CANCELLED")
    assert (await post_result(client, body)).status_code == 202
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    r = await client.patch(
        f"/api/matches/{cancelled['id']}", json={"suspended": False}, headers=ADMIN
    )
    assert r.status_code == 409 and r.json()["code"] == "match_closed", r.text

    # Started by the server's clock.
    clock.advance(timedelta(minutes=10, seconds=1))
    r = await client.patch(f"/api/matches/{mid}", json={"odds": NEW_ODDS}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["code"] == "match_closed", r.text
    r = await client.get(f"/api/matches/{mid}", headers=ADMIN)
    assert r.json()["odds"] == ODDS


# -- the race: bets at the old odds against one PATCH ----------------------------------------


async def _lock_waiters(conn: asyncpg.Connection) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return n


async def _until(cond: Any, within_s: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if await cond():
            return True
        await asyncio.sleep(0.01)
    return False


@pytest.mark.parametrize(
    ("patch", "refusal"),
    [({"odds": NEW_ODDS}, "odds_changed"), ({"suspended": True}, "market_suspended")],
)
async def test_no_bet_at_old_odds_commits_after_the_patch(
    oc: httpx.AsyncClient,
    own: Container,
    own_database: str,
    patch: dict[str, Any],
    refusal: str,
) -> None:
    """The barrier: N bets have read the match and wait (on their accounts, which
    this test holds locked) to commit; a PATCH of the match is sent meanwhile.
    Without the share lock the PATCH commits at once and the N bets then commit at
    odds the match no longer offers. With it, the PATCH waits for them. Bets sent
    after the PATCH are refused. Every accepted bet must have committed before the
    PATCH did: it is among the bets visible when the PATCH's response arrived."""
    n = 8
    match = await make_match(oc)
    mid = match["id"]
    accounts = [await make_account(oc, 1_000) for _ in range(n + 4)]
    held, late = accounts[:n], accounts[n:]
    watcher = await asyncpg.connect(own_database)
    barrier = await asyncpg.connect(own_database)
    try:
        tx = barrier.transaction()
        await tx.start()
        await barrier.execute(
            "SELECT 1 FROM wallet_account WHERE id = ANY($1::bigint[]) FOR UPDATE",
            [a for a, _ in held],
        )
        bets = [asyncio.create_task(place(oc, a, o, 100, [(mid, "1X2", "HOME")])) for a, o in held]
        assert await _until(lambda: _waiting(watcher, n)), "the bets never reached the barrier"

        patched_at: list[set[int]] = []

        async def send_patch() -> httpx.Response:
            r = await oc.patch(f"/api/matches/{mid}", json=patch, headers=ADMIN)
            # What had committed when the PATCH had.
            patched_at.append(await _bet_ids(watcher, mid))
            return r

        patching = asyncio.create_task(send_patch())
        # Either the PATCH is done (no lock stopped it) or it waits behind the bets.
        await _until(lambda: _done_or_waiting(patching, watcher, n + 1))
        # Bets sent now, at the old odds, by accounts nobody holds.
        after = [asyncio.create_task(place(oc, a, o, 100, [(mid, "1X2", "HOME")])) for a, o in late]
        await asyncio.sleep(0.2)
        await tx.rollback()
        results = await asyncio.gather(*bets, *after)
        r = await patching
        assert r.status_code == 200, r.text
    finally:
        await barrier.close()

    try:
        accepted = {x.json()["id"] for x in results if x.status_code == 201}
        refused = [x.json()["code"] for x in results if x.status_code != 201]
        assert all(code == refusal for code in refused), refused
        # Every bet that had read the match before the PATCH commits before it.
        assert len([x for x in results[:n] if x.status_code == 201]) == n
        late_accepted = await _bet_ids(watcher, mid)
        assert late_accepted == accepted
        assert accepted <= patched_at[0], (
            f"bets {sorted(accepted - patched_at[0])} committed at the old odds after the PATCH had"
        )
        odds = await watcher.fetch(
            "SELECT DISTINCT odds::text FROM betting_selection WHERE match_id = $1", mid
        )
        assert [o[0] for o in odds] == ["1.80"]
    finally:
        await watcher.close()

    # After the PATCH: old odds refused, and (for new odds) the new ones accepted.
    a, o = await make_account(oc, 1_000)
    r = await place(oc, a, o, 100, [(mid, "1X2", "HOME")])
    assert r.status_code == 409 and r.json()["code"] == refusal
    if "odds" in patch:
        r = await place(oc, a, o, 100, [(mid, "1X2", "HOME")], NEW_ODDS)
        assert r.status_code == 201 and r.json()["selections"][0]["odds"] == "2.05"


async def _waiting(conn: asyncpg.Connection, n: int) -> bool:
    return await _lock_waiters(conn) >= n


async def _done_or_waiting(task: asyncio.Task[Any], conn: asyncpg.Connection, n: int) -> bool:
    return task.done() or await _lock_waiters(conn) >= n


async def _bet_ids(conn: asyncpg.Connection, match_id: int) -> set[int]:
    rows = await conn.fetch("SELECT bet_id FROM betting_selection WHERE match_id = $1", match_id)
    return {r["bet_id"] for r in rows}


# -- GET /api/accounts/{accountId}/bets ------------------------------------------------------------


async def test_account_bets_newest_first_by_status_page_by_page(
    client: httpx.AsyncClient, container: Container
) -> None:
    m1, m2 = await make_match(client, timedelta(minutes=5)), await make_match(client)
    account, owner = await make_account(client, 10_000)
    other, _ = await make_account(client, 10_000)
    me = auth("bettor", owner)
    ids = []
    for i in range(5):
        legs = [(m1["id"], "1X2", "HOME")] if i % 2 == 0 else [(m2["id"], "BTTS", "YES")]
        r = await place(client, account, owner, 10 + i, legs)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    acc = [(m1["id"], "1X2", "HOME"), (m2["id"], "BTTS", "YES")]
    r = await place(client, account, owner, 50, acc)
    assert r.status_code == 201, r.text
    ids.append(r.json()["id"])

    url = f"/api/accounts/{account}/bets"
    pages = await _all_pages(client, url, {"limit": 4}, me)
    assert [len(p) for p in pages] == [4, 2]
    flat = [b for p in pages for b in p]
    assert [b["id"] for b in flat] == ids[::-1]
    assert [len(b["selections"]) for b in flat] == [2, 1, 1, 1, 1, 1]
    assert flat[0]["selections"][0]["odds"] == "1.80" and flat[0]["status"] == "PENDING"
    r = await client.get(url, headers=ADMIN)  # admin: any account
    assert [b["id"] for b in r.json()["items"]] == ids[::-1]

    # m1 finishes 2-0: its singles (HOME) win, the accumulator waits on m2.
    assert isinstance(container.clock, OffsetClock)
    container.clock.advance(timedelta(minutes=6))
    r = await post_result(client, result_body(m1["externalId"], 2, 0), container.clock)
    assert r.status_code == 202, r.text
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    me = auth("bettor", owner)
    pages = await _all_pages(client, url, {"status": "WON", "limit": 2}, me)
    assert [b["id"] for p in pages for b in p] == [ids[4], ids[2], ids[0]]
    pages = await _all_pages(client, url, {"status": "PENDING"}, me)
    assert [b["id"] for p in pages for b in p] == [ids[5], ids[3], ids[1]]
    r = await client.get(url, params={"status": "VOID"}, headers=me)
    assert r.status_code == 200 and r.json() == {"items": [], "next": None}
    # Another account's bets are not mixed in.
    r = await client.get(f"/api/accounts/{other}/bets", headers=ADMIN)
    assert r.json() == {"items": [], "next": None}


async def test_account_bets_owner_rules_and_no_probing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    account, owner = await make_account(client, 0)
    # One bet somewhere, so the house accounts exist.
    a, o = await make_account(client, 100)
    assert (
        await place(client, a, o, 1, [((await make_match(client))["id"], "BTTS", "NO")])
    ).status_code == 201
    unknown = 9_000_000_000_000
    url = f"/api/accounts/{account}/bets"
    r = await client.get(url)
    assert r.status_code == 401
    # Someone else's account and an account that does not exist answer alike.
    for path in (url, f"/api/accounts/{unknown}/bets"):
        r = await client.get(path, headers=auth("bettor", owner + 1))
        assert r.status_code == 404 and r.json()["code"] == "account_not_found", r.text
    for role in ("patient", "customer", "service", "host"):
        r = await client.get(url, headers=auth(role, owner))
        assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    r = await client.get(f"/api/accounts/{unknown}/bets", headers=ADMIN)
    assert r.status_code == 404 and r.json()["code"] == "account_not_found", r.text
    # A system account (the house) places no bets: not a bettor's, not found.
    house = await db.fetchval("SELECT id FROM wallet_account WHERE kind = 'HOUSE' LIMIT 1")
    r = await client.get(f"/api/accounts/{house}/bets", headers=ADMIN)
    assert r.status_code == 404 and r.json()["code"] == "account_not_found", r.text
    r = await client.get(f"/api/accounts/{house}/bets", headers=auth("bettor", owner))
    assert r.status_code == 404 and r.json()["code"] == "account_not_found", r.text
    r = await client.get(url, headers=auth("bettor", owner))
    assert r.status_code == 200 and r.json() == {"items": [], "next": None}
    for params in (
        {"status": "SETTLED"},
        {"limit": 0},
        {"limit": 201},
        {"after": "%%%"},
        {"after": _cursor(0)},
        {"after": _cursor(1, 2)},
        {"after": _cursor("1")},
        {"after": _cursor(2**63)},
    ):
        r = await client.get(url, params=params, headers=auth("bettor", owner))
        assert r.status_code == 422 and r.json()["code"] == "validation_error", (params, r.text)


# -- the plans: page one million costs what page one costs --------------------------------


async def test_list_plans_walk_an_index_without_sorting(own: Container) -> None:
    """With enough rows that the planner has a choice, each list query walks its
    index in the list's order from the cursor and stops at the page: no Sort node
    over the set, no sequential scan."""
    now = datetime.now(UTC)
    async with own.db.transaction() as conn:
        await conn.execute(
            "INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at,"
            " settlement_status, result_status)"
            " SELECT 'plan-' || g, 'A', 'B', $1::timestamptz + g * interval '1 minute', '{}', $1,"
            "        CASE WHEN g % 3 = 0 THEN 'SETTLED' ELSE 'OPEN' END,"
            "        CASE WHEN g % 3 = 0 THEN 'FINISHED' END"
            "   FROM generate_series(-100000, 100000) g",
            now,
        )
        await conn.execute(
            "INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout,"
            " created_at, status)"
            # Account 7: a heavy bettor with 2,000 bets, among 1,000 lighter ones.
            " SELECT CASE WHEN g % 100 = 0 THEN 7 ELSE g % 1000 + 8 END, 1, 'EUR', 1, 2, $1,"
            "        CASE WHEN g % 700 = 0 THEN 'PENDING' ELSE 'LOST' END"
            "   FROM generate_series(1, 200000) g",
            now,
        )
        await conn.execute("ANALYZE betting_match")
        await conn.execute("ANALYZE betting_bet")
    from reservo.betting.repo import Q

    key = (now + timedelta(days=10), 12345)
    plans = {
        "upcoming": (Q.matches_upcoming, (now, *key, 51), "betting_match_unsettled_starts"),
        "started": (Q.matches_started, (now, *key, 51), "betting_match_unsettled_starts"),
        "settled": (Q.matches_settled, (*key, 51), "betting_match_settled_starts"),
        "bets": (Q.account_bets, (7, 150_000, 51), "betting_bet_account"),
        "bets_by_status": (
            Q.account_bets_by_status,
            (7, 150_000, 51, "PENDING"),
            "betting_bet_account",
        ),
    }
    async with own.db.connection() as conn:
        for name, (sql, args, index) in plans.items():
            for mode, plan in (await plans_of(conn, name, sql, args)).items():
                assert index in plan, (name, mode, plan)
                assert "Seq Scan" not in plan, (name, mode, plan)
                if name == "bets_by_status":
                    # Status is not indexed (settling a bet stays HOT): a rare
                    # status reads the account's bets, through its index, and the
                    # planner may sort those; never the table.
                    continue
                assert "Bitmap" not in plan, (name, mode, plan)
                if name == "started":
                    # Merged in order; the one Sort is over the few settling matches.
                    walk = plan.split("Index Scan using betting_match_unsettled_starts")[0]
                    assert walk.count("Sort Key") == 1 and "Merge Append" in walk, plan
                else:
                    assert "Sort" not in plan, (name, mode, plan)


# -- the contract in the OpenAPI document ---------------------------------------------------


async def test_openapi_documents_the_new_endpoints(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]

    def ok_schema(op: dict[str, Any]) -> str:
        ref: str = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        return ref.rsplit("/", 1)[1]

    assert ok_schema(paths["/api/matches"]["get"]) == "MatchPage"
    assert ok_schema(paths["/api/matches/{matchId}"]["patch"]) == "MatchOut"
    assert ok_schema(paths["/api/accounts/{accountId}/bets"]["get"]) == "BetPage"
    assert set(schemas["MatchPage"]["properties"]) == {"items", "next"}
    assert "suspended" in schemas["MatchOut"]["properties"]
    assert set(schemas["MatchPatch"]["properties"]) == {"odds", "suspended"}
    # Each operation lists the statuses it can answer, and only those.
    for path, method, statuses in (
        ("/api/matches", "get", {"401", "422"}),
        ("/api/matches/{matchId}", "patch", {"401", "403", "404", "409", "413", "422"}),
        ("/api/accounts/{accountId}/bets", "get", {"401", "403", "404", "422"}),
    ):
        errors = {s for s in paths[path][method]["responses"] if int(s) >= 400}
        # 503 unavailable: on every operation.
        assert errors - {"503"} == statuses, (path, errors)
    params = {p["name"] for p in paths["/api/matches"]["get"]["parameters"]}
    assert {"status", "limit", "after"} <= params


# -- a fresh database of the module: demo data ----------------------------------------------


async def test_demo_loads_upcoming_matches_once(base_settings: Settings, own_database: str) -> None:
    from reservo import demo

    # Built as `reservo up --demo` builds it (its recurring job calls its own address).
    settings = base_settings.with_(database_url=own_database)
    own = build(demo.settings_for_demo(settings), OffsetClock())
    try:
        await demo.load(own)
        await demo.load(own)
        page = await own.module(Betting).service.list_matches("UPCOMING", None, 100)
    finally:
        await own.close()
    assert len(page) == len(demo.MATCHES)
    assert all(m.external_id.startswith("demo-") for m in page)
