"""Prepaid appointments: the payment that turns a HELD seat BOOKED, the end of
an unpaid hold (its job and the sweeper), and the refunds, executed once per
event by the refund consumer through the payment gateway rentals uses.

The database decides every race: the payment, the expiry and a cancel are each
a conditional UPDATE on status = 'HELD' that releases (or keeps) the seat in
the same statement, so one of them wins and the seat is freed at most once;
uq_appointment_payment_txn makes a redelivered webhook a duplicate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

import asyncpg
import structlog

from reservo.appointments import domain, events, repo
from reservo.appointments.domain import Appointment
from reservo.appointments.gate import Gate
from reservo.appointments.holds import ExpireHoldJob, Holds
from reservo.appointments.reminders import Reminders
from reservo.appointments.slots import SlotLists
from reservo.core.db.database import Database
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging import refunds
from reservo.core.messaging.outbox import emit

log = structlog.get_logger(__name__)

# How the gateway names what a refund or a payment page is for.
SUBJECT = "appointmentId"
NO_GATEWAY = "no payment gateway configured: set RESERVO_RENTALS_PAYMENT_GATEWAY"


class PaymentGateway(Protocol):
    """The payment gateway rentals is configured with (its setup builds it):
    the same provider or sandbox takes an appointment's payment and refunds."""

    async def refund(
        self, booking_id: int, amount: int, reference: str, subject: str = ...
    ) -> str: ...

    def payment_url(self, booking_id: int, subject: str = ...) -> str | None: ...


# Why (part of) a payment goes back, as the refund's notification says it.
_REFUND_REASONS: dict[domain.PaymentOutcome, str] = {
    "overpaid": "payment above the price: the excess is returned",
    "underpaid": "payment below the price: the appointment is not confirmed",
    "not_payable": "payment received for a {status} appointment",
}
_CONFLICT_OF: dict[domain.PaymentOutcome, str] = {
    "underpaid": "underpaid_payment",
    "not_payable": "late_payment",
}


