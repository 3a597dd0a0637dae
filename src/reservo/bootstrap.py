"""The composition root: builds the shared parts from Settings, then every module
through its ``setup``, and wires what the modules declare (routes, subscriptions,
job kinds, roles, error codes). Tests build the same graph with their own settings.

Adding a module is one line in ``MODULES``: its package, whose ``setup`` module
has ``setup(shared) -> Module``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

import structlog
import uvloop

from reservo import __version__, core_modules
from reservo.core.db.clock import DatabaseClock
from reservo.core.db.database import Database
from reservo.core.db.replicas import Replicas, StaleReads
from reservo.core.http.health import Check, Readiness, Report
from reservo.core.http.idempotency import IdempotencyStore
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel import errors
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import asyncapi_text
from reservo.core.maintenance.retention import PruneRule
from reservo.core.messaging.transport.base import Subscriptions
from reservo.core.messaging.transport.kafka import broker_answers
from reservo.core.module import Module, Role
from reservo.core.redis.cache import Cache
from reservo.core.redis.client import RedisGate, make_client
from reservo.core.redis.ratelimit import RateLimiter
from reservo.notifications import setup as notifications_setup
from reservo.scheduler.setup import build_scheduler
from reservo.settings import SECRETS, Settings, SettingsError, check_secrets
from reservo.shared import Shared, consumer_from_settings
from reservo.webhooks import setup as webhooks_setup

log = structlog.get_logger(__name__)

# The business modules (their packages), in the order their routes appear in the
# API. Core's own modules (the outbox's relay and maintenance roles,
# notifications) come first; webhooks out, which subscribe to every module's
# events, last.
MODULES: tuple[str, ...] = (
    "reservo.appointments",
    "reservo.rentals",
    "reservo.wallet",
    "reservo.betting",
    "reservo.scheduler",
    "reservo.ops",
    "reservo.console",
    "reservo.verify",
)
# `reservo worker --roles all`: every background role and every consumer.
ALL = "all"
M = TypeVar("M", bound=Module)
Setup = Callable[[Shared], Module]
# Makes the job queue every module enqueues into (build_scheduler by default).
QueueFactory = Callable[[Settings, Database, Clock], JobQueue]


@dataclass(frozen=True, kw_only=True)
class Container(Shared):
    """The shared parts and every built module. A module's objects are reached
    through the module (``container.module(Rentals).service``), never through
    names the root keeps for them."""

    modules: tuple[Module, ...]

    def module(self, kind: type[M]) -> M:
        """The built module of that type (``container.module(rentals.Rentals)``)."""
        for m in self.modules:
            if isinstance(m, kind):
                return m
        raise LookupError(kind.__name__)

    def retention(self) -> list[PruneRule]:
        """Every module's retention rules (what the maintenance role prunes)."""
        return [rule for m in self.modules for rule in m.retention]

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
        await self.stale.close()
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
        """Work waiting, for /readyz (the outbox module reads it)."""
        return await self.module(core_modules.Outbox).backlog()


def build_shared(
    settings: Settings,
    clock: Clock | None,
    *,
    announce: bool = True,
    queue: QueueFactory = build_scheduler,
) -> Shared:
    """The parts every module is built from. Without a ``clock`` (tests inject
    one), every time is PostgreSQL's (core/db/clock.py)."""
    if not settings.database_url or not settings.redis_url:
        raise SettingsError(
            "RESERVO_DATABASE_URL and RESERVO_REDIS_URL must be set "
            "(`reservo up` starts embedded ones when they are not)"
        )
    check_secrets(settings)
    db = _database(settings)
    client = make_client(
        settings.redis_url, settings.redis_timeout_s, cluster=settings.redis_cluster
    )
    gate = RedisGate(client, backoff_s=settings.redis_backoff_s)
    if clock is None:
        clock = DatabaseClock(
            db, sync_interval_s=settings.clock_sync_interval_s, alert_s=settings.clock_skew_alert_s
        )
    return Shared(
        settings=settings,
        clock=clock,
        db=db,
        stale=StaleReads(db, _replicas(settings)),
        redis=client,
        gate=gate,
        cache=Cache(gate, settings.redis_namespace),
        limiter=RateLimiter(gate, settings.redis_namespace),
        idempotency=IdempotencyStore(
            db,
            clock,
            lease_s=settings.idempotency_lease_s,
            wait_ms=settings.idempotency_wait_ms,
        ),
        scheduler=queue(settings, db, clock),
        subscriptions=Subscriptions(),
        announce=announce,
    )


