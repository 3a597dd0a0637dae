"""Builds the console: its pages, its session cookies and the pulse (the
per-second figures every process writes to Redis, console/pulse.py)."""

from __future__ import annotations

from dataclasses import dataclass

from reservo import verify
from reservo.console import (
    betting,
    clinic,
    deadletters,
    jobs,
    overview,
    people,
    rentals,
    search,
    signin,
    webhooks,
)
from reservo.console.figures import Figures
from reservo.console.pulse import Pulse
from reservo.console.session import Sessions
from reservo.console.web import Site, static
from reservo.core.module import Module
from reservo.shared import Shared


@dataclass(frozen=True, kw_only=True)
class Console(Module):
    pulse: Pulse
    figures: Figures


def setup(shared: Shared) -> Console:
    settings = shared.settings
    pulse = Pulse(shared.gate, settings.redis_namespace, shared.clock)
    figures = Figures(
        shared.db,
        shared.gate,
        shared.clock,
        pulse,
        shared.subscriptions.consumers,
        # Its Kafka topics: the streams of its events, and (this release) the
        # topics of their old names, whose lag the upgrade's drain watches.
        lambda consumer: _topics(shared, consumer),
        settings.kafka_bootstrap,
        settings.kafka_group_prefix,
        # What the maintenance role's last invariant check found (reservo/verify).
        lambda: verify.load(shared.gate, settings.redis_namespace),
    )
    sessions = Sessions(
        settings.jwt_secret, settings.console_session_s, secure=settings.console_secure_cookie
    )
    return Console(
        name="console",
        pulse=pulse,
        figures=figures,
        routers=[
            signin.router,
            overview.router,
            clinic.router,
            rentals.router,
            betting.router,
            jobs.router,
            deadletters.router,
            webhooks.router,
            search.router,
            people.router,
            static,
        ],
        companions=[pulse.run],
        state={
            "console": Site(
                sessions=sessions,
                clock=shared.clock,
                db=shared.db,
            ),
            "console_figures": figures,
        },
    )


def _topics(shared: Shared, consumer: str) -> list[str]:
    """The topics the consumer's group reads (core/messaging/transport/kafka/consumer.py)."""
    names = shared.subscriptions.for_consumer(consumer)
    streams = shared.events.streams(names)
    if not shared.settings.kafka_legacy_topics:
        return streams
    return streams + shared.events.former_topics(names)
