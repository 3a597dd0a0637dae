"""Builds the appointments module from settings and the shared parts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from reservo.appointments import events
from reservo.appointments.api import HOT_ROUTES, router
from reservo.appointments.calendar import CalendarFeeds, FeedLimits
from reservo.appointments.calendar_api import feeds_router
from reservo.appointments.calendar_api import router as calendar_router
from reservo.appointments.change_feed import SlotChangeFeed
from reservo.appointments.domain import Limits, NoShowPolicy, Window
from reservo.appointments.errors import CONSTRAINTS, ERRORS
from reservo.appointments.holds import EXPIRE_HOLD, ExpireHoldJob
from reservo.appointments.payments import RefundConsumer
from reservo.appointments.reminders import REMINDER_JOB, ReminderJob
from reservo.appointments.schedules import SCHEDULE_BATCH
from reservo.appointments.service import AppointmentService
from reservo.core.aio.loops import run_every
from reservo.core.kernel.clock import HOUR_S
from reservo.core.kernel.payments import APPOINTMENT_PAYMENTS
from reservo.core.module import Consumes, JobKind, Module
from reservo.rentals import PaymentGateway, build_gateway
from reservo.scheduler import parse_allow
from reservo.settings import Settings
from reservo.shared import Shared


@dataclass(frozen=True, kw_only=True)
class Appointments(Module):
    service: AppointmentService


def setup(shared: Shared) -> Appointments:
    s = shared.settings
    own = s.appointments
    gateway = _gateway(s)
    feed = _feed(shared)
    service = AppointmentService(
        shared.db,
        shared.clock,
        shared.cache,
        shared.limiter,
        _limits(s),
        scheduler=shared.scheduler,
        window=Window(own.horizon_days, own.opening_time),
        no_shows=NoShowPolicy(own.no_show_limit, own.no_show_block_days),
        stale=shared.stale,
        idempotency=shared.idempotency,
        gateway=gateway,
        push_allow=parse_allow(s.jobs_http_allow),
        feed=feed,
    )
    refunds = RefundConsumer(shared.db, gateway, shared.clock)
    feeds = CalendarFeeds(
        shared.db,
        shared.clock,
        shared.cache,
        FeedLimits(
            url_base=own.calendar_url_base or f"http://{s.http_host}:{s.http_port}",
            cache_life_s=own.calendar_cache_life_s,
            local_ttl_s=own.calendar_local_ttl_s,
        ),
    )
    return Appointments(
        name="appointments",
        service=service,
        routers=[router, calendar_router, feeds_router],
        hot=HOT_ROUTES,
        consumes=[
            Consumes(
                events.SLOT_LISTS_CONSUMER, events.SLOT_LIST_CHANGES, service.slot_lists_changed
            ),
            Consumes(events.REFUND_CONSUMER, [events.REFUND_REQUESTED], refunds.handle),
        ],
        jobs=[
            JobKind(REMINDER_JOB, service.remind, payload=ReminderJob),
            JobKind(EXPIRE_HOLD, service.expire_job, payload=ExpireHoldJob),
        ],
        # Keeps repeating schedules generated up to the horizon, every day, without
        # anyone calling again (idempotent; any number of workers may run it), and
        # ends the unpaid holds no expiry job ended (the safety net behind them).
        roles={
            "appointments": lambda stop: _appointments_role(
                stop, service, own.schedule_interval_s, own.hold_sweep_interval_s
            )
        },
        errors=ERRORS,
        constraints=CONSTRAINTS,
        events=events.CONTRACT,
        notifications={topic: events.notifications for topic in events.TOPICS},
        state={
            "appointments": service,
            "calendar_feeds": feeds,
            APPOINTMENT_PAYMENTS: service,  # the payments webhook's appointmentId
        },
        closers=[gateway.aclose] if gateway is not None else [],
        # Polls only in a process that served a slot list (change_feed.py).
        companions=[feed.run] if feed is not None else [],
    )


def _limits(s: Settings) -> Limits:
    own = s.appointments
    return Limits(
        booking_rate_limit=own.booking_rate_limit,
        booking_rate_window_s=own.booking_rate_window_s,
        slots_cache_life_s=own.slots_cache_life_s,
        slots_stale_s=own.slots_stale_s,
        slots_cache_ttl_s=own.slots_cache_ttl_s,
        slots_refresh_ahead_s=own.slots_refresh_ahead_s,
        slots_local_ttl_s=own.slots_local_ttl_s,
        full_mark_ttl_s=own.full_mark_ttl_s,
        key_memory_s=s.idempotency_retention_hours * HOUR_S,
    )


def _feed(shared: Shared) -> SlotChangeFeed | None:
    own = shared.settings.appointments
    if own.slots_change_feed_interval_s <= 0:
        return None
    return SlotChangeFeed(
        shared.db,
        shared.clock,
        interval_s=own.slots_change_feed_interval_s,
        keep_s=own.slots_cache_life_s,
    )


def _gateway(s: Settings) -> PaymentGateway | None:
    """The same payment gateway (or sandbox) as rentals, from the same settings:
    a prepaid appointment's paymentUrl and its refunds."""
    r = s.rentals
    return build_gateway(
        r.payment_gateway,
        s.payments_webhook_secret,
        r.gateway_url,
        r.gateway_token,
        r.gateway_timeout_s,
        page_base=r.payment_url_base or f"http://{s.http_host}:{s.http_port}",
        deadline_s=r.gateway_deadline_s,
    )


async def _appointments_role(
    stop: asyncio.Event, service: AppointmentService, schedule_s: float, sweep_s: float
) -> None:
    await asyncio.gather(
        run_every(
            stop,
            schedule_s,
            "appointments_schedules",
            service.extend_schedules,
            again=lambda extended: extended >= SCHEDULE_BATCH,
        ),
        run_every(stop, sweep_s, "appointments_holds", service.sweep_holds),
    )
