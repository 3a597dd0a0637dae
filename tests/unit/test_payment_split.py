"""The rule every payment against an amount due follows (core.kernel.payments):
nothing that differs from what is due is kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reservo.core.kernel.payments import PaymentSplit, split_payment

MONEY = st.integers(0, 10**15)


@given(MONEY, MONEY)
def test_the_service_keeps_what_is_due_or_nothing_and_returns_the_rest(
    amount: int, due: int
) -> None:
    s = split_payment(amount, due)
    assert s.kept + s.refund == amount
    assert s.kept == (due if amount >= due else 0)
    assert s.match == ("exact" if amount == due else "overpaid" if amount > due else "underpaid")


def test_the_three_cases_of_a_3000_deposit() -> None:
    assert split_payment(503_000, 3_000) == PaymentSplit("overpaid", 3_000, 500_000)
    assert split_payment(3_000, 3_000) == PaymentSplit("exact", 3_000, 0)
    assert split_payment(2_999, 3_000) == PaymentSplit("underpaid", 0, 2_999)
    assert split_payment(0, 3_000) == PaymentSplit("underpaid", 0, 0)


@pytest.mark.parametrize(("amount", "due"), [(-1, 3_000), (3_000, -1)])
def test_a_negative_amount_is_a_bug_not_a_payment(amount: int, due: int) -> None:
    with pytest.raises(ValueError, match="never negative"):
        split_payment(amount, due)
