"""Settings of the wallet module (wallet/setup.py), read from the environment (prefix
``RESERVO_WALLET_``); ``reservo.settings.Settings`` nests them as ``wallet``, so
each variable keeps its name. This class is the module's configuration: its
services take it (or its fields) as it is."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from reservo.core.kernel.currencies import parse_extra


class WalletSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_WALLET_", extra="ignore")

    # Wallet: stakes spread over this many house sub-accounts per currency.
    house_shards: int = Field(default=8, ge=1, le=256)
    # Currency codes accepted besides ISO 4217's (core/kernel/currencies.py):
    # comma-separated, three capital letters each, e.g. "BTC,ZZT". Empty: ISO only.
    currencies: str = ""
    # The CSV statement (GET /api/accounts/{id}/statement.csv) streams from a
    # server-side cursor inside one read-only transaction, which stays open while
    # the client reads. These bound what one download may hold: the transaction
    # is ended (and the response cut short) after wallet_statement_max_s; each
    # fetch of wallet_statement_prefetch rows is a statement under
    # wallet_statement_fetch_timeout_s; and at most wallet_statement_streams
    # downloads per process hold a pool connection at once (503 statement_busy).
    statement_max_s: float = Field(default=300.0, gt=0, le=3600)
    statement_prefetch: int = Field(default=1_000, ge=10, le=50_000)
    statement_fetch_timeout_s: float = Field(default=10.0, gt=0, le=600)
    statement_streams: int = Field(default=4, ge=1, le=256)

    @field_validator("currencies")
    @classmethod
    def _codes(cls, value: str) -> str:
        parse_extra(value)  # a typo fails at start, not at the first account
        return value
