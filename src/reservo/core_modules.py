"""Setup of core's own modules, which every deployment has: the outbox (the
``relay`` and ``maintenance`` roles) and the notifications consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from reservo.core import metrics
from reservo.core.db import Queries
from reservo.core.deadletters import LocalDeadLetters
from reservo.core.loops import run_every
from reservo.core.module import Consumes, Module, Renderer
from reservo.core.notifications import CONSUMER, NotificationConsumer
from reservo.core.notify import Channel
from reservo.core.outbox import OutboxRelay
from reservo.core.transport.base import Transport
from reservo.core.transport.local import LocalTransport
from reservo.retention import build_partition_keeper, build_pruner
from reservo.shared import Shared, channel_from_settings, transport_from_settings

log = structlog.get_logger(__name__)
CORE_SQL = Queries.load("reservo.core")
# How often the maintenance role samples the outbox gauges.
OUTBOX_METRICS_PERIOD_S = 5.0


@dataclass(frozen=True, kw_only=True)
class Outbox(Module):
    relay: OutboxRelay


@dataclass(frozen=True, kw_only=True)
class Notifications(Module):
    consumer: NotificationConsumer
    channel: Channel


def outbox(shared: Shared) -> Outbox:
    s = shared.settings
    # Kafka when configured; otherwise the relay runs the handlers in-process.
    transport: Transport = (
        transport_from_settings(s, shared.subscriptions.topics, shared.events)
        if s.kafka_bootstrap
        else LocalTransport(
            shared.subscriptions, LocalDeadLetters(shared.db, shared.clock, s.kafka_source)
        )
    )
    relay = OutboxRelay(
        shared.db,
        transport,
        shared.clock,
        batch_size=s.kafka_relay_batch_size if s.kafka_bootstrap else s.outbox_batch_size,
        lease_s=s.outbox_lease_s,
        backoff_base_s=s.outbox_backoff_base_s,
        backoff_max_s=s.outbox_backoff_max_s,
        poll_interval_s=s.outbox_poll_interval_s,
        pipelined=bool(s.kafka_bootstrap),
        events=shared.events,
    )

    async def maintenance(stop: asyncio.Event) -> None:
        loops = [
            run_every(
                stop, OUTBOX_METRICS_PERIOD_S, "outbox_metrics", lambda: _sample_outbox(shared)
            )
        ]
        if s.retention_enabled:  # every growing table, idempotency keys included
            pruner = build_pruner(s, shared.db, shared.clock)
            loops.insert(
                0,
                run_every(stop, s.retention_interval_s, "retention", lambda: pruner.run(stop)),
            )
        else:  # no pruning, but the days ahead are still created (inserts stay routed)
            keeper = build_partition_keeper(s, shared.db, shared.clock)
            loops.insert(
                0, run_every(stop, s.retention_interval_s, "partitions", keeper.ensure_ahead)
            )
        await asyncio.gather(*loops)

    return Outbox(
        name="outbox",
        relay=relay,
        roles={"relay": lambda stop: _relay(relay, stop), "maintenance": maintenance},
    )


def notifications(shared: Shared, renderers: Mapping[str, Renderer]) -> Notifications:
    channel = channel_from_settings(shared.settings)
    consumer = NotificationConsumer(shared.db, channel, shared.clock, renderers)
    aclose = getattr(channel, "aclose", None)
    return Notifications(
        name="notifications",
        consumer=consumer,
        channel=channel,
        consumes=[Consumes(CONSUMER, consumer.topics, consumer.handle, consumer.handle_many)],
        closers=[aclose] if aclose is not None else [],
    )


async def _relay(relay: OutboxRelay, stop: asyncio.Event) -> None:
    try:
        await relay.transport.start()  # creates the topics; broker down: deliver retries
    except Exception as exc:
        log.warning("transport_start_failed", error=repr(exc))
    try:
        await relay.run(stop)
    finally:
        await relay.transport.stop()


async def _sample_outbox(shared: Shared) -> None:
    async with shared.db.connection() as conn:
        lag = await conn.fetchrow(CORE_SQL.outbox_lag, shared.clock.now())
        dead = await conn.fetchval(CORE_SQL.outbox_dead_count)
    metrics.OUTBOX_PENDING.set(lag["pending"])
    metrics.OUTBOX_OLDEST.set(lag["oldest_s"])
    metrics.OUTBOX_DEAD.set(dead)
