"""The composition root: builds the shared parts from Settings, then every module
through its ``setup``, and wires what the modules declare (routes, subscriptions,
job kinds, roles, error codes). Tests build the same graph with their own settings.

Adding a module is one line in ``MODULES``: its package, whose ``setup`` module
has ``setup(shared) -> Module``."""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import structlog

from reservo import __version__, core_modules
from reservo.appointments import setup as appointments
from reservo.appointments.service import AppointmentService
from reservo.betting import setup as betting
from reservo.betting.resender import FallbackResender
from reservo.betting.service import BettingService
from reservo.betting.settlement import Settlement
from reservo.core import errors
from reservo.core.cache import Cache
from reservo.core.clock import Clock, SystemClock
from reservo.core.contract import asyncapi_text
from reservo.core.db import Database, Queries
from reservo.core.health import Check, Readiness, Report
from reservo.core.idempotency import IdempotencyStore
from reservo.core.module import Module, Role
from reservo.core.notifications import NotificationConsumer
from reservo.core.outbox import OutboxRelay
from reservo.core.ratelimit import RateLimiter
from reservo.core.redis import RedisGate, make_client
from reservo.core.replicas import Replicas
from reservo.core.transport.base import Subscriptions
from reservo.core.transport.kafka import broker_answers
from reservo.rentals import setup as rentals
from reservo.rentals.gateway import PaymentGateway
from reservo.rentals.service import RentalService
from reservo.scheduler import setup as scheduler
from reservo.settings import SECRETS, Settings, SettingsError, check_secrets
from reservo.shared import Shared, consumer_from_settings
from reservo.wallet import setup as wallet
from reservo.wallet.events import PayoutConsumer

log = structlog.get_logger(__name__)
CORE_SQL = Queries.load("reservo.core")

# The business modules (their packages), in the order their routes appear in the
# API. Core's own modules (the outbox's relay and maintenance roles,
# notifications) come first.
MODULES: tuple[str, ...] = (
    "reservo.appointments",
    "reservo.rentals",
    "reservo.wallet",
    "reservo.betting",
    "reservo.scheduler",
    "reservo.ops",
    "reservo.console",
)
# `reservo worker --roles all`: every background role and every consumer.
ALL = "all"
M = TypeVar("M", bound=Module)


@dataclass(frozen=True, kw_only=True)
class Container(Shared):
    """The shared parts and every built module."""

    modules: tuple[Module, ...]

    def module(self, kind: type[M]) -> M:
        """The built module of that type (``container.module(rentals.Rentals)``)."""
        for m in self.modules:
            if isinstance(m, kind):
                return m
        raise LookupError(kind.__name__)

    # -- what tests, the CLI and the benchmarks reach by name ---------------------

    @property
    def relay(self) -> OutboxRelay:
        return self.module(core_modules.Outbox).relay

    @property
    def notifications(self) -> NotificationConsumer:
        return self.module(core_modules.Notifications).consumer

    @property
    def appointments(self) -> AppointmentService:
        return self.module(appointments.Appointments).service

    @property
    def rentals(self) -> RentalService:
        return self.module(rentals.Rentals).service

    @property
    def rentals_gateway(self) -> PaymentGateway | None:
        return self.module(rentals.Rentals).gateway

    @property
    def payouts(self) -> PayoutConsumer:
        return self.module(wallet.Wallet).payouts

    @property
    def betting(self) -> BettingService:
        return self.module(betting.Betting).service

    @property
    def settlement(self) -> Settlement:
        return self.module(betting.Betting).settlement

    @property
    def resender(self) -> FallbackResender:
        return self.module(betting.Betting).resender

    # -- roles ---------------------------------------------------------------------

    def roles(self) -> dict[str, Role]:
        """Every background role the modules offer (not the consumers)."""
        return {name: role for m in self.modules for name, role in m.roles.items()}

    def companions(self) -> list[Role]:
        """What every process hosting this graph runs besides its roles."""
        return [run for m in self.modules for run in m.companions]

    def background_roles(self) -> list[str]:
        return list(self.roles())

    def consumer_roles(self) -> list[str]:
        """Every consumer that subscribed to a topic (with Kafka: its group's name)."""
        return self.subscriptions.consumers()

    def all_roles(self) -> list[str]:
        """What a process running everything (`reservo up`, `--roles all`) runs."""
        return [*self.background_roles(), *self.consumer_roles()]

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

    # -- life cycle ------------------------------------------------------------------

    async def close(self) -> None:
        await self.db.close()
        await self.redis.aclose()
        await self.scheduler.close()
        for m in self.modules:
            for closer in m.closers:
                await closer()

    @functools.cached_property
    def readiness(self) -> Readiness:
        """Serving needs PostgreSQL; Redis fails open and Kafka waits behind the
        outbox, so either one down only degrades the service."""
        s = self.settings
        checks = [Check("postgres", self.db.ping, True), Check("redis", self.gate.ping, False)]
        if s.kafka_bootstrap:
            # Its own budget, inside the check's: the metadata round trip, not the
            # connect, is what proves the broker answers.
            kafka = functools.partial(broker_answers, s.kafka_bootstrap, s.ready_timeout_s)
            checks.append(Check("kafka", kafka, False))
        return Readiness(checks, timeout_s=s.ready_timeout_s, cache_s=s.ready_cache_s)

    async def ready(self) -> Report:
        return await self.readiness.report()

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


