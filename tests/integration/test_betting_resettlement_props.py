"""Corrections and voids, at random and racing: whatever results, corrections
and voids a match went through, every account holds the payouts of the last
result alone, each bet paid once in its generation, the ledger balanced."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reservo.betting import domain, results
from reservo.betting.schemas import ResultIn
from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.auth import ADMIN
from tests.helpers.betting import (
    ODDS,
    balance,
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.integration.test_betting_resettlement import (
    correction,
    ledger_balanced,
    resettle,
    settle_posted,
)

SOON = timedelta(minutes=1)
DEPOSIT = 1_000
PICKS = [(k, p) for k, picks in ODDS.items() for p in picks]
Reported = tuple[str, int | None, int | None]


def expected_payout(
    stake: int, legs: list[tuple[int, str, str]], final: dict[int, Reported]
) -> int:
    """What the bet pays under each match's last result (domain.settle)."""
    graded = []
    for m, market, pick in legs:
        status, home, away = final[m]
        graded.append((domain.grade(market, pick, status, home, away), Decimal(ODDS[market][pick])))
    _, payout = domain.settle(stake, graded)
    return payout or 0


async def paid_once_per_generation(db: asyncpg.Connection, bet_ids: list[int]) -> None:
    """Each bet's payouts: one per generation at most, every one but the current
    generation's reversed."""
    for bet_id in bet_ids:
        gen = await db.fetchval("SELECT generation FROM betting_bet WHERE id = $1", bet_id)
        refs = [f"bet:{bet_id}"] + [f"bet:{bet_id}:g{g}" for g in range(2, gen + 1)]
        rows = await db.fetch(
            "SELECT kind, reference, count(*) AS n FROM wallet_transfer"
            " WHERE reference = ANY($1) AND kind <> 'STAKE' GROUP BY kind, reference",
            refs,
        )
        counts = {(r["kind"], r["reference"]): r["n"] for r in rows}
        assert all(n == 1 for n in counts.values()), counts
        for g, ref in enumerate(refs, start=1):
            paid = counts.get(("PAYOUT", ref), 0) + counts.get(("REFUND", ref), 0)
            if g < gen:
                assert counts.get(("REVERSAL", ref), 0) == paid, (bet_id, ref, counts)
            else:
                assert counts.get(("REVERSAL", ref), 0) == 0, (bet_id, ref, counts)


_score = st.tuples(st.integers(0, 3), st.integers(0, 3))
# After each match's first result: a correction by an admin or by the provider
# (webhook, next sequence), or a void.
_step = st.one_of(
    st.tuples(st.just("admin"), st.integers(0, 2), _score),
    st.tuples(st.just("webhook"), st.integers(0, 2), _score),
    st.tuples(st.just("void"), st.integers(0, 2), st.just((0, 0))),
)
_bet = st.tuples(
    st.integers(0, 2),  # account
    st.integers(1, 60),  # stake
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(PICKS)),
        min_size=1,
        max_size=3,
        unique_by=lambda leg: leg[0],
    ),
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    bets=st.lists(_bet, min_size=1, max_size=8),
    firsts=st.lists(_score, min_size=3, max_size=3),
    steps=st.lists(_step, min_size=1, max_size=8),
)
async def test_any_corrections_leave_the_payouts_of_the_last_result(
    client: httpx.AsyncClient,
    container: Container,
    db: asyncpg.Connection,
    clock: OffsetClock,
    bets: list[tuple[int, int, list[tuple[int, tuple[str, str]]]]],
    firsts: list[tuple[int, int]],
    steps: list[tuple[str, int, tuple[int, int]]],
) -> None:
    # Soon by the server's clock, which earlier examples moved past their kick-offs.
    ahead = clock.now() - datetime.now(UTC) + SOON
    matches = [await make_match(client, ahead) for _ in range(3)]
    accounts = [await make_account(client, DEPOSIT) for _ in range(3)]
    placed: list[tuple[int, int, int, list[tuple[int, str, str]]]] = []
    for who, stake, legs in bets:
        account, owner = accounts[who]
        sel = [(matches[m]["id"], k, p) for m, (k, p) in legs]
        r = await place(client, account, owner, stake, sel)
        if r.status_code == 201:
            placed.append((r.json()["id"], who, stake, [(m, k, p) for m, (k, p) in legs]))
        else:
            assert (r.status_code, r.json()["code"]) == (409, "insufficient_funds"), r.text
    kick_off(clock, *matches)
    final: dict[int, Reported] = {}
    for i, (home, away) in enumerate(firsts):
        r = await post_result(client, result_body(matches[i]["externalId"], home, away), clock)
        assert r.status_code == 202
        final[i] = ("FINISHED", home, away)
    await settle_posted(container)
    sequence = 0
    for kind, i, (home, away) in steps:
        m = matches[i]
        if kind == "void":
            r = await client.post(
                f"/api/matches/{m['id']}/void", json={"reason": "t"}, headers=ADMIN
            )
            if final[i][0] == "CANCELLED":
                assert (r.status_code, r.json()["code"]) == (409, "already_void")
            else:
                assert r.status_code == 202, r.text
                final[i] = ("CANCELLED", None, None)
        elif kind == "admin":
            r = await resettle(client, m["id"], home, away)
            if domain.same_result(final[i], ("FINISHED", home, away)):
                assert (r.status_code, r.json()["code"]) == (409, "same_result")
            else:
                assert r.status_code == 202, r.text
                final[i] = ("FINISHED", home, away)
        else:
            sequence += 1
            body = correction(m["externalId"], home, away, sequence)
            assert (await post_result(client, body, clock)).status_code == 202
            final[i] = ("FINISHED", home, away)
        await settle_posted(container)

    for who, (account, _) in enumerate(accounts):
        want = DEPOSIT + sum(
            expected_payout(stake, legs, final) - stake for _, w, stake, legs in placed if w == who
        )
        assert await balance(client, account) == want, (who, final, placed)
    await paid_once_per_generation(db, [b[0] for b in placed])
    await ledger_balanced(db)


