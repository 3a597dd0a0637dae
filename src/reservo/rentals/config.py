"""Settings of the rentals module (rentals/setup.py), read from the environment (prefix
``RESERVO_RENTALS_``); ``reservo.settings.Settings`` nests them as ``rentals``, so
each variable keeps its name. This class is the module's configuration: its
services take it (or its fields) as it is."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RentalsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_RENTALS_", extra="ignore")

    turnaround_minutes: int = Field(default=120, ge=0, le=7 * 24 * 60)
    hold_ttl_seconds: int = Field(default=900, ge=1)
    deposit_rate: float = Field(default=0.3, ge=0, le=1)
    # Holds created per customer per sliding window (counted in PostgreSQL).
    hold_rate_limit: int = Field(default=3, ge=1)
    hold_rate_window_s: int = Field(default=900, ge=1)
    search_cache_ttl_s: int = Field(default=30, ge=1)
    # Per-process copy of a search answer in front of Redis (0: none), never kept
    # past the Redis entry it was read from.
    search_local_ttl_s: float = Field(default=1.0, ge=0, le=60)
    sweep_interval_s: float = 30.0
    # A CONFIRMED booking may be picked up (ON_TRIP) from this long before its
    # `from` on, never earlier: a trip started months ahead and then returned would
    # take a future booking off the car's calendar (409 pickup_too_early).
    pickup_lead_minutes: int = Field(default=60, ge=0, le=7 * 24 * 60)
    # Public base URL of this API for the sandbox page's links; None = http_host:http_port.
    payment_url_base: str | None = None
    # `sandbox` simulates payments (its page) and records refunds locally; `http`
    # calls rentals_gateway_url. Never a default: None serves no payment page and
    # refunds wait (retried) until a gateway is set. `reservo up --demo` picks sandbox.
    payment_gateway: Literal["sandbox", "http"] | None = None
    gateway_url: str | None = None
    gateway_token: str | None = None
    gateway_timeout_s: float = 5.0
    # A refund (its attempts included) ends within this: the timeout above is per
    # network operation, which a gateway trickling its answer never trips.
    gateway_deadline_s: float = Field(default=30.0, gt=0)
    # How much later a HOLD expires after its one extension (POST
    # /api/bookings/{id}/extend-hold): the customer asked for more time to pay.
    hold_extension_s: int = Field(default=900, ge=1, le=24 * 3600)

    # The durations the service computes with.
    @property
    def turnaround(self) -> timedelta:
        return timedelta(minutes=self.turnaround_minutes)

    @property
    def hold_ttl(self) -> timedelta:
        return timedelta(seconds=self.hold_ttl_seconds)

    @property
    def pickup_lead(self) -> timedelta:
        return timedelta(minutes=self.pickup_lead_minutes)

    @property
    def hold_extension(self) -> timedelta:
        return timedelta(seconds=self.hold_extension_s)
