"""Builds the rentals module from settings and the shared parts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import structlog
from fastapi import APIRouter

from reservo.core.loops import run_every
from reservo.core.module import Consumes, JobKind, Module
from reservo.rentals import events, sandbox
from reservo.rentals.api import HOT_ROUTES, router
from reservo.rentals.errors import CONSTRAINTS, ERRORS
from reservo.rentals.gateway import PaymentGateway, SandboxGateway, WebhookKey, build_gateway
from reservo.rentals.service import (
    EXPIRE_HOLD,
    Config,
    ExpireHoldJob,
    RefundConsumer,
    RentalService,
)
from reservo.shared import Shared

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Rentals(Module):
    service: RentalService
    refunds: RefundConsumer
    gateway: PaymentGateway | None  # None: none configured (refunds wait)


def setup(shared: Shared) -> Rentals:
    s = shared.settings
    gateway = build_gateway(
        s.rentals_payment_gateway,
        s.payments_webhook_secret,
        s.rentals_gateway_url,
        s.rentals_gateway_token,
        s.rentals_gateway_timeout_s,
        page_base=s.rentals_payment_url_base or f"http://{s.http_host}:{s.http_port}",
        deadline_s=s.rentals_gateway_deadline_s,
    )
    if shared.announce:
        _warn_about_gateway(gateway)
    service = RentalService(
        shared.db,
        shared.clock,
        shared.cache,
        Config(
            turnaround=timedelta(minutes=s.rentals_turnaround_minutes),
            hold_ttl=timedelta(seconds=s.rentals_hold_ttl_seconds),
            deposit_rate=s.rentals_deposit_rate,
            hold_rate_limit=s.rentals_hold_rate_limit,
            hold_rate_window_s=s.rentals_hold_rate_window_s,
            search_cache_ttl_s=s.rentals_search_cache_ttl_s,
            search_local_ttl_s=s.rentals_search_local_ttl_s,
            pickup_lead=timedelta(minutes=s.rentals_pickup_lead_minutes),
            hold_extension=timedelta(seconds=s.rentals_hold_extension_s),
        ),
        scheduler=shared.scheduler,  # one expiry job per hold
        gateway=gateway,
    )
    refunds = RefundConsumer(shared.db, gateway, shared.clock)
    routers: list[APIRouter] = [router]
    if isinstance(gateway, SandboxGateway):  # chosen explicitly only
        routers.append(sandbox.router)
    return Rentals(
        name="rentals",
        service=service,
        refunds=refunds,
        gateway=gateway,
        routers=routers,
        hot=HOT_ROUTES,
        consumes=[Consumes(events.REFUND_CONSUMER, [events.REFUND_REQUESTED], refunds.handle)],
        jobs=[JobKind(EXPIRE_HOLD, service.expire_job, payload=ExpireHoldJob)],
        # The safety net behind the per-hold expiry jobs.
        roles={
            "rentals": lambda stop: run_every(
                stop, s.rentals_sweep_interval_s, "rentals_sweep", service.sweep
            )
        },
        errors=ERRORS,
        constraints=CONSTRAINTS,
        events=events.CONTRACT,
        notifications={topic: events.notifications for topic in events.TOPICS},
        state={
            "rentals": service,
            "rentals_gateway": gateway,
            "rentals_webhook": WebhookKey(s.payments_webhook_secret, s.webhook_tolerance_s),
        },
        closers=[gateway.aclose] if gateway is not None else [],
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
