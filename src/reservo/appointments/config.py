"""Settings of the appointments module (appointments/setup.py), read from the environment (prefix
``RESERVO_APPOINTMENTS_``); ``reservo.settings.Settings`` nests them as ``appointments``, so
each variable keeps its name. This class is the module's configuration: its
services take it (or its fields) as it is."""

from __future__ import annotations

from datetime import time

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AppointmentsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_APPOINTMENTS_", extra="ignore")

    booking_rate_limit: int = 5
    booking_rate_window_s: int = 10
    # How long a slot list read from the primary stays in Redis while nothing
    # changes it: every booking, cancellation and move drops it (after its
    # commit, and durably through the outbox), a schedule change after its
    # commit. It also expires when the day's next slot opens.
    slots_cache_life_s: int = Field(default=60, ge=1, le=3600)
    # The staleness bound when both drops of a change were lost (the design's
    # 3-5 s): a list older than this (less the per-process copy's life) is
    # served only while the change feed vouches that its doctor did not change
    # since it was read; otherwise it is read again from PostgreSQL.
    slots_stale_s: float = Field(default=5.0, gt=0, le=3600)
    # How often each API process asks PostgreSQL which doctors' lists changed
    # (the change feed: one query reading what was written since, after the
    # process served its first list). Keep it well under the staleness bound
    # less a second; 0 turns it off: every list older than the bound is read again.
    slots_change_feed_interval_s: float = Field(default=1.0, ge=0, le=60)
    # The Redis life of a slot list read from a replica (which may lag behind a
    # change whose drop already ran).
    slots_cache_ttl_s: int = 3
    # A cached slot list with this long to live or less is read again from
    # PostgreSQL by one reader of the whole deployment (a Redis lease), in the
    # background, while every process keeps serving it: a popular list costs
    # one read per life, not one per API process, and no request waits on it.
    # 0 turns it off. Staleness stays bounded by the life.
    slots_refresh_ahead_s: float = Field(default=1.0, ge=0, le=60)
    # Per-API-process copy of a slot list in front of Redis (0 turns it off): how
    # long another process may keep showing a list after a booking changed it.
    # Never longer than the Redis entry it was read from.
    slots_local_ttl_s: float = Field(default=1.0, ge=0, le=60)
    full_mark_ttl_s: int = 30
    # The booking window: a slot opens at this local time (the doctor's zone) of
    # the day HORIZON_DAYS before its date; repeating schedules are kept generated
    # up to today + HORIZON_DAYS. Stored per slot when it is generated.
    horizon_days: int = Field(default=14, ge=1, le=366)
    opening_time: time = time(7, 0)
    # How often a worker's "appointments" role extends repeating schedules
    # (idempotent; any number of workers may run it).
    schedule_interval_s: float = Field(default=600.0, gt=0)
    # How often the same role ends the unpaid holds of prepaid slots that no
    # expiry job ended (scheduler down, a job lost): the safety net. A hold past
    # its end blocks no seat even before (a booking flips it first).
    hold_sweep_interval_s: float = Field(default=30.0, gt=0)
    # The no-show policy: a patient with NO_SHOW_LIMIT no-shows of slots that
    # started within 90 days cannot book (nor reschedule, nor join a waitlist) for
    # NO_SHOW_BLOCK_DAYS from the last of them; an admin may lift it. Applied
    # when a no-show is marked, so the booking statement only probes one row.
    no_show_limit: int = Field(default=3, ge=1, le=1000)
    no_show_block_days: int = Field(default=30, ge=1, le=3650)
    # Calendar feeds. The public base URL a feed link starts with (what calendar
    # applications reach, e.g. https://clinic.example); None = http_host:http_port.
    calendar_url_base: str | None = None
    # How long a rendered feed stays in Redis while nothing changes it: every
    # booking, cancellation and reschedule of its patient or doctor, and a new
    # link, drop it, so this bounds the PostgreSQL reads of a polled feed (one per
    # feed and this period) and how long a change Redis missed stays unseen.
    calendar_cache_life_s: int = Field(default=60, ge=1, le=3600)
    # Per-API-process copy of a feed in front of Redis (0 turns it off): how long
    # another process may keep serving a feed (or a replaced link) after a change.
    calendar_local_ttl_s: float = Field(default=1.0, ge=0, le=60)
