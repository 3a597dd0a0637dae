"""Pure rental rules: the refund policy at its boundaries, deposits, stored periods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reservo.rentals import domain

PICKUP = datetime(2026, 1, 25, 1, 0, tzinfo=UTC)
deposits = st.integers(min_value=0, max_value=10**12)
# Offsets around both boundaries, down to the microsecond.
near = st.sampled_from([72, 24]).flatmap(
    lambda h: st.integers(-5_000_000, 5_000_000).map(
        lambda us: timedelta(hours=h) + timedelta(microseconds=us)
    )
)


@given(deposits, near)
def test_customer_refund_steps_exactly_at_72h_and_24h(deposit: int, before: timedelta) -> None:
    got = domain.refund_amount(deposit, PICKUP, PICKUP - before, "customer")
    if before >= timedelta(hours=72):
        assert got == deposit
    elif before >= timedelta(hours=24):
        assert got == deposit // 2
    else:
        assert got == 0


@given(deposits, st.integers(-(10**7), 10**7))
def test_host_and_admin_always_refund_everything(deposit: int, seconds: int) -> None:
    at = PICKUP - timedelta(seconds=seconds)
    assert domain.refund_amount(deposit, PICKUP, at, "host") == deposit
    assert domain.refund_amount(deposit, PICKUP, at, "admin") == deposit


@given(deposits, st.integers(-(10**7), 10**7), st.integers(0, 10**6))
def test_refund_never_grows_as_pickup_approaches(deposit: int, seconds: int, later: int) -> None:
    earlier_at = PICKUP - timedelta(seconds=seconds)
    later_at = earlier_at + timedelta(seconds=later)
    a = domain.refund_amount(deposit, PICKUP, earlier_at, "customer")
    b = domain.refund_amount(deposit, PICKUP, later_at, "customer")
    assert 0 <= b <= a <= deposit


def test_exact_boundaries() -> None:
    assert domain.refund_amount(2_000_000, PICKUP, PICKUP - timedelta(hours=72), "customer") == (
        2_000_000
    )
    almost = timedelta(hours=72) - timedelta(microseconds=1)
    assert domain.refund_amount(2_000_000, PICKUP, PICKUP - almost, "customer") == 1_000_000
    assert domain.refund_amount(2_000_001, PICKUP, PICKUP - timedelta(hours=24), "customer") == (
        1_000_000
    )
    almost = timedelta(hours=24) - timedelta(microseconds=1)
    assert domain.refund_amount(2_000_000, PICKUP, PICKUP - almost, "customer") == 0
    assert domain.refund_amount(2_000_000, PICKUP, PICKUP + timedelta(hours=1), "customer") == 0


@given(
    st.integers(1, 90 * 24 * 60),
    st.integers(1, 10**9),
    st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
)
def test_deposit_is_ceil_days_times_price_times_rate(minutes: int, price: int, rate: float) -> None:
    start = PICKUP
    end = start + timedelta(minutes=minutes)
    days = -(-minutes // (24 * 60))
    # Exact rational arithmetic: rate tenths, rounded half up.
    tenths = round(rate * 10)
    expected = (days * price * tenths * 2 + 10) // 20
    # At least 1 minor unit: no hold owes nothing (a zero payment never confirms).
    assert domain.deposit(start, end, price, rate) == max(1, expected)


def test_deposit_examples() -> None:
    day = timedelta(days=1)
    assert domain.deposit(PICKUP, PICKUP + day, 100_00, 0.3) == 30_00
    assert domain.deposit(PICKUP, PICKUP + day + timedelta(minutes=1), 100_00, 0.3) == 60_00
    assert domain.deposit(PICKUP, PICKUP + timedelta(hours=2), 5, 0.3) == 2  # 1.5 -> 2


def test_buffer_lives_in_the_stored_period() -> None:
    end = PICKUP + timedelta(days=2)
    p = domain.stored_period(PICKUP, end, timedelta(minutes=120))
    assert (p.lower, p.upper) == (PICKUP, end + timedelta(hours=2))


def test_period_checks() -> None:
    now = PICKUP - timedelta(days=1)
    domain.check_period(PICKUP, PICKUP + timedelta(days=1), now)
    for start, end in [
        (PICKUP, PICKUP),
        (PICKUP, PICKUP - timedelta(hours=1)),
        (PICKUP, PICKUP + timedelta(days=91)),
        (now - timedelta(hours=1), PICKUP),
        (now + timedelta(days=800), now + timedelta(days=801)),
    ]:
        with pytest.raises(domain.InvalidPeriod):
            domain.check_period(start, end, now)


def test_expired_hold_reads_as_expired() -> None:
    assert domain.effective_status("HOLD", PICKUP, PICKUP) == "EXPIRED"
    assert domain.effective_status("HOLD", PICKUP, PICKUP - timedelta(seconds=1)) == "HOLD"
    assert domain.effective_status("CONFIRMED", None, PICKUP) == "CONFIRMED"


@given(st.integers(0, 10**15), st.integers(1, 10**12), st.booleans(), st.booleans())
def test_a_payment_keeps_at_most_the_deposit_and_returns_the_rest(
    amount: int, due: int, confirmed: bool, live_hold: bool
) -> None:
    if confirmed and amount < due:
        return  # the confirm statement never confirms a payment below the deposit
    s = domain.settle(amount, due, confirmed=confirmed, live_hold=live_hold)
    kept = amount - s.refund
    assert 0 <= s.refund <= amount
    assert kept == (due if confirmed else 0)
    if confirmed:
        assert s.outcome == ("overpaid" if amount > due else "confirmed")
    else:
        assert s.outcome == ("underpaid" if live_hold else "not_payable")
    assert s.confirmed == confirmed
