"""Pure rules of the rentals second release: quote, calendar window, hold rate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reservo.rentals import domain

T0 = datetime(2030, 1, 1, 8, tzinfo=UTC)
WINDOW = timedelta(minutes=15)


def test_quote_counts_started_days_and_reuses_the_deposit_rule() -> None:
    q = domain.quote(T0, T0 + timedelta(days=2, minutes=1), 10_000, 0.3)
    assert (q.days, q.price, q.deposit) == (3, 30_000, 9_000)
    q = domain.quote(T0, T0 + timedelta(hours=1), 333, 0.3)
    assert (q.days, q.price) == (1, 333)
    assert q.deposit == domain.deposit(T0, T0 + timedelta(hours=1), 333, 0.3) == 100


def test_calendar_window() -> None:
    domain.check_window(T0, T0 + timedelta(days=366))
    for end in (T0, T0 - timedelta(seconds=1), T0 + timedelta(days=366, microseconds=1)):
        with pytest.raises(domain.InvalidPeriod):
            domain.check_window(T0, end)


def test_hold_retry_after_is_when_the_limit_th_newest_leaves_the_window() -> None:
    now = T0 + timedelta(minutes=10)
    recent = [T0 + timedelta(minutes=9), T0 + timedelta(minutes=5), T0]  # newest first
    assert domain.hold_retry_after(recent[:2], 3, WINDOW, now) is None
    assert domain.hold_retry_after(recent, 3, WINDOW, now) == 5 * 60
    assert domain.hold_retry_after(recent[:2], 2, WINDOW, now) == 10 * 60
    assert domain.hold_retry_after([], 0, WINDOW, now) == 15 * 60
    # Never 0: a hold leaving the window right now still answers "retry in 1 s".
    assert domain.hold_retry_after([now - WINDOW + timedelta(milliseconds=1)], 1, WINDOW, now) == 1
