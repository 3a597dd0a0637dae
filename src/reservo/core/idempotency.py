"""Idempotency-Key semantics of API.md, stored in PostgreSQL.

A request first *claims* (caller, endpoint, key) in its own short statement. The
business transaction then *completes* the claim with the response, so the
created thing and its stored response commit together. A retry finds either the
stored response (replayed; 201 becomes 200), a claim still in flight (409
request_in_progress), or a different body under the same key (422).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import orjson

from reservo.core.clock import Clock
from reservo.core.db import Database, Queries
from reservo.core.errors import DomainError

_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
Q = Queries.load("reservo.core")
T = TypeVar("T")
# A hook a use case runs inside its own transaction with what it created. The
# API stores its idempotent response there, so the response and the effect
# commit together ("created but not recorded" cannot happen).
Within = Callable[[asyncpg.Connection, T], Awaitable[None]]


def validate_key(key: str | None, *, required: bool) -> str | None:
    if key is None or key == "":
        if required:
            raise DomainError(
                "idempotency_key_required",
                "this endpoint requires an Idempotency-Key header",
            )
        return None
    if not _KEY.match(key):
        raise DomainError(
            "idempotency_key_required",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )
    return key


def request_hash(body: bytes) -> bytes:
    """Hash of the request body; JSON is canonicalised so key order and spacing
    of a retried body do not matter."""
    try:
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        canonical = body
    return hashlib.sha256(canonical).digest()


@dataclass(frozen=True)
class Replay:
    status: int
    body: Any


@dataclass(frozen=True)
class Claim:
    caller: str
    endpoint: str
    key: str

    async def complete(self, conn: asyncpg.Connection, status: int, body: Any) -> None:
        """Store the response; call inside the business transaction."""
        await conn.execute(Q.idem_complete, self.caller, self.endpoint, self.key, status, body)

    def storing(self, status: int, render: Callable[[T], Any]) -> Within[T]:
        """The hook that completes this claim with ``render(created)``."""

        async def within(conn: asyncpg.Connection, created: T) -> None:
            await self.complete(conn, status, render(created))

        return within


class IdempotencyStore:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        lease_s: int = 60,
        retention: timedelta = timedelta(hours=24),
    ) -> None:
        self.db, self.clock = db, clock
        self.lease = timedelta(seconds=lease_s)
        self.retention = retention

    async def begin(self, caller: str, endpoint: str, key: str, body: bytes) -> Claim | Replay:
        digest = request_hash(body)
        now = self.clock.now()
        async with self.db.connection() as conn:
            if await conn.fetchval(
                Q.idem_insert, caller, endpoint, key, digest, now + self.lease, now
            ):
                return Claim(caller, endpoint, key)
            row = await conn.fetchrow(Q.idem_get, caller, endpoint, key)
            if row is None:  # pruned between the two statements: the key is free again
                return await self.begin(caller, endpoint, key, body)
            if bytes(row["request_hash"]) != digest:
                raise DomainError(
                    "idempotency_key_reused",
                    "this Idempotency-Key was used with a different request body",
                )
            if row["status"] == "DONE":
                status = row["response_status"]
                return Replay(200 if status == 201 else status, row["response_body"])
            if (
                row["locked_until"] is not None
                and row["locked_until"] < now
                and (
                    await conn.fetchval(
                        Q.idem_take_over,
                        caller,
                        endpoint,
                        key,
                        row["locked_until"],
                        now + self.lease,
                    )
                )
            ):
                return Claim(caller, endpoint, key)
        raise DomainError(
            "request_in_progress",
            "a request with this Idempotency-Key is still being processed",
            headers={"Retry-After": "1"},
        )

    async def finish(self, claim: Claim, status: int, body: Any) -> None:
        """Store a refusal (a deterministic 4xx) outside any business transaction."""
        async with self.db.connection() as conn:
            await claim.complete(conn, status, body)

    async def release(self, claim: Claim) -> None:
        """Forget a claim whose request failed for a passing reason, so a retry may run."""
        async with self.db.connection() as conn:
            await conn.execute(Q.idem_release, claim.caller, claim.endpoint, claim.key)

    async def prune(self, batch: int = 5000) -> int:
        cutoff: datetime = self.clock.now() - self.retention
        total = 0
        async with self.db.connection() as conn:
            while True:
                n = int(await conn.fetchval(Q.idem_prune, cutoff, batch))
                total += n
                if n < batch:
                    return total
