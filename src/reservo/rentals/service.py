"""Rental use cases. Each owns its transaction: claim, check, write, emit.

The database decides every conflict (ex_car_period, uq_payment_provider_txn,
conditional status flips, the hold rate limit); Redis only caches searches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog

from reservo.core.db.database import Database
from reservo.core.db.reads import read_one
from reservo.core.db.replicas import StaleReads
from reservo.core.http.idempotency import Within
from reservo.core.http.schemas import MAX_ID, ApiModel, Id
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError, validation_error
from reservo.core.messaging import refunds
from reservo.core.messaging.outbox import emit
from reservo.core.redis.cache import Cache
from reservo.rentals import domain, events, repo
from reservo.rentals.config import RentalsSettings
from reservo.rentals.domain import BlockedPeriod, Booking, Car
from reservo.rentals.gateway import PaymentGateway

log = structlog.get_logger(__name__)

EXPIRE_HOLD = "rentals.expire-hold"


class ExpireHoldJob(ApiModel):
    """Payload of an EXPIRE_HOLD job: the hold to expire. Written, checked at
    the jobs API and read by the handler with this one model."""

    booking_id: Id


NO_GATEWAY = "no payment gateway configured: set RESERVO_RENTALS_PAYMENT_GATEWAY"
# A customer's clock may lag ours a little: a period starting this long ago is accepted.
START_GRACE = timedelta(minutes=5)
# The keyset before every booking: a customer's list starts here.
FIRST_PAGE = (datetime(9999, 12, 31, tzinfo=UTC), MAX_ID)


class RentalService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        cache: Cache,
        config: RentalsSettings,
        scheduler: JobQueue | None = None,
        gateway: PaymentGateway | None = None,
        *,
        stale: StaleReads,
    ) -> None:
        self.db, self.clock, self.cache, self.stale = db, clock, cache, stale
        self.config, self.scheduler, self.gateway = config, scheduler, gateway
        self._searches = cache.local(config.search_local_ttl_s)
        # Per city, how many holds this process made: part of the key of its own
        # copy of a search page, so its next search after a hold is not served
        # the page from before it (other processes' copies live at most
        # search_local_ttl_s).
        self._held_here: dict[str, int] = {}

    async def expire_job(self, job: Any) -> None:
        """Handler of the per-hold expiry job (a reservo.scheduler.Job); without a
        scheduler the sweeper and in-transaction expiry still suffice."""
        await self.expire_hold(ExpireHoldJob.model_validate(job.payload).booking_id)

    def payment_url(self, booking_id: int) -> str | None:
        """Where the holder pays (None: no gateway offers a page). Only ever shown in
        responses about the booking, which only its customer, host or an admin see:
        the sandbox link's token is what lets its page act on this booking."""
        return None if self.gateway is None else self.gateway.payment_url(booking_id)

    def check_period(self, start: datetime, end: datetime, place: str = "query") -> None:
        """422 for a period a hold refuses; ``place``: where the request carries
        ``from`` and ``to`` (a hold's body, a search's query)."""
        try:
            domain.check_period(start, end, self.clock.now() - START_GRACE)
        except domain.InvalidPeriod as exc:
            raise validation_error(str(exc), at=(place, "from")) from None

    # -- cars ------------------------------------------------------------------

    async def create_car(
        self,
        plate: str,
        model: str,
        city: str,
        daily_price: int,
        host_id: int,
        within: Within[Car] | None = None,
    ) -> Car:
        async with self.db.transaction() as conn:
            car = Car.from_row(
                await repo.insert_car(
                    conn, plate, model, city, daily_price, host_id, self.clock.now()
                )
            )
            if within is not None:
                await within(conn, car)
        return car

    async def search(
        self,
        city: str,
        start: datetime,
        end: datetime,
        limit: int,
        after: tuple[int, int] | None,
        render: Callable[[list[Car], int], bytes],
    ) -> bytes:
        """One page of the cars of ``city`` free for [start, end) (plus the
        turnaround), cheapest first, after the (daily_price, id) ``after``: up to
        ``limit + 1`` cars (the extra one says another page exists) as ``render``
        writes them with ``limit`` (the API's JSON page), served from a
        short-lived cache of those bytes (Redis, and a copy per process that never
        outlives its Redis entry): a stale answer only costs a 409 later, the
        constraint decides. A hold drops every cached page of its city over the
        days it covers (``_drop_searches``)."""
        self.check_period(start, end)
        start, end = start.astimezone(UTC), end.astimezone(UTC)
        position = "" if after is None else f"{after[0]}.{after[1]}"
        key = (
            f"rentals:avail:{{city:{city}}}:{start.isoformat()}:{end.isoformat()}"
            f":{limit}:{position}"
        )
        period = domain.stored_period(start, end, self.config.turnaround)

        async def fill() -> tuple[bytes, float]:
            # The stored JSON is returned as is: no decode/encode on the hot path.
            days = [search_day_group(city, day) for day in domain.days_of(period)]
            cached, life_s, stamp = await self.cache.get_stamped(key, days)
            if cached is not None:
                return cached, life_s
            now = self.clock.now()
            # A replica may answer (seconds stale, like the cache): the hold decides.
            rows = await self.stale.read(
                lambda conn: repo.search_available(conn, city, period, now, limit + 1, after)
            )
            body = render([Car.from_row(r) for r in rows], limit)
            ttl = self.config.search_cache_ttl_s
            if stamp is not None:  # stamped before the read: a hold since makes it a miss
                await self.cache.set_stamped(key, body, ttl, stamp)
            return body, float(ttl)

        local_key = f"{key}:{self._held_here.get(city, 0)}"
        found: bytes | None = self._searches.peek(local_key)  # the hot path: no await
        if found is None:
            found = await self._searches.get(local_key, fill)
        return found

    async def _drop_searches(self, city: str, period: domain.StoredPeriod) -> None:
        """After a hold's commit: the cached search pages of its city over its
        days are misses from now on, here and in every process' next Redis read.
        Redis away: they stay until their TTL (a 409 on booking, as documented)."""
        self._held_here[city] = self._held_here.get(city, 0) + 1
        days = [search_day_group(city, day) for day in domain.days_of(period)]
        if not await self.cache.bump_groups(*days):
            log.warning("rentals_search_drop_failed", city=city)

    # -- holds -----------------------------------------------------------------

    async def _check_hold_rate(
        self, conn: asyncpg.Connection, customer_id: int, now: datetime
    ) -> None:
        """At most N holds *created* per customer per sliding window: counted from
        the booking rows, inside the hold's transaction, under a per-customer
        advisory lock (held to commit), so a refused attempt (409, 404, 422, a
        rollback) costs nothing and concurrent holds of one customer cannot all see
        the same count. See docs/DESIGN.md, "The hold rate limit"."""
        c = self.config
        window = timedelta(seconds=c.hold_rate_window_s)
        await repo.lock_customer_holds(conn, customer_id)
        recent = await repo.recent_holds(conn, customer_id, now - window, c.hold_rate_limit)
        retry_after = domain.hold_retry_after(recent, c.hold_rate_limit, window, now)
        if retry_after is not None:
            metrics.CONFLICTS.labels("rentals", "rate_limited", "database").inc()
            raise DomainError(
                "rate_limited",
                f"at most {c.hold_rate_limit} holds per {c.hold_rate_window_s} s",
                headers={"Retry-After": str(retry_after)},
            )

    async def hold(
        self,
        car_id: int,
        customer_id: int,
        start: datetime,
        end: datetime,
        within: Within[Booking] | None = None,
    ) -> Booking:
        self.check_period(start, end, "body")
        now = self.clock.now()
        period = domain.stored_period(start, end, self.config.turnaround)
        expires = now + self.config.hold_ttl
        jobs: list[Any] = []
        async with self.db.transaction() as conn:
            car = await repo.get_car(conn, car_id)
            if car is None:
                raise DomainError("car_not_found", f"no car {car_id}")
            await self._check_hold_rate(conn, customer_id, now)
            amount = domain.deposit(start, end, car["daily_price"], self.config.deposit_rate)
            # Stale holds overlapping this period stop blocking before we insert.
            for row in await repo.expire_overlapping(conn, car_id, period, now):
                await self._emit(conn, Booking.from_row(row), now)
            try:
                row = await repo.insert_hold(
                    conn, car_id, customer_id, period, end, amount, expires, now
                )
            except asyncpg.ExclusionViolationError:
                metrics.CONFLICTS.labels("rentals", "car_unavailable", "database").inc()
                raise
            booking = replace(Booking.from_row(row), host_id=car["host_id"])
            if self.scheduler is not None:
                jobs.append(
                    await self.scheduler.enqueue(
                        EXPIRE_HOLD,
                        ExpireHoldJob(booking_id=booking.id).wire(),
                        run_at=expires,
                        idempotency_key=_expiry_key(booking.id),
                        conn=conn,
                    )
                )
            await self._emit(conn, booking, now)
            if within is not None:
                await within(conn, booking)
        metrics.BOOKINGS.labels("rentals").inc()
        await self._drop_searches(car["city"], period)
        await self._dispatch(jobs)
        return booking

    async def _dispatch(self, jobs: Sequence[Any]) -> None:
        """After commit: push the expiry jobs due soon into Redis now."""
        if jobs and self.scheduler is not None:
            try:
                await self.scheduler.dispatch(jobs)
            except Exception as exc:  # the job is durable; the sweeper is the safety net
                log.warning("rentals_expiry_dispatch_failed", error=repr(exc))

    async def _drop_expiry(self, conn: asyncpg.Connection, booking_id: int) -> None:
        """A paid or cancelled hold has nothing left to expire: its job (the
        first one, or the one its extension replaced it with) would only wake a
        worker to do nothing."""
        if self.scheduler is not None:
            for key in (_expiry_key(booking_id), _extended_expiry_key(booking_id)):
                await self.scheduler.cancel_by_key(EXPIRE_HOLD, key, conn=conn)

    async def extend_hold(self, booking_id: int) -> Booking:
        """The one extension of a live HOLD: its expiry moves ``hold_extension``
        later. The conditional UPDATE decides against the server clock (409
        hold_expired even before the expiry job ran, hold_extended the second
        time, invalid_state for a booking no longer a HOLD); in the same
        transaction the hold's expiry job is replaced by one at the new expiry.
        A first job a worker already runs finds the hold not expired (its UPDATE
        re-reads hold_expires_at) and does nothing."""
        now = self.clock.now()
        jobs: list[Any] = []
        async with self.db.transaction() as conn:
            row = await repo.extend_hold(conn, booking_id, now, self.config.hold_extension)
            if row is not None:
                b = Booking.from_row(row)
                jobs = await self._move_expiry(conn, b)
                await emit(
                    conn, events.HOLD_EXTENDED, events.key(b.id), events.extended_payload(b), now
                )
        if row is None:
            raise DomainError(*domain.extension_refusal(await self.get(booking_id), now))
        await self._dispatch(jobs)
        return b

    async def _move_expiry(self, conn: asyncpg.Connection, b: Booking) -> list[Any]:
        """Cancel the hold's first expiry job and enqueue one at its new expiry,
        under a key of its own (one extension, so one second job at most)."""
        if self.scheduler is None:
            return []
        assert b.hold_expires_at is not None  # extend_hold returns a live HOLD
        await self.scheduler.cancel_by_key(EXPIRE_HOLD, _expiry_key(b.id), conn=conn)
        job = await self.scheduler.enqueue(
            EXPIRE_HOLD,
            ExpireHoldJob(booking_id=b.id).wire(),
            run_at=b.hold_expires_at,
            idempotency_key=_extended_expiry_key(b.id),
            conn=conn,
        )
        return [job]

    async def _emit(self, conn: asyncpg.Connection, b: Booking, now: datetime) -> None:
        await emit(conn, events.BY_STATUS[b.status], events.key(b.id), events.payload(b), now)

    # -- reading ---------------------------------------------------------------

    async def get(self, booking_id: int) -> Booking:
        row = await read_one(
            self.db, repo.get_booking, booking_id, "booking_not_found", f"no booking {booking_id}"
        )
        return Booking.from_row(row)

    async def customer_bookings(
        self,
        customer_id: int,
        before: tuple[datetime, int] | None,
        limit: int,
        status: str | None,
    ) -> list[Booking]:
        """A customer's bookings, newest first, strictly after ``before`` (the
        (created_at, id) of the previous page's last item); ``status`` is the
        effective status (an expired HOLD is EXPIRED)."""
        async with self.db.connection() as conn:
            rows = await repo.customer_bookings(
                conn, customer_id, before or FIRST_PAGE, limit, status, self.clock.now()
            )
        return [Booking.from_row(r) for r in rows]

    def _car_of(self, car: asyncpg.Record | None, car_id: int) -> Car:
        if car is None:
            raise DomainError("car_not_found", f"no car {car_id}")
        return Car.from_row(car)

    async def calendar(
        self, car_id: int, start: datetime, end: datetime
    ) -> tuple[Car, list[BlockedPeriod]]:
        """The car and what blocks it during [start, end): its live bookings whose
        period, turnaround buffer included, overlaps the window, in time order."""
        try:
            domain.check_window(start, end)
        except domain.InvalidPeriod as exc:
            raise validation_error(str(exc), at=("query", "to")) from None
        window = domain.StoredPeriod(start, end)  # no buffer: the window itself
        async with self.db.connection() as conn:
            car = self._car_of(await repo.get_car(conn, car_id), car_id)
            rows = await repo.car_calendar(conn, car_id, window, self.clock.now())
        return car, [BlockedPeriod.from_row(r) for r in rows]

    async def quote(
        self, car_id: int, start: datetime, end: datetime
    ) -> tuple[Car, domain.Quote, bool]:
        """The car, what a hold of [start, end) would cost, and whether it would
        find the car free now (the hold's own period rules: 422 for a period a
        hold would refuse)."""
        self.check_period(start, end)
        now = self.clock.now()
        period = domain.stored_period(start, end, self.config.turnaround)
        async with self.db.connection() as conn:
            car = self._car_of(await repo.get_car(conn, car_id), car_id)
            free = await repo.car_is_free(conn, car_id, period, now)
        q = domain.quote(start, end, car.daily_price, self.config.deposit_rate)
        return car, q, free

    # -- payments --------------------------------------------------------------

    async def on_payment(self, booking_id: int, txn_id: str, amount: int, status: str) -> str:
        """The gateway's webhook, after its signature was verified. Every SUCCEEDED
        payment is recorded with what it settled (payment.outcome, 0029); the row,
        the status flip and the events commit together, and a redelivery of the
        same providerTxnId inserts nothing and changes nothing.

        Only a payment of at least the deposit confirms a live HOLD; one above it
        is ``overpaid``: the excess goes back and the booking shows it
        (overpaid_refund). A payment that confirms nothing (below the deposit,
        zero included, or for a booking no longer a live HOLD) goes back in full."""
        if status != "SUCCEEDED":
            return "ignored"  # the hold simply runs out
        now = self.clock.now()
        async with self.db.transaction() as conn:
            payment_id = await repo.insert_deposit(conn, booking_id, txn_id, amount, now)
            if payment_id is None:
                return "duplicate"
            b, settled = await self._apply_payment(conn, booking_id, amount, now)
            await repo.settle_deposit(
                conn, payment_id, b.deposit_amount, settled.refund, settled.outcome
            )
            if settled.refund > 0:
                reason = _REFUND_REASONS[settled.outcome].format(status=b.status)
                await emit(
                    conn,
                    events.REFUND_REQUESTED,
                    events.key(booking_id),
                    events.refund_payload(b, settled.refund, reason),
                    now,
                )
        if not settled.confirmed:
            metrics.CONFLICTS.labels("rentals", _CONFLICT_OF[settled.outcome], "database").inc()
            return "refund_requested" if settled.refund > 0 else "ignored"
        if settled.outcome == "overpaid":
            log.info(
                "rentals_payment_overpaid",
                booking_id=booking_id,
                amount=amount,
                due=b.deposit_amount,
                excess=settled.refund,
            )
        return settled.outcome  # the webhook's result: confirmed or overpaid

    async def _apply_payment(
        self, conn: asyncpg.Connection, booking_id: int, amount: int, now: datetime
    ) -> tuple[Booking, domain.Settlement]:
        """Confirm the booking if ``amount`` covers its live HOLD; else expire it if
        its time has passed (the car may belong to someone else by now). Returns
        the booking as it stands and what the payment settled."""
        row = await repo.confirm(conn, booking_id, amount, now)
        if row is not None:
            confirmed = Booking.from_row(row)
            settled = domain.settle(
                amount, confirmed.deposit_amount, confirmed=True, live_hold=True
            )
            # Recorded before the confirmed event is written, which carries it.
            await repo.set_overpaid_refund(conn, booking_id, settled.refund)
            b = replace(confirmed, overpaid_refund=settled.refund)
            await self._emit(conn, b, now)
            await self._drop_expiry(conn, booking_id)
            return b, settled
        expired = await repo.expire_one(conn, booking_id, now)
        if expired is not None:
            await self._emit(conn, Booking.from_row(expired), now)
        current = await repo.get_booking(conn, booking_id)
        assert current is not None  # the payment row's foreign key just saw it
        b = Booking.from_row(current)
        live = domain.effective_status(b.status, b.hold_expires_at, now) == "HOLD"
        return b, domain.settle(amount, b.deposit_amount, confirmed=False, live_hold=live)

    # -- cancelling and the trip -------------------------------------------------

    async def cancel(self, booking_id: int, by: domain.Canceller) -> Booking:
        """Cancelling twice refunds once: the second call finds nothing to flip."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.cancel(conn, booking_id, now, by)
            if row is not None:
                refund = 0
                if row["previous_status"] == "CONFIRMED":
                    refund = domain.refund_amount(row["deposit_amount"], row["from_at"], now, by)
                await repo.set_refund(conn, booking_id, refund)
                b = replace(Booking.from_row(row), refund_amount=refund)
                await self._emit(conn, b, now)
                await self._drop_expiry(conn, booking_id)
                if refund > 0:
                    await emit(
                        conn,
                        events.REFUND_REQUESTED,
                        events.key(booking_id),
                        events.refund_payload(b, refund, f"cancelled by the {by}"),
                        now,
                    )
        if row is None:
            current = await self.get(booking_id)
            if current.status == "CANCELLED":
                return current
            status = domain.effective_status(current.status, current.hold_expires_at, now)
            raise DomainError("not_cancellable", f"a {status} booking cannot be cancelled")
        metrics.CANCELLATIONS.labels("rentals").inc()
        return b

    async def pick_up(self, booking_id: int) -> Booking:
        """CONFIRMED -> ON_TRIP, from ``pickup_lead`` before the trip's start on: a
        car handed over months early would leave a trip still ahead to be
        returned (COMPLETED) and taken off the car's calendar."""
        now = self.clock.now()
        starts_by = now + self.config.pickup_lead
        async with self.db.transaction() as conn:
            row = await repo.pick_up(conn, booking_id, now, starts_by)
            if row is not None:
                return await self._emitted(conn, row, now)
        current = await self.get(booking_id)
        if current.status == "CONFIRMED" and current.from_at > starts_by:
            opens = (current.from_at - self.config.pickup_lead).isoformat()
            raise DomainError("pickup_too_early", f"the pickup opens at {opens}")
        raise DomainError("invalid_state", f"booking is {current.status}, expected CONFIRMED")

    async def return_car(self, booking_id: int) -> Booking:
        """ON_TRIP -> COMPLETED."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.transition(conn, booking_id, "ON_TRIP", "COMPLETED", now)
            if row is not None:
                return await self._emitted(conn, row, now)
        current = await self.get(booking_id)
        raise DomainError("invalid_state", f"booking is {current.status}, expected ON_TRIP")

    async def _emitted(self, conn: asyncpg.Connection, row: repo.Row, now: datetime) -> Booking:
        b = Booking.from_row(row)
        await self._emit(conn, b, now)
        return b

    # -- expiry ----------------------------------------------------------------

    async def expire_hold(self, booking_id: int) -> bool:
        """The per-hold job (scheduler, at hold_expires_at); a no-op once paid."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.expire_one(conn, booking_id, now)
            if row is not None:
                await self._emit(conn, Booking.from_row(row), now)
        return row is not None

    async def sweep(self, batch: int = 500) -> int:
        """The safety net: flip every expired hold, a batch per transaction."""
        total = 0
        while True:
            now = self.clock.now()
            async with self.db.transaction() as conn:
                rows = await repo.sweep(conn, now, batch)
                for row in rows:
                    await self._emit(conn, Booking.from_row(row), now)
            total += len(rows)
            if len(rows) < batch:
                if total:
                    log.info("rentals_holds_expired", count=total)
                return total


