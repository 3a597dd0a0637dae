"""Request and response bodies of the Wallet API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, StrictInt

from reservo.core.http.schemas import ApiModel, Id

# Positive and far below bigint overflow even after many credits.
Amount = Annotated[StrictInt, Field(ge=1, le=10**15)]
Currency = Annotated[str, Field(pattern=r"^[A-Z]{3}$", examples=["EUR"])]


class AccountIn(ApiModel):
    # A real user (>= 1): 0 or below would collide with "nobody" (CHECK wallet_account_owner).
    owner_id: Id
    currency: Currency


class AccountOut(ApiModel):
    id: int
    # null for the system accounts (WORLD, HOUSE): they belong to nobody.
    owner_id: int | None
    currency: str
    balance: int


class DepositIn(ApiModel):
    amount: Amount
    # PostgreSQL text cannot hold NUL: refused here (422), not in the database.
    reference: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


class TransferIn(ApiModel):
    from_account_id: Id
    to_account_id: Id
    amount: Amount


class TransferOut(ApiModel):
    id: int
    from_account_id: int
    to_account_id: int
    amount: int
    created_at: datetime


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
