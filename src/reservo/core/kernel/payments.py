"""The one rule for a payment against the amount due, whatever is being paid
(a rental's deposit today, a prepaid appointment's price later): no payment that
differs from what is due is ever kept silently.

Pure: the caller's database decides whether the payment may settle anything at
all (a HOLD still live, say); this only splits the amount received."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Match = Literal["exact", "underpaid", "overpaid"]


@dataclass(frozen=True, slots=True)
class PaymentSplit:
    """How a payment of ``amount`` for ``due`` splits: what the service keeps and
    what goes back to the payer (kept + refund == amount)."""

    match: Match
    kept: int
    refund: int


def split_payment(amount: int, due: int) -> PaymentSplit:
    """Less than due keeps nothing and returns it all (nothing is confirmed on
    part of the money); more keeps exactly ``due`` and returns the excess; the
    exact amount keeps it all."""
    if amount < 0 or due < 0:
        raise ValueError(f"a payment of {amount} for {due}: amounts are never negative")
    if amount < due:
        return PaymentSplit("underpaid", 0, amount)
    if amount > due:
        return PaymentSplit("overpaid", due, amount - due)
    return PaymentSplit("exact", due, 0)


# The name under which a module that takes payments for appointments offers its
# handler (``Module.state``) to the payments webhook, which rentals serves: the
# webhook dispatches a body's ``appointmentId`` there without importing it.
APPOINTMENT_PAYMENTS = "appointment_payments"


class PaymentHandler(Protocol):
    async def on_payment(self, target_id: int, txn_id: str, amount: int, status: str, /) -> str:
        """Settle one signed SUCCEEDED (or FAILED) payment of ``amount`` for
        ``target_id``; returns the webhook's ``result``."""
        ...

    async def payment_due(self, target_id: int, /) -> int | None:
        """What ``target_id`` waits to be paid now (None: nothing, or no such
        thing): the sandbox gateway's page asks before it pays."""
        ...