class RefundConsumer(refunds.RefundConsumer):
    """Executes the refunds of rentals' outbox once per event (the shared
    consumer in core/messaging/refunds.py), into rentals' REFUND rows."""

    def __init__(self, db: Database, gateway: PaymentGateway | None, clock: Clock) -> None:
        super().__init__(db, gateway, clock, _REFUNDS, log)


_REFUNDS = refunds.RefundLedger(
    topic=events.REFUND_REQUESTED,
    subject="bookingId",
    log_prefix="rentals",
    log_field="booking_id",
    no_gateway=NO_GATEWAY,
    recorded=repo.refund_recorded,
    record=repo.insert_refund,
)


# Why (part of) a payment goes back, as the refund's notification says it.
_REFUND_REASONS: dict[domain.Outcome, str] = {
    "overpaid": "payment above the deposit: the excess is returned",
    "underpaid": "payment below the deposit: the booking is not confirmed",
    "not_payable": "payment received for a {status}",
}
# The conflicts counter's code for a payment that confirmed nothing.
_CONFLICT_OF: dict[domain.Outcome, str] = {
    "underpaid": "underpaid_payment",
    "not_payable": "late_payment",
}


def _expiry_key(booking_id: int) -> str:
    return f"booking:{booking_id}"


def _extended_expiry_key(booking_id: int) -> str:
    """The expiry job of an extended hold (the first one is cancelled)."""
    return f"booking:{booking_id}:extended"


def search_day_group(city: str, day: str) -> str:
    """The group of the cached search pages of ``city`` that cover ``day``
    (the city's hash tag: one slot with the pages)."""
    return f"rentals:avail:{{city:{city}}}:day:{day}"
