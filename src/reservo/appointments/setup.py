"""Builds the appointments module from settings and the shared parts."""

from __future__ import annotations

from dataclasses import dataclass

from reservo.appointments import events
from reservo.appointments.api import HOT_ROUTES, router
from reservo.appointments.calendar import CalendarFeeds, FeedLimits
from reservo.appointments.calendar_api import feeds_router
from reservo.appointments.calendar_api import router as calendar_router
from reservo.appointments.domain import Limits, NoShowPolicy, Window
from reservo.appointments.errors import CONSTRAINTS, ERRORS
from reservo.appointments.reminders import REMINDER_JOB, ReminderJob
from reservo.appointments.schedules import SCHEDULE_BATCH
from reservo.appointments.service import AppointmentService
from reservo.core.aio.loops import run_every
from reservo.core.kernel.clock import HOUR_S
from reservo.core.module import Consumes, JobKind, Module
from reservo.shared import Shared


@dataclass(frozen=True, kw_only=True)
class Appointments(Module):
    service: AppointmentService


def setup(shared: Shared) -> Appointments:
    s = shared.settings
    own = s.appointments
    service = AppointmentService(
        shared.db,
        shared.clock,
        shared.cache,
        shared.limiter,
        Limits(
            booking_rate_limit=own.booking_rate_limit,
            booking_rate_window_s=own.booking_rate_window_s,
            slots_cache_life_s=own.slots_cache_life_s,
            slots_cache_ttl_s=own.slots_cache_ttl_s,
            slots_local_ttl_s=own.slots_local_ttl_s,
            full_mark_ttl_s=own.full_mark_ttl_s,
            key_memory_s=s.idempotency_retention_hours * HOUR_S,
        ),
        scheduler=shared.scheduler,
        window=Window(own.horizon_days, own.opening_time),
        no_shows=NoShowPolicy(own.no_show_limit, own.no_show_block_days),
        stale=shared.stale,
    )
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
            )
        ],
        jobs=[JobKind(REMINDER_JOB, service.remind, payload=ReminderJob)],
        # Keeps repeating schedules generated up to the horizon, every day, without
        # anyone calling again (idempotent; any number of workers may run it).
        roles={
            "appointments": lambda stop: run_every(
                stop,
                own.schedule_interval_s,
                "appointments_schedules",
                service.extend_schedules,
                again=lambda extended: extended >= SCHEDULE_BATCH,
            )
        },
        errors=ERRORS,
        constraints=CONSTRAINTS,
        events=events.CONTRACT,
        notifications={topic: events.notifications for topic in events.TOPICS},
        state={"appointments": service, "calendar_feeds": feeds},
    )