class Payments(Holds, Reminders, SlotLists, Gate):
    db: Database
    clock: Clock
    gateway: PaymentGateway | None

    def payment_url(self, appt: Appointment) -> str | None:
        """Where the patient pays a HELD appointment (None: no gateway page, or
        nothing to pay). Only shown to the appointment's patient or an admin."""
        if self.gateway is None or appt.status != "HELD":
            return None
        return self.gateway.payment_url(appt.id, SUBJECT)

    async def payment_due(self, appointment_id: int) -> int | None:
        """The price of a live hold (None: nothing to pay, or no such appointment)."""
        async with self.db.connection() as conn:
            row = await repo.get_appointment(conn, appointment_id)
        if row is None:
            return None
        appt = Appointment.from_row(row)
        return appt.price_amount if appt.effective_status(self.clock.now()) == "HELD" else None

    async def _dispatch(self, jobs: Sequence[Any]) -> None:
        """After commit: push the expiry jobs due soon into Redis now."""
        if jobs and self.scheduler is not None:
            try:
                await self.scheduler.dispatch(jobs)
            except Exception as exc:  # the job is durable; the sweeper is the safety net
                log.warning("appointments_expiry_dispatch_failed", error=repr(exc))

    async def _seats_freed(self, appts: Sequence[Appointment]) -> None:
        """After the commit that freed these seats: the slots are bookable again
        (their full marks cleared) and their lists and feeds changed."""
        for slot_id in {a.slot_id for a in appts}:
            await self._clear_full(slot_id)
        for appt in appts:
            await self._invalidate(appt)

    # -- the payment webhook -------------------------------------------------------

    async def on_payment(self, appointment_id: int, txn_id: str, amount: int, status: str) -> str:
        """The gateway's webhook for ``appointmentId``, its signature verified.
        Every SUCCEEDED payment is recorded with what it settled; the row, the
        status flip, the events and any refund commit together, and a redelivery
        of the same providerTxnId inserts nothing and changes nothing. Results:
        ``confirmed`` (HELD -> BOOKED, exactly the price), ``overpaid`` (confirmed,
        the excess refunded), ``refund_requested`` (below the price, or the
        appointment no longer a live hold: all of it back), ``duplicate``,
        ``ignored`` (FAILED, or 0 and nothing to confirm). 404 for no such
        appointment; 409 not_held for one never held (no price: nothing was due)."""
        if status != "SUCCEEDED":
            return "ignored"  # the hold simply runs out
        now = self.clock.now()
        async with self.db.transaction() as conn:
            payment_id = await repo.insert_payment(conn, appointment_id, txn_id, amount, now)
            if payment_id is None:
                current = await repo.get_appointment(conn, appointment_id)
                if current is None:
                    raise DomainError("appointment_not_found", f"no appointment {appointment_id}")
                return "duplicate"
            appt, settled, freed = await self._apply_payment(conn, appointment_id, amount, now)
            assert appt.price_amount is not None  # _apply_payment refuses an unpriced one
            await repo.settle_payment(
                conn, payment_id, appt.price_amount, settled.refund, settled.outcome
            )
            if settled.refund > 0:
                reason = _REFUND_REASONS[settled.outcome].format(status=appt.status)
                await emit(
                    conn,
                    events.REFUND_REQUESTED,
                    events.key(appt),
                    events.refund_payload(appt, settled.refund, reason),
                    now,
                )
        await self._seats_freed(freed)
        if not settled.confirmed:
            metrics.CONFLICTS.labels(
                "appointments", _CONFLICT_OF[settled.outcome], "database"
            ).inc()
            return "refund_requested" if settled.refund > 0 else "ignored"
        await self._invalidate(appt)  # the patient's calendar feed: no longer tentative
        if settled.outcome == "overpaid":
            log.info(
                "appointments_payment_overpaid",
                appointment_id=appointment_id,
                amount=amount,
                due=appt.price_amount,
                excess=settled.refund,
            )
        return settled.outcome

    async def _apply_payment(
        self, conn: asyncpg.Connection, appointment_id: int, amount: int, now: datetime
    ) -> tuple[Appointment, domain.Settlement, list[Appointment]]:
        """Confirm the hold if ``amount`` covers its price while it is live; else
        expire it if its time has passed (its seat may be someone else's by now).
        Returns the appointment as it stands, what the payment settled and the
        appointment whose seat this freed (if it expired here)."""
        row = await repo.confirm_hold(conn, appointment_id, amount, now)
        if row is not None:
            confirmed = Appointment.from_row(row)
            assert confirmed.price_amount is not None  # only a priced row is ever HELD
            settled = domain.settle(amount, confirmed.price_amount, confirmed=True, live_hold=True)
            await repo.set_overpaid_refund(conn, appointment_id, settled.refund)
            appt = replace(confirmed, overpaid_refund=settled.refund)
            await emit(conn, events.CONFIRMED, events.key(appt), events.held_payload(appt), now)
            await self._drop_expiry(conn, appointment_id)
            await self._remind_later(conn, appt, now)
            return appt, settled, []
        freed: list[Appointment] = []
        expired = await repo.expire_hold(conn, appointment_id, now)
        if expired is not None:
            freed.append(Appointment.from_row(expired))
            await emit(
                conn, events.EXPIRED, events.key(freed[0]), events.held_payload(freed[0]), now
            )
            await self._drop_expiry(conn, appointment_id)
        current = await repo.get_appointment(conn, appointment_id)
        assert current is not None  # the payment row's insert just saw it
        appt = Appointment.from_row(current)
        if appt.price_amount is None:
            raise DomainError("not_held", "this appointment was never held for a payment")
        live = appt.effective_status(now) == "HELD"
        return (
            appt,
            domain.settle(amount, appt.price_amount, confirmed=False, live_hold=live),
            freed,
        )

    # -- the end of unpaid holds ------------------------------------------------------

    async def expire_job(self, job: Any) -> None:
        """Handler of the per-hold expiry job (a reservo.scheduler.Job)."""
        await self.expire_hold(ExpireHoldJob.model_validate(job.payload).appointment_id)

    async def expire_hold(self, appointment_id: int) -> bool:
        """HELD -> EXPIRED at its end, its seat freed; a no-op once paid,
        cancelled or expired (True: this call expired it)."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.expire_hold(conn, appointment_id, now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(conn, events.EXPIRED, events.key(appt), events.held_payload(appt), now)
        if row is None:
            return False
        await self._seats_freed([appt])
        return True

    async def sweep_holds(self, batch: int = 500) -> int:
        """The safety net behind the jobs (a scheduler down, a job lost with its
        Redis): every hold past its end, a batch per transaction."""
        total = 0
        while True:
            now = self.clock.now()
            async with self.db.transaction() as conn:
                expired = [
                    Appointment.from_row(r) for r in await repo.sweep_holds(conn, now, batch)
                ]
                for appt in expired:
                    await emit(
                        conn, events.EXPIRED, events.key(appt), events.held_payload(appt), now
                    )
            await self._seats_freed(expired)
            total += len(expired)
            if len(expired) < batch:
                if total:
                    log.info("appointments_holds_expired", count=total)
                return total


class RefundConsumer(refunds.RefundConsumer):
    """Executes the refunds of appointments' outbox once per event, as rentals'
    does (the shared consumer in core/messaging/refunds.py), into appointments'
    REFUND rows."""

    def __init__(self, db: Database, gateway: PaymentGateway | None, clock: Clock) -> None:
        super().__init__(db, gateway, clock, _REFUNDS, log)


_REFUNDS = refunds.RefundLedger(
    topic=events.REFUND_REQUESTED,
    subject=SUBJECT,
    log_prefix="appointments",
    log_field="appointment_id",
    no_gateway=NO_GATEWAY,
    recorded=repo.refund_recorded,
    record=repo.insert_refund,
)
