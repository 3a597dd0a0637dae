"""The SQL settlement (grade_chunk + settle_bets) property-tested against a plain
Python model of the rules, on random accumulators and random results."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

import asyncpg
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from tests.helpers.betting import ODDS

PICKS = {"1X2": ["HOME", "DRAW", "AWAY"], "TOTALS_2_5": ["OVER", "UNDER"], "BTTS": ["YES", "NO"]}

# A result: None (not played yet), "CANCELLED", or a final score.
results = st.one_of(
    st.none(), st.just("CANCELLED"), st.tuples(st.integers(0, 4), st.integers(0, 4))
)
leg = st.tuples(
    st.sampled_from(sorted(PICKS)).flatmap(
        lambda m: st.tuples(st.just(m), st.sampled_from(PICKS[m]))
    ),
    st.decimals(min_value=Decimal("1.01"), max_value=Decimal("30"), places=2),
    results,
)
accumulators = st.tuples(st.integers(1, 10**7), st.lists(leg, min_size=1, max_size=8))


def model(
    stake: int, legs: list[tuple[tuple[str, str], Decimal, object]]
) -> tuple[str, int | None]:
    """The rules as betting.domain states them, written independently of reservo."""
    states = []
    for (market, pick), odds, result in legs:
        if result is None:
            states.append(("PENDING", odds))
        elif result == "CANCELLED":
            states.append(("VOID", odds))
        else:
            h, a = result  # type: ignore[misc]
            winner = {
                "1X2": "HOME" if h > a else "DRAW" if h == a else "AWAY",
                "TOTALS_2_5": "OVER" if h + a >= 3 else "UNDER",
                "BTTS": "YES" if h >= 1 and a >= 1 else "NO",
            }[market]
            states.append(("WON" if pick == winner else "LOST", odds))
    if any(s == "LOST" for s, _ in states):
        return "LOST", 0
    if any(s == "PENDING" for s, _ in states):
        return "PENDING", None
    if all(s == "VOID" for s, _ in states):
        return "VOID", stake
    product = Decimal(stake)
    for s, o in states:
        if s == "WON":
            product *= o
    return "WON", int(product.to_integral_value(rounding=ROUND_FLOOR))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bet=accumulators)
async def test_sql_settlement_matches_the_model(
    container: Container, db: asyncpg.Connection, bet: tuple[int, list]
) -> None:
    stake, legs = bet
    starts = datetime.now(UTC) - timedelta(hours=1)  # results count once a match started
    match_ids = []
    for _ in legs:
        match_ids.append(
            await db.fetchval(
                """INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
                   VALUES ($1, 'A', 'B', $2, $3::jsonb, now()) RETURNING id""",
                f"prop-{uuid.uuid4()}",
                starts,
                orjson.dumps(ODDS).decode(),
            )
        )
    # legs as placement writes it: settlement settles a single-leg bet by its one leg.
    bet_id = await db.fetchval(
        """INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout,
                                    created_at, legs)
           VALUES (0, 0, 'EUR', $1, 0, now(), $2) RETURNING id""",
        stake,
        len(legs),
    )
    for match_id, ((market, pick), odds, _) in zip(match_ids, legs, strict=True):
        await db.execute(
            "INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)"
            " VALUES ($1, $2, $3, $4, $5)",
            bet_id,
            match_id,
            market,
            pick,
            odds,
        )
    settlement = container.module(Betting).settlement
    for match_id, (_, _, result) in zip(match_ids, legs, strict=True):
        if result is None:
            continue
        ext = await db.fetchval("SELECT external_id FROM betting_match WHERE id = $1", match_id)
        payload = {
            "matchExternalId": ext,
            "status": "CANCELLED" if result == "CANCELLED" else "FINISHED",
            "homeScore": None if result == "CANCELLED" else result[0],
            "awayScore": None if result == "CANCELLED" else result[1],
            "providerEventId": f"prop-{uuid.uuid4()}",
        }
        async with container.db.transaction() as conn:
            assert await settlement.accept_in_tx(conn, payload) == match_id
        await settlement.settle(match_id)
    row = await db.fetchrow("SELECT status, payout FROM betting_bet WHERE id = $1", bet_id)
    assert (row["status"], row["payout"]) == model(stake, legs)
