"""Settings of the webhooks module (webhooks/setup.py), read from the environment
(prefix ``RESERVO_WEBHOOKS_``); ``reservo.settings.Settings`` nests them as
``webhooks``, so each variable keeps its name."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WebhooksSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_WEBHOOKS_", extra="ignore")

    # A delivery not answered 2xx is retried (exponential backoff with jitter)
    # for this long from its event, then FAILED.
    retry_hours: float = Field(default=72.0, gt=0)
    # The first retry waits about this long, each next one twice as long (with
    # jitter), never more than the cap.
    backoff_base_s: float = Field(default=5.0, gt=0)
    backoff_max_s: float = Field(default=3600.0, gt=0)
    # One attempt, from the name lookup to the answer's head.
    timeout_s: float = Field(default=10.0, gt=0)
    # Finished deliveries (and the event bodies no delivery needs any more)
    # are pruned this long after their creation; PENDING ones never.
    retention_days: int = Field(default=30, ge=1)
    # Attempts in flight to one endpoint per worker process (as many again may
    # wait for a slot): the others' deliveries keep the executors' remaining
    # slots (2 x 200 by default) whatever this one does.
    per_endpoint: int = Field(default=16, ge=1)
