"""Request and response bodies of the Wallet API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Self

from pydantic import Field, StrictBool, StrictInt, model_validator

from reservo.core.http.schemas import ApiModel, Id
from reservo.wallet.domain import PENDING_TIMEOUT_MAX_S

# Positive and far below bigint overflow even after many credits.
Amount = Annotated[StrictInt, Field(ge=1, le=10**15)]
Currency = Annotated[
    str,
    Field(
        pattern=r"^[A-Z]{3}$",
        examples=["EUR"],
        description="An ISO 4217 code, or one RESERVO_WALLET_CURRENCIES adds; any other is 422",
    ),
]


class AccountIn(ApiModel):
    # A real user (>= 1): 0 or below would collide with "nobody" (CHECK wallet_account_owner).
    owner_id: Id
    currency: Currency


class AccountOut(ApiModel):
    id: int
    # null for the system accounts (WORLD, HOUSE): they belong to nobody.
    owner_id: int | None
    currency: str
    balance: int = Field(description="the posted balance")
    available: int = Field(
        description="what the account may spend: its balance less its pending transfers out"
    )


class DepositIn(ApiModel):
    amount: Amount
    # PostgreSQL text cannot hold NUL: refused here (422), not in the database.
    reference: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


class TransferIn(ApiModel):
    from_account_id: Id
    to_account_id: Id
    amount: Amount
    pending: Annotated[
        StrictBool,
        Field(
            description="true: a two-phase transfer that only reserves the amount on the "
            "source until it is posted, voided or reaches expiresAt (voided then)"
        ),
    ] = False
    timeout_s: Annotated[
        StrictInt | None,
        Field(
            ge=1,
            le=PENDING_TIMEOUT_MAX_S,
            description="seconds a pending transfer lives; required with pending, only with it",
        ),
    ] = None

    @model_validator(mode="after")
    def _timeout_with_pending(self) -> Self:
        if self.pending != (self.timeout_s is not None):
            raise ValueError("timeoutS is given with pending: true, and only with it")
        return self


class PostIn(ApiModel):
    amount: Annotated[
        StrictInt | None,
        Field(ge=1, le=10**15, description="at most the pending amount; the rest is released"),
    ] = None


class TransferOut(ApiModel):
    id: int
    from_account_id: int
    to_account_id: int
    amount: int
    created_at: datetime
    status: str = Field(description="POSTED, or a two-phase transfer's PENDING or VOIDED")
    expires_at: datetime | None = Field(
        description="a two-phase transfer's expiry (voided then unless posted); null otherwise"
    )


class AccountPage(ApiModel):
    items: list[AccountOut]
    next: str | None


class PendingPage(ApiModel):
    items: list[TransferOut]
    next: str | None


class EntryOut(ApiModel):
    id: int
    transfer_id: int
    amount: int
    balance_after: int
    kind: str
    reference: str | None
    created_at: datetime


class StatementOut(ApiModel):
    account_id: int
    balance: int
    entries: list[EntryOut]
    next_before: int | None