def _database(settings: Settings) -> Database:
    assert settings.database_url
    return Database(
        settings.database_url,
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        command_timeout=settings.db_command_timeout_s,
        acquire_timeout=settings.db_acquire_timeout_s,
        host_timeout_s=settings.db_host_timeout_s,
        unavailable_hold_s=settings.db_unavailable_hold_s,
        commit_probe_s=settings.db_commit_probe_s,
    )


def _replicas(settings: Settings) -> Replicas | None:
    """The read replicas the stale reads may go to, if any are configured."""
    if not settings.replica_urls:
        return None
    return Replicas(
        settings.replica_urls,
        max_lag_s=settings.replica_max_lag_s,
        probe_interval_s=settings.replica_probe_interval_s,
        timeout_s=settings.replica_timeout_s,
        min_size=settings.db_replica_pool_min,
        max_size=settings.db_replica_pool_max,
    )


def build(
    settings: Settings,
    clock: Clock | None = None,
    *,
    announce: bool = True,
    queue: QueueFactory = build_scheduler,
    setups: Mapping[str, Setup] | None = None,
) -> Container:
    """The whole graph. ``announce`` logs the start-up warnings (sandbox or no
    payment gateway); off when the graph is built only to read what it declares.

    Tests inject instead of patching: ``queue`` makes the job queue, ``setups``
    replaces the setup of a module in MODULES (by package name)."""
    unknown = set(setups or {}) - set(MODULES)
    if unknown:
        raise ValueError(f"no module {sorted(unknown)} to replace; modules: {MODULES}")
    shared = build_shared(settings, clock, announce=announce, queue=queue)
    business = [(setups or {}).get(p, setup_of(p))(shared) for p in MODULES]
    renderers = {t: r for m in business for t, r in m.notifications.items()}
    notifications = notifications_setup.setup(shared, renderers)
    # Webhooks out subscribe to every event the business modules declare.
    webhooks = webhooks_setup.setup(shared, [e.name for m in business for e in m.events])
    kept = [rule for m in (notifications, *business, webhooks) for rule in m.retention]
    duties = [duty for m in (notifications, *business, webhooks) for duty in m.maintenance]
    modules = (core_modules.outbox(shared, kept, duties), notifications, *business, webhooks)
    wire(shared, modules)
    parts = {f.name: getattr(shared, f.name) for f in fields(Shared)}
    return Container(**parts, modules=modules)


def setup_of(package: str) -> Setup:
    """The ``setup`` function of a module's ``setup.py``."""
    setup: Setup = importlib.import_module(f"{package}.setup").setup
    return setup


def wire(shared: Shared, modules: Sequence[Module]) -> None:
    """Register what the modules declare: error codes and constraint names, event
    subscriptions and job kinds. Refuses names two modules both claim."""
    roles: list[str] = []
    kinds: set[str] = set()
    for m in modules:
        errors.register(m.errors, m.constraints)
        shared.events.add(m.events)
        for c in m.consumes:
            shared.subscriptions.add(c.consumer, c.topics, c.handler, c.batch)
        for job in m.jobs:
            if job.category in kinds:
                raise RuntimeError(f"job kind {job.category!r} is declared twice")
            kinds.add(job.category)
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


