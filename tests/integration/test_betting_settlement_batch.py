"""Results settled in batches (Settlement.settle_many, the resender's batch, a
Kafka fetch): many matches graded by one statement in one transaction give the
outcomes that settling them one by one gives; batches running at once over the
same matches never pay or notify a bet twice; a batch keeps each match's results
in order and each providerEventId once; and the grading statement finds the
claimed legs without reading the others."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from reservo.betting.repo import Q
from reservo.betting.results import result_event
from reservo.betting.schemas import ResultIn
from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.betting import kick_off, make_account, make_match, place, post_result
from tests.helpers.betting import result_body as scored_body

MATCHES = 9
SOON = timedelta(minutes=5)
PICKS = [("1X2", "HOME"), ("1X2", "DRAW"), ("TOTALS_2_5", "OVER"), ("BTTS", "NO")]


def score(i: int) -> tuple[int, int] | None:
    """Match i's result: the last one cancelled (its legs VOID), else a score."""
    return None if i == MATCHES - 1 else (i % 3, (i // 3) % 3)


def payload(external_id: str, i: int, event: str | None = None) -> dict[str, Any]:
    s = score(i)
    return {
        "matchExternalId": external_id,
        "status": "CANCELLED" if s is None else "FINISHED",
        "homeScore": None if s is None else s[0],
        "awayScore": None if s is None else s[1],
        "providerEventId": event or f"batch-{uuid.uuid4()}",
    }


async def book(client: httpx.AsyncClient) -> dict[str, Any]:
    """MATCHES matches with singles on each market and 3-leg accumulators across
    them, plus one accumulator with a leg on a match outside the set (it must stay
    pending). Returns the matches, the bets in placement order and the accounts."""
    matches = [await make_match(client, SOON) for _ in range(MATCHES)]
    outside = await make_match(client, SOON)
    accounts = [await make_account(client, 1_000_000) for _ in range(3)]
    bets = []
    for i, m in enumerate(matches):
        for k, (market, pick) in enumerate(PICKS):
            account, owner = accounts[(i + k) % len(accounts)]
            r = await place(client, account, owner, 100 + 10 * k, [(m["id"], market, pick)])
            assert r.status_code == 201, r.text
            bets.append(r.json()["id"])
        legs = [(matches[(i + j) % MATCHES]["id"], *PICKS[(i + j) % len(PICKS)]) for j in range(3)]
        account, owner = accounts[i % len(accounts)]
        r = await place(client, account, owner, 50, legs)
        assert r.status_code == 201, r.text
        bets.append(r.json()["id"])
    account, owner = accounts[0]
    r = await place(
        client,
        account,
        owner,
        70,
        [(matches[0]["id"], "1X2", "DRAW"), (outside["id"], "BTTS", "NO")],
    )
    assert r.status_code == 201, r.text
    bets.append(r.json()["id"])
    return {
        "matches": matches,
        "outside": outside,
        "bets": bets,
        "accounts": [a for a, _ in accounts],
    }


def start(clock: OffsetClock, *booked: dict[str, Any]) -> None:
    """Kick off every booked match (results count once a match started)."""
    kick_off(clock, *(m for b in booked for m in [*b["matches"], b["outside"]]))


async def outcome(db: asyncpg.Connection, booked: dict[str, Any]) -> dict[str, Any]:
    """What settlement left, in placement order so two booked sets compare."""
    bets = await db.fetch(
        "SELECT id, status, payout FROM betting_bet WHERE id = ANY($1::bigint[]) ORDER BY id",
        booked["bets"],
    )
    credits = await db.fetch(
        """SELECT reference, amount FROM wallet_transfer
            WHERE kind IN ('PAYOUT', 'REFUND') AND reference = ANY($1::text[])""",
        [f"bet:{b}" for b in booked["bets"]],
    )
    balances = await db.fetch(
        "SELECT balance FROM wallet_account WHERE id = ANY($1::bigint[]) ORDER BY id",
        booked["accounts"],
    )
    ids = [m["id"] for m in booked["matches"]]
    matches = await db.fetch(
        "SELECT settlement_status, settled_bets FROM betting_match"
        " WHERE id = ANY($1::bigint[]) ORDER BY id",
        ids,
    )
    notified = Counter(
        bet["betId"]
        for row in await db.fetch(
            "SELECT payload FROM outbox WHERE topic = 'betting.match.bets-settled.v1'"
            " AND (payload->>'matchId')::bigint = ANY($1::bigint[])",
            ids,
        )
        for bet in json.loads(row["payload"])["bets"]
    )
    paid = {r["reference"]: r["amount"] for r in credits}
    return {
        "bets": [(r["status"], r["payout"]) for r in bets],
        "credits": [paid.get(f"bet:{r['id']}") for r in bets],
        "credit_rows": len(credits),
        "balances": [r["balance"] for r in balances],
        "matches": [(r["settlement_status"], r["settled_bets"]) for r in matches],
        "notified": [notified.get(r["id"], 0) for r in bets],
    }


async def accept(container: Container, booked: dict[str, Any]) -> list[int]:
    settlement = container.module(Betting).settlement
    async with container.db.transaction() as conn:
        return await settlement.accept_many_in_tx(
            conn, [payload(m["externalId"], i) for i, m in enumerate(booked["matches"])]
        )


async def test_a_batch_settles_as_one_by_one_does(
    container: Container, client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    batched, single = await book(client), await book(client)
    start(clock, batched, single)
    settlement = container.module(Betting).settlement

    to_settle = await accept(container, batched)
    assert sorted(to_settle) == sorted(m["id"] for m in batched["matches"])
    await settlement.settle_many(to_settle)

    for i, m in enumerate(single["matches"]):
        async with container.db.transaction() as conn:
            assert await settlement.accept_in_tx(conn, payload(m["externalId"], i)) == m["id"]
        await settlement.settle(m["id"])

    got, want = await outcome(db, batched), await outcome(db, single)
    assert got == want
    # Something was at stake: winners, losers, refunds, and the accumulator whose
    # other match has no result still pending, neither paid nor notified.
    assert {s for s, _ in got["bets"]} == {"WON", "LOST", "VOID", "PENDING"}
    assert got["bets"][-1] == ("PENDING", None) and got["notified"][-1] == 0
    assert all(s == "SETTLED" for s, _ in got["matches"])
    # Each settled bet notified once, each winner or refund credited once, its payout.
    assert got["notified"] == [int(s != "PENDING") for s, _ in got["bets"]]
    assert got["credits"] == [p if p else None for _, p in got["bets"]]
    # The batch graded the legs of all its matches in one transaction.
    xids = await db.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM betting_selection WHERE match_id = ANY($1)",
        [m["id"] for m in batched["matches"]],
    )
    assert xids == 1


async def test_concurrent_batches_never_pay_or_notify_twice(
    container: Container, client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    booked = await book(client)
    start(clock, booked)
    settlement = container.module(Betting).settlement
    ids = await accept(container, booked)
    # Overlapping batches in different orders, released together.
    batches = [ids, ids[::-1], ids[::2], ids[1::2], ids[2:] + ids[:2], ids]
    barrier = asyncio.Barrier(len(batches))

    async def one(batch: list[int]) -> None:
        await barrier.wait()
        await settlement.settle_many(batch)

    await asyncio.gather(*(one(b) for b in batches))
    got = await outcome(db, booked)
    settled = [(s, p) for s, p in got["bets"] if s != "PENDING"]
    assert len(settled) == len(got["bets"]) - 1
    assert got["notified"] == [int(s != "PENDING") for s, _ in got["bets"]]
    assert got["credits"] == [p if p else None for _, p in got["bets"]]
    assert got["credit_rows"] == sum(1 for _, p in got["bets"] if p)
    assert all(s == "SETTLED" for s, _ in got["matches"])
    ledger = await db.fetchrow(
        """SELECT count(*) FILTER (WHERE balance <> coalesce(e.sum, 0)) AS off,
                  sum(balance) AS total
             FROM wallet_account a
             LEFT JOIN (SELECT account_id, sum(amount) FROM wallet_entry GROUP BY 1) e
               ON e.account_id = a.id"""
    )
    assert ledger["off"] == 0 and ledger["total"] == 0


async def test_the_resender_settles_its_batch_in_order_and_once(
    container: Container, client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    """Through the webhook and the fallback table: one claim of the resender takes
    every result, the same providerEventId twice and a conflicting second result
    of a match among them. The first result of each match settles it, in one
    grading transaction; the repeat is recorded once, the conflict parked."""
    booked = await book(client)
    start(clock, booked)
    first = booked["matches"][0]["externalId"]
    again = f"again-{uuid.uuid4()}"
    for i, m in enumerate(booked["matches"]):
        p = payload(m["externalId"], i, again if i == 0 else None)
        body = json.dumps(p).encode()
        assert (await post_result(client, body, clock)).status_code == 202
    repeat = json.dumps(payload(first, 0, again)).encode()
    assert (await post_result(client, repeat, clock)).status_code == 202
    conflict = scored_body(first, 7, 7, event=f"conflict-{uuid.uuid4()}")
    assert (await post_result(client, conflict, clock)).status_code == 202

    resender = container.module(Betting).resender
    assert await resender.run_once() == MATCHES + 2

    got = await outcome(db, booked)
    assert all(s == "SETTLED" for s, _ in got["matches"])
    assert got["notified"] == [int(s != "PENDING") for s, _ in got["bets"]]
    assert got["credits"] == [p if p else None for _, p in got["bets"]]
    outcomes = Counter(
        r["outcome"]
        for r in await db.fetch(
            "SELECT outcome FROM betting_result_inbox WHERE match_external_id = $1", first
        )
    )
    assert outcomes == {"APPLIED": 1, "PARKED": 1}
    match = await db.fetchrow(
        "SELECT home_score, away_score, result_event_id FROM betting_match WHERE external_id = $1",
        first,
    )
    assert (match["home_score"], match["away_score"], match["result_event_id"]) == (0, 0, again)
    left = await db.fetchval(
        "SELECT count(*) FROM webhook_events_fallback WHERE status <> 'RESENT'"
        " AND payload->>'matchExternalId' = ANY($1::text[])",
        [m["externalId"] for m in booked["matches"]],
    )
    assert left == 0
    xids = await db.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM betting_selection WHERE match_id = ANY($1)",
        [m["id"] for m in booked["matches"]],
    )
    assert xids == 1


async def test_a_kafka_fetch_is_settled_as_one_batch(
    container: Container, client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    """The consumer's batch handler (what the Kafka runner calls with a partition's
    fetched records): every result of the fetch recorded, its matches graded in
    one transaction, a record delivered twice in the fetch recorded once."""
    booked = await book(client)
    start(clock, booked)
    results = [
        ResultIn.model_validate(payload(m["externalId"], i))
        for i, m in enumerate(booked["matches"])
    ]
    fetched = [result_event(r, clock.now()) for r in [*results, results[3]]]
    await container.module(Betting).settlement.handle_batch(fetched)

    got = await outcome(db, booked)
    assert all(s == "SETTLED" for s, _ in got["matches"])
    assert got["notified"] == [int(s != "PENDING") for s, _ in got["bets"]]
    assert got["credits"] == [p if p else None for _, p in got["bets"]]
    applied = await db.fetchval(
        "SELECT count(*) FROM betting_result_inbox WHERE outcome = 'APPLIED'"
        " AND provider_event_id = ANY($1::text[])",
        [r.provider_event_id for r in results],
    )
    assert applied == MATCHES
    xids = await db.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM betting_selection WHERE match_id = ANY($1)",
        [m["id"] for m in booked["matches"]],
    )
    assert xids == 1


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", ()) for n in _nodes(child))]


async def test_grading_a_batch_reads_only_its_claimed_legs(db: asyncpg.Connection) -> None:
    """With many legs of other matches in the table, the batch's statement reads
    no more legs than it claims (a join on the key hashed the whole table)."""
    tx = db.transaction()
    await tx.start()
    try:
        # A batch of 500 settling matches, 5 legs each.
        ids = await db.fetchval(
            """WITH m AS (
                 INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at,
                                            result_status, home_score, away_score,
                                            settlement_status)
                 SELECT $1 || g, 'H', 'A', now(), '{}', now(), 'FINISHED', 2, 1, 'SETTLING'
                   FROM generate_series(1, 500) g
                 RETURNING id)
               SELECT array_agg(id ORDER BY id) FROM m""",
            f"plan-batch-{uuid.uuid4()}-",
        )
        # 100,000 legs of 2,000 other matches: a table where hashing every leg
        # costs what it costs at a real size.
        others = await db.fetchval(
            """WITH m AS (
                 INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
                 SELECT $1 || g, 'H', 'A', now(), '{}', now() FROM generate_series(1, 2000) g
                 RETURNING id)
               SELECT array_agg(id ORDER BY id) FROM m""",
            f"plan-{uuid.uuid4()}-",
        )
        await db.execute(
            """WITH b AS (
                 INSERT INTO betting_bet (account_id, owner_id, currency, stake,
                                          potential_payout, created_at, legs)
                 SELECT 1, 1, 'EUR', 100, 0, now(), 1 FROM generate_series(1, 102500) g
                 RETURNING id)
               INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
               SELECT id, CASE WHEN n <= 2500 THEN ($1::bigint[])[1 + n % 500]
                               ELSE ($2::bigint[])[1 + n % 2000] END,
                      '1X2', 'HOME', 1.80
                 FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM b) x""",
            ids,
            others,
        )
        await db.execute("ANALYZE betting_bet, betting_selection")
        n = len(ids)
        plan = json.loads(
            await db.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + Q.grade_matches,
                ids,
                [False] * n,
                ["HOME"] * n,
                ["OVER"] * n,
                ["YES"] * n,
                5_000,
                datetime.now(UTC),
            )
        )[0]["Plan"]
        graded = await db.fetchval(
            "SELECT count(*) FROM betting_selection WHERE match_id = ANY($1) AND status = 'WON'",
            ids,
        )
    finally:
        await tx.rollback()
    assert graded == 2500
    reads = [
        (n["Node Type"], n["Actual Rows"], n["Actual Loops"])
        for n in _nodes(plan)
        if n.get("Relation Name") == "betting_selection"
    ]
    assert reads, plan
    assert all(rows * loops <= 2500 for _, rows, loops in reads), reads