async def test_racing_webhook_corrections_settle_in_the_providers_order(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """Corrections of one match taken by many consumers at once (released
    together): whatever order they commit in, the one the provider sent last
    (highest sequence) is the match's result, and the payouts are its alone."""
    m = await make_match(client, SOON)
    home, h_owner = await make_account(client, 100)
    draw, d_owner = await make_account(client, 100)
    away, a_owner = await make_account(client, 100)
    ids = []
    for account, owner, pick in (
        (home, h_owner, "HOME"),
        (draw, d_owner, "DRAW"),
        (away, a_owner, "AWAY"),
    ):
        r = await place(client, account, owner, 100, [(m["id"], "1X2", pick)])
        ids.append(r.json()["id"])
    kick_off(clock, m)
    await post_result(client, result_body(m["externalId"], 1, 0), clock)
    await settle_posted(container)
    settlement = container.module(Betting).settlement
    scores = [(0, 1), (2, 2), (3, 0), (0, 2), (1, 1), (2, 0), (0, 3), (4, 1)]
    racers = len(scores)
    barrier = asyncio.Barrier(racers)
    order = list(range(racers))
    random.Random(7).shuffle(order)

    async def send(seq: int) -> None:
        h, a = scores[seq]
        body = ResultIn.model_validate_json(correction(m["externalId"], h, a, seq + 1))
        event = results.result_event(body, clock.now())
        await barrier.wait()
        await settlement.handle(event)

    await asyncio.gather(*(send(s) for s in order))
    await settle_posted(container)
    last = scores[-1]  # 4-1: HOME
    row = await db.fetchrow(
        "SELECT home_score, away_score, result_sequence, settlement_status FROM betting_match"
        " WHERE id = $1",
        m["id"],
    )
    assert tuple(row) == (*last, racers, "SETTLED")
    assert [await balance(client, a) for a in (home, draw, away)] == [180, 0, 0]
    parked = await db.fetchval(
        "SELECT count(*) FROM dead_letter WHERE consumer = 'betting.settlement' AND key = $1",
        f"match:{m['externalId']}",
    )
    applied = await db.fetchval(
        "SELECT settlement_generation FROM betting_match WHERE id = $1", m["id"]
    )
    # Each correction either applied (a generation) or was stale (parked).
    assert (applied - 1) + parked == racers
    await paid_once_per_generation(db, ids)
    await ledger_balanced(db)
