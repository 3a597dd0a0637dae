"""Builds the betting module from settings and the shared parts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from reservo.betting import events
from reservo.betting.api import router
from reservo.betting.corrections import Resettlement
from reservo.betting.errors import CONSTRAINTS, ERRORS
from reservo.betting.intake import ResultIntake
from reservo.betting.publisher import Publisher, TransportPublisher
from reservo.betting.repo import Q
from reservo.betting.resender import FallbackResender
from reservo.betting.service import BettingService
from reservo.betting.settlement import Settlement
from reservo.core.aio.breaker import CircuitBreaker
from reservo.core.aio.loops import run_every
from reservo.core.maintenance.retention import PruneRule
from reservo.core.module import Consumes, Module
from reservo.settings import Settings
from reservo.shared import Shared, transport_from_settings

MS_PER_S = 1000


@dataclass(frozen=True, kw_only=True)
class Betting(Module):
    service: BettingService
    settlement: Settlement
    results: ResultIntake
    resender: FallbackResender
    resettlement: Resettlement


# A correction or void reopens every bet of the match in one transaction (50 s at
# 500,000 bets), under its own statement timeout: outside the request deadline.
UNBOUNDED = ("/api/matches/{matchId}/resettle", "/api/matches/{matchId}/void")


def setup(shared: Shared) -> Betting:
    s, db, clock = shared.settings, shared.db, shared.clock
    own = s.betting
    service = BettingService(
        db, clock, s.wallet.house_shards, max_payout=own.max_payout, stale=shared.stale
    )
    settlement = _settlement(shared)
    resettlement = Resettlement(db, clock, settlement)
    publisher = _publisher(shared)
    results = ResultIntake(
        db,
        clock,
        s.results_webhook_secret,
        tolerance_s=s.webhook_tolerance_s,
        publisher=publisher,
        breaker=CircuitBreaker(
            "results_kafka",
            failure_threshold=own.breaker_failures,
            reset_timeout_s=own.breaker_reset_s,
        ),
        attempts=own.publish_attempts,
        backoff_s=own.publish_backoff_s,
    )
    resender = FallbackResender(
        db,
        clock,
        settlement,
        publisher=publisher,
        batch=own.resend_batch,
        lease_s=own.resend_lease_s,
    )
    return Betting(
        name="betting",
        service=service,
        settlement=settlement,
        results=results,
        resender=resender,
        resettlement=resettlement,
        routers=[router],
        unbounded=UNBOUNDED,
        consumes=[
            Consumes(
                events.SETTLEMENT_CONSUMER,
                [events.RESULT_TOPIC],
                settlement.handle,
                batch=settlement.handle_batch,
            )
        ],
        roles={
            # Resumes settlements a crashed worker left half done.
            "settlement": lambda stop: run_every(
                stop, own.sweep_interval_s, "settlement_sweep", settlement.sweep
            ),
            # Drains the result fallback table; polls when it is empty.
            "results_resend": lambda stop: run_every(
                stop,
                own.resend_interval_s,
                "results_resend",
                resender.run_once,
                again=lambda claimed: claimed >= own.resend_batch,
            ),
        },
        errors=ERRORS,
        constraints=CONSTRAINTS,
        events=events.CONTRACT,
        notifications={events.BETS_SETTLED: events.notifications},
        state={"betting": service, "results": results, "resettlement": resettlement},
        retention=retention(s),
    )


def _settlement(shared: Shared) -> Settlement:
    own = shared.settings.betting
    return Settlement(
        shared.db,
        shared.clock,
        chunk=own.settle_chunk,
        parallel=own.settle_parallel,
        house_shards=shared.settings.wallet.house_shards,
        batch_matches=own.settle_batch_matches,
    )


def _publisher(shared: Shared) -> Publisher | None:
    """The result webhook publishes straight to Kafka (its own producer, short
    timeout); without Kafka every result goes to the PostgreSQL fallback table."""
    s = shared.settings
    own = s.betting
    if not s.kafka_bootstrap:
        return None
    producer = transport_from_settings(
        s,
        lambda: [events.RESULT_TOPIC],
        shared.events,
        request_timeout_ms=int(own.publish_timeout_s * MS_PER_S),
        client_id="reservo-results-webhook",
    )
    return TransportPublisher(producer, own.publish_timeout_s)


def retention(s: Settings) -> list[PruneRule]:
    """The result webhooks resent from the fallback table, and the rejected
    (malformed) ones; the results that settled a match are kept."""
    return [
        PruneRule.by_ctid(
            "fallback_prune",
            "webhook_events_fallback",
            Q.fallback_prunable,
            timedelta(hours=s.retention_webhook_fallback_hours),
        ),
        PruneRule.by_ctid(
            "rejected_prune",
            "webhook_events_rejected",
            Q.rejected_prunable,
            timedelta(days=s.retention_webhook_rejected_days),
        ),
    ]