def build_shared(settings: Settings, clock: Clock, *, announce: bool = True) -> Shared:
    """The parts every module is built from."""
    if not settings.database_url or not settings.redis_url:
        raise SettingsError(
            "RESERVO_DATABASE_URL and RESERVO_REDIS_URL must be set "
            "(`reservo up` starts embedded ones when they are not)"
        )
    check_secrets(settings)
    db = Database(
        settings.database_url,
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        command_timeout=settings.db_command_timeout_s,
        acquire_timeout=settings.db_acquire_timeout_s,
        unavailable_hold_s=settings.db_unavailable_hold_s,
        replicas=(
            Replicas(
                settings.replica_urls,
                max_lag_s=settings.replica_max_lag_s,
                probe_interval_s=settings.replica_probe_interval_s,
                timeout_s=settings.replica_timeout_s,
                min_size=settings.db_replica_pool_min,
                max_size=settings.db_replica_pool_max,
            )
            if settings.replica_urls
            else None
        ),
    )
    client = make_client(
        settings.redis_url, settings.redis_timeout_s, cluster=settings.redis_cluster
    )
    gate = RedisGate(client, backoff_s=settings.redis_backoff_s)
    return Shared(
        settings=settings,
        clock=clock,
        db=db,
        redis=client,
        gate=gate,
        cache=Cache(gate, settings.redis_namespace),
        limiter=RateLimiter(gate, settings.redis_namespace),
        idempotency=IdempotencyStore(db, clock, lease_s=settings.idempotency_lease_s),
        scheduler=scheduler.build_scheduler(settings, db, clock),
        subscriptions=Subscriptions(),
        announce=announce,
    )


def build(settings: Settings, clock: Clock | None = None, *, announce: bool = True) -> Container:
    """The whole graph. ``announce`` logs the start-up warnings (sandbox or no
    payment gateway); off when the graph is built only to read what it declares."""
    shared = build_shared(settings, clock or SystemClock(), announce=announce)
    business = [setup_of(package)(shared) for package in MODULES]
    renderers = {t: r for m in business for t, r in m.notifications.items()}
    modules = (
        core_modules.outbox(shared),
        core_modules.notifications(shared, renderers),
        *business,
    )
    wire(shared, modules)
    parts = {f.name: getattr(shared, f.name) for f in fields(Shared)}
    return Container(**parts, modules=modules)


def setup_of(package: str) -> Callable[[Shared], Module]:
    """The ``setup`` function of a module's ``setup.py``."""
    setup: Callable[[Shared], Module] = importlib.import_module(f"{package}.setup").setup
    return setup


def wire(shared: Shared, modules: Sequence[Module]) -> None:
    """Register what the modules declare: error codes and constraint names, event
    subscriptions and job kinds. Refuses names two modules both claim."""
    roles: list[str] = []
    for m in modules:
        errors.register(m.errors, m.constraints)
        shared.events.add(m.events)
        for c in m.consumes:
            shared.subscriptions.add(c.consumer, c.topics, c.handler, c.batch)
        for job in m.jobs:
            if job.category in shared.scheduler.handlers:
                raise RuntimeError(f"job kind {job.category!r} is declared twice")
            shared.scheduler.register(
                job.category, job.handler, job.check, payload=job.payload, public=job.public
            )
        roles.extend(m.roles)
    taken = {ALL, *roles}
    clash = (taken & set(shared.subscriptions.consumers())) | {
        r for r in roles if roles.count(r) > 1
    }
    if clash:  # a consumer named like a background role could not be selected apart
        raise RuntimeError(f"role names {sorted(clash)} are taken twice")


@functools.cache
def _declared() -> Container:
    """A container built from the defaults, read without a deployment at hand
    (``reservo worker --help``). Building dials nothing (pools and clients connect
    on first use), so the addresses below are never used."""
    secrets: dict[str, Any] = {
        name: f"{name}-read-only-never-served-0123456789" for name in SECRETS
    }
    settings = Settings.model_construct(
        database_url="postgresql://declared-roles.invalid/reservo",
        redis_url="redis://declared-roles.invalid:6379/0",
        **secrets,
    )
    return build(settings, announce=False)


def declared_consumers() -> tuple[str, ...]:
    """The consumer roles the modules subscribe."""
    return tuple(_declared().consumer_roles())


def declared_asyncapi() -> str:
    """The AsyncAPI document of the events the modules declare (docs/asyncapi.json)."""
    return asyncapi_text(_declared().events, __version__)


def declared_background_roles() -> tuple[str, ...]:
    """The background roles the modules offer (relay, maintenance, scheduler...)."""
    return tuple(_declared().background_roles())


def __getattr__(name: str) -> Any:
    # ``BACKGROUND_ROLES`` was a hand-kept tuple; now it is read off the modules.
    if name == "BACKGROUND_ROLES":
        return declared_background_roles()
    raise AttributeError(name)


async def run_workers(c: Container, roles: Sequence[str], stop: asyncio.Event) -> None:
    """Run the background roles until ``stop`` is set."""
    roles = c.resolve_roles(roles)
    consumers = [r for r in roles if r in c.consumer_roles()]
    if consumers and not c.settings.kafka_bootstrap and "relay" not in roles:
        # Nothing is lost (the events wait in the outbox), but nothing here consumes them.
        log.warning("consumers_run_in_the_relay", consumers=consumers)
    tasks: list[Awaitable[None]] = [run(stop) for name, run in c.roles().items() if name in roles]
    tasks.extend(run(stop) for run in c.companions())
    if c.settings.kafka_bootstrap:
        for consumer in consumers:
            runner = consumer_from_settings(
                c.settings,
                consumer,
                c.subscriptions.for_consumer(consumer),
                c.db,
                c.clock,
                c.events,
            )
            tasks.append(runner.run(stop))
    log.info("workers_started", roles=roles)
    await asyncio.gather(*tasks)
