"""The composition root: builds every collaborator from Settings, once.
Tests build the same graph with their own settings."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import redis.asyncio
import structlog

from reservo.appointments import events as appointment_events
from reservo.appointments.service import REMINDER_JOB, AppointmentService, Limits
from reservo.betting import events as betting_events
from reservo.betting.service import (
    BettingService,
    FallbackResender,
    Publisher,
    ResultIntake,
    Settlement,
    TransportPublisher,
)
from reservo.core import metrics
from reservo.core.breaker import CircuitBreaker
from reservo.core.cache import Cache
from reservo.core.clock import Clock, SystemClock
from reservo.core.db import Database, Queries
from reservo.core.deadletters import DeadLetterBox, LocalDeadLetters
from reservo.core.errors import DomainError
from reservo.core.idempotency import IdempotencyStore
from reservo.core.notifications import CONSUMER as NOTIFICATIONS
from reservo.core.notifications import NotificationConsumer
from reservo.core.notify import Channel, build_channel
from reservo.core.outbox import OutboxRelay
from reservo.core.ratelimit import RateLimiter
from reservo.core.redis import RedisGate, make_client
from reservo.core.transport.base import Subscriptions, Transport
from reservo.core.transport.kafka import (
    broker_answers,
    consumer_from_settings,
    transport_from_settings,
)
from reservo.core.transport.local import LocalTransport
from reservo.rentals import events as rental_events
from reservo.rentals.gateway import PaymentGateway, SandboxGateway, build_gateway
from reservo.rentals.service import Config as RentalsConfig
from reservo.rentals.service import RefundConsumer, RentalService
from reservo.retention import build_pruner
from reservo.scheduler import Scheduler
from reservo.scheduler.setup import build_scheduler
from reservo.scheduler.workers import run as run_scheduler
from reservo.settings import Settings
from reservo.wallet import events as wallet_events
from reservo.wallet.events import CONSUMER as WALLET_PAYOUTS
from reservo.wallet.events import PayoutConsumer
from reservo.wallet.service import WalletService

log = structlog.get_logger(__name__)
CORE_SQL = Queries.load("reservo.core")

# Roles of a worker process that are not event consumers; `reservo worker --roles`
# picks a subset. The other roles are the consumer names of the Container's
# Subscriptions (never listed by hand: a list kept apart from the subscriptions
# once left most consumer groups unstarted): with Kafka each runs its consumer
# group; with the local transport the relay runs every subscription in-process.
BACKGROUND_ROLES = (
    "relay",
    "maintenance",
    "scheduler",
    "rentals",
    "settlement",
    "results_resend",
)
# `reservo worker --roles all`: every background role and every consumer.
ALL = "all"


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
    wallet: WalletService
    payouts: PayoutConsumer
    betting: BettingService
    settlement: Settlement
    results: ResultIntake
    resender: FallbackResender
    scheduler: Scheduler
    rentals: RentalService
    rentals_gateway: PaymentGateway | None  # None: none configured (refunds wait)
    dead_letters: DeadLetterBox

    def consumer_roles(self) -> list[str]:
        """Every consumer that subscribed to a topic (with Kafka: its group's name)."""
        return self.subscriptions.consumers()

    def all_roles(self) -> list[str]:
        """What a process running everything (`reservo up`, `--roles all`) runs."""
        return [*BACKGROUND_ROLES, *self.consumer_roles()]

    def resolve_roles(self, wanted: Sequence[str]) -> list[str]:
        """Expand ``all`` and refuse unknown names (ValueError naming the known ones)."""
        roles: list[str] = []
        for role in wanted:
            for r in self.all_roles() if role == ALL else [role]:
                if r not in roles:
                    roles.append(r)
        unknown = [r for r in roles if r not in self.all_roles()]
        if unknown:
            raise ValueError(
                f"unknown role(s) {', '.join(unknown)}; known: {ALL}, "
                + ", ".join(self.all_roles())
            )
        return roles

    async def close(self) -> None:
        await self.db.close()
        await self.redis.aclose()
        await self.scheduler.close()
        if self.rentals_gateway is not None:
            await self.rentals_gateway.aclose()
        aclose = getattr(self.channel, "aclose", None)
        if aclose is not None:
            await aclose()

    async def ready(self) -> dict[str, bool]:
        checks = {"postgres": await self.db.ping(), "redis": await self.gate.ping()}
        if self.settings.kafka_bootstrap:
            checks["kafka"] = await broker_answers(self.settings.kafka_bootstrap)
        return checks

    async def backlog(self) -> dict[str, float]:
        """Work waiting, for /readyz: an outage shows here as a growing backlog
        being retried, not as lost events."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(CORE_SQL.backlog, self.clock.now())
        return {
            "outboxPending": row["pending"],
            "outboxRetrying": row["retrying"],
            "outboxOldestSeconds": round(row["oldest_s"], 3),
            "deadEvents": row["dead_events"],
            "deadLetters": row["dead_letters"],
        }


def build(settings: Settings, clock: Clock | None = None, *, announce: bool = True) -> Container:
    """The whole graph. ``announce`` logs the start-up warnings (sandbox or no
    payment gateway); off when the graph is built only to read what it declares."""
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
    notifications.renderers.update({t: rental_events.notifications for t in rental_events.TOPICS})
    notifications.renderers[betting_events.BETS_SETTLED] = betting_events.notifications
    subscriptions = Subscriptions()
    subscriptions.add(
        NOTIFICATIONS, notifications.topics, notifications.handle, notifications.handle_many
    )
    rentals_gateway = build_gateway(
        settings.rentals_payment_gateway,
        settings.payments_webhook_secret,
        settings.rentals_gateway_url,
        settings.rentals_gateway_token,
        settings.rentals_gateway_timeout_s,
        page_base=settings.rentals_payment_url_base
        or f"http://{settings.http_host}:{settings.http_port}",
    )
    if announce:
        _warn_about_gateway(rentals_gateway)
    refunds = RefundConsumer(db, rentals_gateway, clock)
    subscriptions.add(
        rental_events.REFUND_CONSUMER, [rental_events.REFUND_REQUESTED], refunds.handle
    )
    wallet = WalletService(db, clock, settings.wallet_house_shards)
    payouts = PayoutConsumer(db, clock, settings.wallet_house_shards)
    subscriptions.add(WALLET_PAYOUTS, [wallet_events.PAYOUT_REQUESTED], payouts.handle)
    betting = BettingService(
        db, clock, settings.wallet_house_shards, max_payout=settings.betting_max_payout
    )
    settlement = Settlement(
        db,
        clock,
        chunk=settings.betting_settle_chunk,
        parallel=settings.betting_settle_parallel,
        house_shards=settings.wallet_house_shards,
    )
    subscriptions.add(
        betting_events.SETTLEMENT_CONSUMER, [betting_events.RESULT_TOPIC], settlement.handle
    )
    # The result webhook publishes straight to Kafka (its own producer, short timeout);
    # without Kafka every result goes to the PostgreSQL fallback table.
    publisher: Publisher | None = None
    if settings.kafka_bootstrap:
        results_producer = transport_from_settings(settings, lambda: [betting_events.RESULT_TOPIC])
        results_producer.request_timeout_ms = int(settings.betting_publish_timeout_s * 1000)
        results_producer.client_id = "reservo-results-webhook"
        publisher = TransportPublisher(results_producer, settings.betting_publish_timeout_s)
    results = ResultIntake(
        db,
        clock,
        settings.results_webhook_secret,
        tolerance_s=settings.webhook_tolerance_s,
        publisher=publisher,
        breaker=CircuitBreaker(
            "results_kafka",
            failure_threshold=settings.betting_breaker_failures,
            reset_timeout_s=settings.betting_breaker_reset_s,
        ),
        attempts=settings.betting_publish_attempts,
        backoff_s=settings.betting_publish_backoff_s,
    )
    resender = FallbackResender(
        db,
        clock,
        settlement,
        publisher=publisher,
        batch=settings.betting_resend_batch,
        lease_s=settings.betting_resend_lease_s,
    )
    clash = {ALL, *BACKGROUND_ROLES} & set(subscriptions.consumers())
    if clash:  # a consumer named like a background role could not be selected apart
        raise RuntimeError(f"consumer names {sorted(clash)} are taken by worker roles")
    # Kafka when configured; otherwise the relay runs the handlers in-process.
    transport: Transport = (
        transport_from_settings(settings, subscriptions.topics)
        if settings.kafka_bootstrap
        else LocalTransport(subscriptions, LocalDeadLetters(db, clock, settings.kafka_source))
    )
    relay = OutboxRelay(
        db,
        transport,
        clock,
        batch_size=(
            settings.kafka_relay_batch_size
            if settings.kafka_bootstrap
            else settings.outbox_batch_size
        ),
        lease_s=settings.outbox_lease_s,
        backoff_base_s=settings.outbox_backoff_base_s,
        backoff_max_s=settings.outbox_backoff_max_s,
        poll_interval_s=settings.outbox_poll_interval_s,
        pipelined=bool(settings.kafka_bootstrap),
    )
    scheduler = build_scheduler(settings, db, clock)
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
            key_memory_s=settings.idempotency_retention_hours * 3600,
        ),
        scheduler=scheduler,
    )
    scheduler.register(REMINDER_JOB, appointments.remind)
    rentals = RentalService(
        db,
        clock,
        cache,
        limiter,
        RentalsConfig(
            turnaround=timedelta(minutes=settings.rentals_turnaround_minutes),
            hold_ttl=timedelta(seconds=settings.rentals_hold_ttl_seconds),
            deposit_rate=settings.rentals_deposit_rate,
            hold_rate_limit=settings.rentals_hold_rate_limit,
            hold_rate_window_s=settings.rentals_hold_rate_window_s,
            search_cache_ttl_s=settings.rentals_search_cache_ttl_s,
        ),
        gateway=rentals_gateway,
    )
    rentals.attach_scheduler(scheduler)  # one expiry job per hold ("rentals.expire-hold")
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
        wallet,
        payouts,
        betting,
        settlement,
        results,
        resender,
        scheduler,
        rentals,
        rentals_gateway,
        DeadLetterBox(db, clock, subscriptions),
    )


def _warn_about_gateway(gateway: PaymentGateway | None) -> None:
    """Once per process (build runs once per API or worker process): both are
    fine for a demo and wrong for production, so say so where operators look."""
    if isinstance(gateway, SandboxGateway):
        log.warning(
            "rentals_sandbox_gateway",
            warning="sandbox payment gateway enabled: payments are simulated, "
            "do not use in production",
        )
    elif gateway is None:
        log.warning(
            "rentals_no_gateway",
            warning="no payment gateway configured: set RESERVO_RENTALS_PAYMENT_GATEWAY; "
            "bookings have no paymentUrl and refunds wait until one is set",
        )


@functools.cache
def declared_consumers() -> tuple[str, ...]:
    """The consumer roles without a deployment at hand (``reservo worker --help``):
    read off a container built from the defaults. Building dials nothing (pools
    and clients connect on first use), so the addresses below are never used."""
    settings = Settings.model_construct(
        database_url="postgresql://declared-roles.invalid/reservo",
        redis_url="redis://declared-roles.invalid:6379/0",
    )
    return tuple(build(settings, announce=False).consumer_roles())


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


async def _relay(c: Container, stop: asyncio.Event) -> None:
    try:
        await c.relay.transport.start()  # creates the topics; broker down: deliver retries
    except Exception as exc:
        log.warning("transport_start_failed", error=repr(exc))
    try:
        await c.relay.run(stop)
    finally:
        await c.relay.transport.stop()


async def _resend(c: Container, stop: asyncio.Event) -> None:
    """Drain the result fallback table; poll when it is empty."""
    while not stop.is_set():
        try:
            claimed = await c.resender.run_once()
        except DomainError as exc:
            log.warning("worker_unavailable", worker="results_resend", error=exc.detail)
            claimed = 0
        except Exception:
            log.exception("worker_error", worker="results_resend")
            claimed = 0
        if claimed < c.settings.betting_resend_batch:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), c.settings.betting_resend_interval_s)


async def run_workers(c: Container, roles: Sequence[str], stop: asyncio.Event) -> None:
    """Run the background roles until ``stop`` is set."""
    roles = c.resolve_roles(roles)
    consumers = [r for r in roles if r in c.consumer_roles()]
    if consumers and not c.settings.kafka_bootstrap and "relay" not in roles:
        # Nothing is lost (the events wait in the outbox), but nothing here consumes them.
        log.warning("consumers_run_in_the_relay", consumers=consumers)
    tasks: list[Awaitable[None]] = []
    if "relay" in roles:
        tasks.append(_relay(c, stop))
    if c.settings.kafka_bootstrap:
        for consumer in consumers:
            runner = consumer_from_settings(
                c.settings, consumer, c.subscriptions.for_consumer(consumer), c.db, c.clock
            )
            tasks.append(runner.run(stop))
    if "maintenance" in roles:
        if c.settings.retention_enabled:  # every growing table, idempotency keys included
            pruner = build_pruner(c.settings, c.db, c.clock)
            period_s = c.settings.retention_interval_s
            tasks.append(_every(stop, period_s, "retention", lambda: pruner.run(stop)))
        tasks.append(_every(stop, 5, "outbox_metrics", lambda: _sample_outbox(c)))
    if "scheduler" in roles:
        tasks.append(run_scheduler(c.scheduler, stop))
    if "rentals" in roles:  # safety net behind the per-hold expiry jobs
        tasks.append(
            _every(stop, c.settings.rentals_sweep_interval_s, "rentals_sweep", c.rentals.sweep)
        )
    if "settlement" in roles:  # resumes settlements a crashed worker left half done
        sweep_s = c.settings.betting_sweep_interval_s
        tasks.append(_every(stop, sweep_s, "settlement_sweep", c.settlement.sweep))
    if "results_resend" in roles:
        tasks.append(_resend(c, stop))
    log.info("workers_started", roles=roles)
    await asyncio.gather(*tasks)
