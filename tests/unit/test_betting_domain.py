"""The pure betting rules against a plain model, and the bet checks."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reservo.betting import domain

statuses = st.sampled_from(["PENDING", "WON", "LOST", "VOID"])
odds = st.decimals(min_value=Decimal("1.01"), max_value=Decimal("50"), places=2)


@given(st.integers(1, 10**9), st.lists(st.tuples(statuses, odds), min_size=1, max_size=20))
def test_settle_matches_the_plain_rules(stake: int, legs: list[tuple[str, Decimal]]) -> None:
    s = [x for x, _ in legs]
    if "LOST" in s:
        expected: tuple[str, int | None] = ("LOST", 0)
    elif "PENDING" in s:
        expected = ("PENDING", None)
    elif set(s) == {"VOID"}:
        expected = ("VOID", stake)
    else:
        p = Decimal(stake)
        for x, o in legs:
            p *= o if x == "WON" else Decimal(1)
        expected = ("WON", int(p.to_integral_value(rounding=ROUND_FLOOR)))
    assert domain.settle(stake, legs) == expected


@given(st.integers(0, 9), st.integers(0, 9))
def test_grading_markets(home: int, away: int) -> None:
    w = domain.winning_picks(home, away)
    assert (w["1X2"] == "DRAW") == (home == away)
    assert (w["TOTALS_2_5"] == "OVER") == (home + away > 2.5)
    assert (w["BTTS"] == "YES") == (home > 0 and away > 0)
    assert domain.grade("BTTS", "YES", "CANCELLED", home, away) == "VOID"


def test_check_bet_refuses_started_matches_and_changed_odds() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    odds_table = {"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}
    future = domain.MatchState(1, now + timedelta(minutes=1), odds_table, False)
    started = domain.MatchState(2, now, odds_table, False)
    leg = domain.Leg(1, "1X2", "HOME", Decimal("1.8"))
    domain.check_bet([leg], {1: future}, now)  # "1.8" equals "1.80"
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(2, "1X2", "HOME", Decimal("1.80"))], {2: started}, now)
    assert exc.value.code == "match_closed"
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(1, "1X2", "HOME", Decimal("1.81"))], {1: future}, now)
    assert exc.value.code == "odds_changed"
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(1, "BTTS", "YES", Decimal("1.70"))], {1: future}, now)
    assert exc.value.code == "odds_changed"


def test_check_bet_refuses_suspended_matches_after_closed_before_odds() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    odds_table = {"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}
    open_ = domain.MatchState(1, now + timedelta(minutes=1), odds_table, False)
    held = domain.MatchState(2, now + timedelta(minutes=1), odds_table, False, suspended=True)
    held_started = domain.MatchState(3, now, odds_table, False, suspended=True)
    matches = {1: open_, 2: held, 3: held_started}
    leg = domain.Leg(2, "1X2", "HOME", Decimal("1.80"))
    domain.check_bet([domain.Leg(1, "1X2", "HOME", Decimal("1.80"))], matches, now)
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(1, "1X2", "HOME", Decimal("1.80")), leg], matches, now)
    assert exc.value.code == "market_suspended"
    # Suspended is said even at stale odds: reopening is what the bettor waits for.
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(2, "1X2", "HOME", Decimal("9.99"))], matches, now)
    assert exc.value.code == "market_suspended"
    with pytest.raises(domain.BetRefused) as exc:
        domain.check_bet([domain.Leg(3, "1X2", "HOME", Decimal("1.80"))], matches, now)
    assert exc.value.code == "match_closed"


any_odds = st.decimals(min_value=Decimal("1.01"), max_value=Decimal("1000"), places=2)


@given(st.integers(1, 10**12), st.lists(any_odds, min_size=1, max_size=20), st.integers(1, 10**12))
def test_payout_cap_is_exact_and_names_the_largest_stake(
    stake: int, legs: list[Decimal], cap: int
) -> None:
    product = Fraction(1)
    for o in legs:
        product *= Fraction(o)
    exact = math.floor(stake * product)
    if exact <= cap:
        assert domain.check_payout(stake, legs, cap) == exact
        return
    with pytest.raises(domain.BetRefused) as refused:
        domain.check_payout(stake, legs, cap)
    assert refused.value.code == "validation_error"
    largest = int(refused.value.detail.rsplit(" ", 1)[1])
    assert math.floor(largest * product) <= cap < math.floor((largest + 1) * product)


def test_no_final_result_before_kick_off() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(domain.BetRefused) as refused:
        domain.check_result("FINISHED", now + timedelta(seconds=1), now)
    assert refused.value.code == "match_not_started"
    domain.check_result("FINISHED", now, now)
    domain.check_result("CANCELLED", now + timedelta(days=1), now)


def test_a_second_report_is_the_same_result_only_when_it_grades_the_same() -> None:
    assert domain.same_result(("FINISHED", 2, 1), ("FINISHED", 2, 1))
    assert not domain.same_result(("FINISHED", 2, 1), ("FINISHED", 1, 2))
    assert not domain.same_result(("FINISHED", 0, 0), ("CANCELLED", 0, 0))
    assert not domain.same_result(("CANCELLED", None, None), ("FINISHED", 0, 0))
    # A cancelled match has no score: whatever scores come with it grade nothing.
    assert domain.same_result(("CANCELLED", None, None), ("CANCELLED", 0, 0))
