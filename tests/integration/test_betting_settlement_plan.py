"""A settlement chunk reads each of its bets once. The grading statement also
settles the chunk's single-leg bets; a plan that rescans the chunk's bets per
bet is invisible at test sizes and quadratic at a real match's (a 5,000-bet
chunk took 25 s instead of 0.1 s), so the executed plan itself is checked."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg

from reservo.betting.repo import Q

CHUNK = 2_000


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", ()) for n in _nodes(child))]


async def test_grading_a_chunk_reads_each_of_its_bets_once(db: asyncpg.Connection) -> None:
    tx = db.transaction()
    await tx.start()
    try:
        match_id = await db.fetchval(
            """INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at,
                                          result_status, home_score, away_score,
                                          settlement_status)
               VALUES ($1, 'H', 'A', now(), '{}', now(), 'FINISHED', 2, 1, 'SETTLING')
               RETURNING id""",
            f"plan-{uuid.uuid4()}",
        )
        # Three chunks of bets, one in three an accumulator (its other leg on
        # another match, still pending), the rest singles.
        first = await db.fetchval(
            """INSERT INTO betting_bet (account_id, owner_id, currency, stake,
                                        potential_payout, created_at, legs)
               SELECT 1, 1, 'EUR', 100, 0, now(), CASE WHEN g % 3 = 0 THEN 2 ELSE 1 END
                 FROM generate_series(1, $1) g
               RETURNING id""",
            3 * CHUNK,
        )
        await db.execute(
            """INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
               SELECT id, $1, '1X2', CASE WHEN id % 2 = 0 THEN 'HOME' ELSE 'AWAY' END, 1.80
                 FROM betting_bet WHERE id >= $2 AND id < $2 + $3""",
            match_id,
            first,
            3 * CHUNK,
        )
        # Statistics that know these rows, as a server holding them has.
        await db.execute("ANALYZE betting_bet, betting_selection")
        plan = json.loads(
            await db.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + Q.grade_chunk,
                match_id,
                CHUNK,
                False,
                "HOME",
                "OVER",
                "YES",
                first - 1,
                datetime.now(UTC),
            )
        )[0]["Plan"]
        graded = await db.fetchval(
            "SELECT count(*) FROM betting_selection WHERE match_id = $1 AND status <> 'PENDING'",
            match_id,
        )
        singles = await db.fetch(
            "SELECT id, status, payout FROM betting_bet"
            " WHERE id >= $1 AND id < $1 + $2 AND legs = 1 AND status <> 'PENDING'",
            first,
            3 * CHUNK,
        )
    finally:
        await tx.rollback()
    assert graded == CHUNK
    assert len(singles) == CHUNK - CHUNK // 3
    assert {(r["status"], r["payout"]) for r in singles} == {("WON", 180), ("LOST", 0)}
    reads = [
        (n["Node Type"], n["Actual Rows"], n["Actual Loops"])
        for n in _nodes(plan)
        if n.get("Relation Name") == "betting_bet"
    ]
    assert reads, plan
    # Each bet of the chunk is read at most once per scan: no scan of betting_bet
    # returns more rows over all its loops than the chunk holds.
    assert all(rows * loops <= CHUNK for _, rows, loops in reads), reads
