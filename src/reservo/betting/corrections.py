"""The admin's corrections and voids (POST /api/matches/{id}/resettle and
/void): the match reopened in one transaction (betting.resettlement), then
settled again after the commit."""

from __future__ import annotations

import asyncio

import structlog

from reservo.betting import domain, repo
from reservo.betting.resettlement import reopen_in_tx
from reservo.betting.settlement import Settlement
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError

log = structlog.get_logger(__name__)


class Resettlement:
    """The admin's corrections and voids: reopen in one transaction, then settle
    again after the commit (in the background: the sweeper resumes it should this
    process stop first)."""

    def __init__(self, db: Database, clock: Clock, settlement: Settlement) -> None:
        self.db, self.clock, self.settlement = db, clock, settlement
        self._running: set[asyncio.Task[None]] = set()

    async def resettle(self, match_id: int, result: domain.Reported, admin: int) -> int:
        return await self._reopen(match_id, result, admin, None)

    async def void(self, match_id: int, reason: str, admin: int) -> int:
        return await self._reopen(match_id, ("CANCELLED", None, None), admin, reason)

    async def _reopen(
        self, match_id: int, result: domain.Reported, admin: int, reason: str | None
    ) -> int:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            external_id = await repo.match_external_id(conn, match_id)
            if external_id is None:
                raise DomainError("match_not_found", f"no match {match_id}")
            await repo.lock_match_results(conn, external_id)
            try:
                generation = await reopen_in_tx(
                    conn,
                    match_id,
                    result,
                    now,
                    house_shards=self.settlement.house_shards,
                    voided_reason=reason,
                    void=reason is not None,
                )
            except domain.BetRefused as exc:
                raise DomainError(exc.code, exc.detail) from None
        log.warning("match_reopened_by_admin", admin=admin, match_id=match_id)
        task = asyncio.create_task(self.settlement.settle(match_id))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return generation

    async def wait(self) -> None:
        """Until the settlements this process started are done (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
