"""Settings of the betting module (betting/setup.py), read from the environment (prefix
``RESERVO_BETTING_``); ``reservo.settings.Settings`` nests them as ``betting``, so
each variable keeps its name. This class is the module's configuration: its
services take it (or its fields) as it is."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BettingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_BETTING_", extra="ignore")

    # Betting: settlement chunk size (bets per transaction; 5,000 cost less CPU and
    # time than 10,000 in bench/settlement: smaller payout events spread over the
    # house shards), result webhook to Kafka.
    settle_chunk: int = Field(default=5_000, ge=1, le=100_000)
    # Chunk loops per process sharing one match (SKIP LOCKED keeps them apart).
    settle_parallel: int = Field(default=2, ge=1, le=16)
    # Matches settled together in one transaction (Settlement.settle_many), their
    # legs graded by one statement, up to settle_chunk legs.
    settle_batch_matches: int = Field(default=500, ge=1, le=10_000)
    publish_attempts: int = Field(default=3, ge=1, le=10)
    publish_backoff_s: float = 0.05
    publish_timeout_s: float = 2.0
    breaker_failures: int = 3
    breaker_reset_s: float = 10.0
    resend_interval_s: float = 0.5
    resend_batch: int = 100
    # How long a resender keeps the fallback rows it claimed while it publishes them.
    resend_lease_s: float = Field(default=60.0, gt=0)
    sweep_interval_s: float = 5.0
    # The largest potential payout a bet may have, in minor units (default
    # 10,000,000.00): above it the bet is refused (422 at the stake).
    max_payout: int = Field(default=1_000_000_000, ge=1, le=2**63 - 1)
