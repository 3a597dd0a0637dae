"""The composition root: builds every collaborator from Settings, once.
Tests build the same graph with their own settings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import redis.asyncio
import structlog

from reservo.appointments import events as appointment_events
from reservo.appointments.service import AppointmentService, Limits
from reservo.core import metrics
from reservo.core.cache import Cache
from reservo.core.clock import Clock, SystemClock
from reservo.core.db import Database, Queries
from reservo.core.errors import DomainError
from reservo.core.idempotency import IdempotencyStore
from reservo.core.notifications import CONSUMER as NOTIFICATIONS
from reservo.core.notifications import NotificationConsumer
from reservo.core.notify import Channel, build_channel
from reservo.core.outbox import OutboxRelay
from reservo.core.ratelimit import RateLimiter
from reservo.core.redis import RedisGate, make_client
from reservo.core.transport.base import Subscriptions
from reservo.core.transport.local import LocalTransport
from reservo.settings import Settings

log = structlog.get_logger(__name__)
CORE_SQL = Queries.load("reservo.core")

# Roles a worker process can run; `reservo worker --roles` picks a subset.
ROLES = ("relay", "maintenance")


@dataclass
class Container:
    settings: Settings
    clock: Clock
    db: Database
    redis: redis.asyncio.Redis
    gate: RedisGate
    cache: Cache
    limiter: RateLimiter
    idempotency: IdempotencyStore
    subscriptions: Subscriptions
    channel: Channel
    notifications: NotificationConsumer
    relay: OutboxRelay
    appointments: AppointmentService

    async def close(self) -> None:
        await self.db.close()
        await self.redis.aclose()
        aclose = getattr(self.channel, "aclose", None)
        if aclose is not None:
            await aclose()

    async def ready(self) -> dict[str, bool]:
        return {"postgres": await self.db.ping(), "redis": await self.gate.ping()}


def build(settings: Settings, clock: Clock | None = None) -> Container:
    if not settings.database_url or not settings.redis_url:
        raise RuntimeError(
            "RESERVO_DATABASE_URL and RESERVO_REDIS_URL must be set "
            "(`reservo up` starts embedded ones when they are not)"
        )
    clock = clock or SystemClock()
    db = Database(
        settings.database_url,
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        command_timeout=settings.db_command_timeout_s,
        acquire_timeout=settings.db_acquire_timeout_s,
    )
    client = make_client(settings.redis_url, settings.redis_timeout_s)
    gate = RedisGate(client, backoff_s=settings.redis_backoff_s)
    cache = Cache(gate, settings.redis_namespace)
    limiter = RateLimiter(gate, settings.redis_namespace)
    channel = build_channel(
        settings.notify_channel,
        smtp_host=settings.notify_smtp_host,
        smtp_port=settings.notify_smtp_port,
        smtp_sender=settings.notify_smtp_sender,
        smtp_username=settings.notify_smtp_username,
        smtp_password=settings.notify_smtp_password,
        smtp_starttls=settings.notify_smtp_starttls,
        email_template=settings.notify_email_template,
        http_url=settings.notify_http_url,
        http_token=settings.notify_http_token,
        timeout_s=settings.notify_timeout_s,
    )
    notifications = NotificationConsumer(
        db, channel, clock, {t: appointment_events.notifications for t in appointment_events.TOPICS}
    )
    subscriptions = Subscriptions()
    subscriptions.add(NOTIFICATIONS, notifications.topics, notifications.handle)
    relay = OutboxRelay(
        db,
        LocalTransport(subscriptions),
        clock,
        batch_size=settings.outbox_batch_size,
        lease_s=settings.outbox_lease_s,
        max_attempts=settings.outbox_max_attempts,
        backoff_base_s=settings.outbox_backoff_base_s,
        backoff_max_s=settings.outbox_backoff_max_s,
        poll_interval_s=settings.outbox_poll_interval_s,
    )
    appointments = AppointmentService(
        db,
        clock,
        cache,
        limiter,
        Limits(
            booking_rate_limit=settings.appointments_booking_rate_limit,
            booking_rate_window_s=settings.appointments_booking_rate_window_s,
            slots_cache_ttl_s=settings.appointments_slots_cache_ttl_s,
            full_mark_ttl_s=settings.appointments_full_mark_ttl_s,
        ),
    )
    idempotency = IdempotencyStore(
        db,
        clock,
        lease_s=settings.idempotency_lease_s,
        retention=timedelta(hours=settings.idempotency_retention_hours),
    )
    return Container(
        settings,
        clock,
        db,
        client,
        gate,
        cache,
        limiter,
        idempotency,
        subscriptions,
        channel,
        notifications,
        relay,
        appointments,
    )


async def _every(
    stop: asyncio.Event, period_s: float, name: str, work: Callable[[], Awaitable[object]]
) -> None:
    while not stop.is_set():
        try:
            await work()
        except DomainError as exc:
            log.warning("worker_unavailable", worker=name, error=exc.detail)
        except Exception:
            log.exception("worker_error", worker=name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)


async def _sample_outbox(c: Container) -> None:
    async with c.db.connection() as conn:
        lag = await conn.fetchrow(CORE_SQL.outbox_lag, c.clock.now())
        dead = await conn.fetchval(CORE_SQL.outbox_dead_count)
    metrics.OUTBOX_PENDING.set(lag["pending"])
    metrics.OUTBOX_OLDEST.set(lag["oldest_s"])
    metrics.OUTBOX_DEAD.set(dead)


async def run_workers(c: Container, roles: Sequence[str], stop: asyncio.Event) -> None:
    """Run the background roles until ``stop`` is set."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; known: {', '.join(ROLES)}")
    tasks: list[Awaitable[None]] = []
    if "relay" in roles:
        tasks.append(c.relay.run(stop))
    if "maintenance" in roles:
        tasks.append(_every(stop, 3600, "idempotency_prune", c.idempotency.prune))
        tasks.append(_every(stop, 5, "outbox_metrics", lambda: _sample_outbox(c)))
    log.info("workers_started", roles=list(roles))
    await asyncio.gather(*tasks)