def _placeholders(settings: Settings) -> Settings:
    """The settings with addresses and secrets nobody uses: building dials
    nothing (pools and clients connect on first use), so a graph built only to
    read what the modules declare needs no deployment."""
    return settings.with_(
        **{
            "database_url": "postgresql://declared-roles.invalid/reservo",
            "redis_url": "redis://declared-roles.invalid:6379/0",
            **{name: f"{name}-read-only-never-served-0123456789" for name in SECRETS},
        }
    )


@functools.cache
def _declared() -> Container:
    """A container built from the defaults, read without a deployment at hand
    (``reservo worker --help``)."""
    return build(_placeholders(Settings.model_construct()), announce=False)


def declared_consumers() -> tuple[str, ...]:
    """The consumer roles the modules subscribe."""
    return tuple(_declared().consumer_roles())


def declared_asyncapi() -> str:
    """The AsyncAPI document of the events the modules declare (docs/asyncapi.json)."""
    return asyncapi_text(_declared().events, __version__)


def declared_background_roles() -> tuple[str, ...]:
    """The background roles the modules offer (relay, maintenance, scheduler...)."""
    return tuple(_declared().background_roles())


def declared_retention(settings: Settings) -> list[PruneRule]:
    """The retention rules the modules declare under these settings (what the
    maintenance role runs), without a deployment."""
    return build(_placeholders(settings), announce=False).retention()


async def run_workers(c: Container, roles: Sequence[str], stop: asyncio.Event) -> None:
    """Run the background roles until ``stop`` is set."""
    roles = c.resolve_roles(roles)
    consumers = [r for r in roles if r in c.consumer_roles()]
    if consumers and not c.settings.kafka_bootstrap and "relay" not in roles:
        # Nothing is lost (the events wait in the outbox), but nothing here consumes them.
        log.warning("consumers_run_in_the_relay", consumers=consumers)
    if isinstance(c.clock, DatabaseClock):
        # No role decides anything on this machine's own wall clock: it waits
        # for PostgreSQL's (a worker without PostgreSQL has nothing to do anyway).
        await c.clock.first(stop)
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


# The interpreter's switch interval in a process running WorkerThread.
SWITCH_INTERVAL_S = 0.001


class WorkerThread:
    """``roles`` on a thread of their own, with their own event loop and their
    own graph (pools): how `reservo up` runs its background roles beside its API.
    On the API's loop and pool, a saturated API starved them: each loop turn ran
    every ready request and one step of each role, and the roles queued for
    connections behind the requests (a results burst settled a quarter of what
    it accepted, its lag growing all the while). On a thread the interpreter
    shares the CPU out between the two loops (a thread waiting for it takes it
    at the next switch interval), and each loop has its own connections."""

    def __init__(self, settings: Settings, roles: Sequence[str]) -> None:
        self.settings, self.roles = settings, roles
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="reservo-workers", daemon=True)

    def start(self) -> None:
        # A thread whose I/O completed waits for the interpreter until the
        # running one gives it up, at most the switch interval (5 ms by default)
        # when that one never blocks (a saturated API). The roles wait that long
        # after every database round trip; at 1 ms they settled 0.8 of a results
        # burst by its end instead of 0.6 (tests/e2e/test_up_background_share.py).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()

    def _main(self) -> None:
        try:
            # uvloop, as the API's loop and `reservo worker` (cli.py says why).
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self._run())
        except BaseException as exc:  # raised again by stop(), in the caller's thread
            self._error = exc

    async def _run(self) -> None:
        stop = asyncio.Event()
        with self._lock:
            self._loop, self._stop = asyncio.get_running_loop(), stop
            if self._stopping:
                stop.set()
        container = build(self.settings, announce=False)  # the API's graph announced them
        try:
            await run_workers(container, self.roles, stop)
        finally:
            await container.close()

    async def stop(self) -> None:
        """Stop the roles as `reservo worker` stops them, and wait until they have."""
        with self._lock:
            self._stopping = True
            if self._loop is not None and self._stop is not None:
                with contextlib.suppress(RuntimeError):  # its loop has already ended
                    self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join)
        if self._error is not None:
            raise self._error
