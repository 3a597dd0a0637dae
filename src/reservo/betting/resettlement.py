"""Result corrections and voids: a match settled again under another result.

A correction (the results webhook with ``"correction": true``, or an admin's
``POST /api/matches/{id}/resettle``) and a void (``POST /api/matches/{id}/void``,
a CANCELLED result) reopen the match in one transaction, under its result lock
and its row lock:

- every payout and refund its settled bets were paid in their generation is
  reversed in the wallet (REVERSAL entries; the first settlement's rows stay),
  even when that takes the account below zero (the winner spent it);
- those bets are PENDING again under their next generation, the match's legs
  PENDING, the match SETTLING under its next settlement generation with the new
  result;
- ``betting.match.resettled.v1`` is emitted through the outbox.

The ordinary settlement (settlement.Settlement; betting.corrections for the
admin's) then settles it again, paying
each bet under the reference of its new generation: every bet is paid at most
once per generation, and what an account holds is the payouts of the last
result alone.

The match row lock (FOR UPDATE) waits for the settlement chunks grading under
the old result (they hold FOR KEY SHARE on the row until they commit), so a
match still SETTLING may be corrected too: what the chunks already paid is
reversed, and the chunks after read the new result."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import structlog

from reservo import wallet
from reservo.betting import domain, events, repo
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.outbox import emit

log = structlog.get_logger(__name__)

# Per statement of a reopen: locking, reversing and reopening every bet of a
# match of 500,000 takes seconds per statement, past the pool's command timeout
# (10 s) on a loaded machine. The reopen is one transaction by design (a bet is
# reversed exactly when it is reopened), so its statements get this instead.
REOPEN_STATEMENT_TIMEOUT_S = 600.0


def _current(match: asyncpg.Record) -> domain.Reported:
    return match["result_status"], match["home_score"], match["away_score"]


async def reopen_in_tx(
    conn: asyncpg.Connection,
    match_id: int,
    result: domain.Reported,
    now: datetime,
    *,
    house_shards: int,
    provider_event_id: str | None = None,
    sequence: int | None = None,
    voided_reason: str | None = None,
    void: bool = False,
) -> int:
    """Reopen the match under ``result`` in the caller's transaction (which holds
    the match's result lock, repo.lock_match_results). Refuses, changing
    nothing: 404 match_not_found; domain.BetRefused not_settled (no result yet,
    void aside), same_result, already_void, stale_correction (``sequence`` not
    after the correction the match has). Returns the new settlement generation."""
    match = await repo.lock_match_for_resettle(conn, match_id)
    if match is None:
        raise DomainError("match_not_found", f"no match {match_id}")
    domain.check_resettle(_current(match), result, match["result_sequence"], sequence, void=void)
    timeout = REOPEN_STATEMENT_TIMEOUT_S
    settled = await repo.lock_bets_of_match(conn, match_id, timeout)
    settled = [b for b in settled if b["status"] != "PENDING"]
    # What each settled bet was paid under its generation (nothing when it lost,
    # or its payout is still deferred to the wallet's consumer).
    reversed_total = await wallet.reverse_paid_in_tx(
        conn,
        [(b["account_id"], wallet.bet_reference(b["id"], b["generation"])) for b in settled],
        match_id,
        house_shards,
        now,
        timeout,
    )
    generation = await repo.reopen_match(
        conn,
        match_id,
        [b["id"] for b in settled],
        result,
        provider_event_id,
        sequence,
        voided_reason,
        now,
        timeout,
    )
    await _announce(
        conn, match, generation, result, len(settled), reversed_total, voided_reason, void, now
    )
    return generation


async def _announce(
    conn: asyncpg.Connection,
    match: asyncpg.Record,
    generation: int,
    result: domain.Reported,
    reopened: int,
    reversed_total: int,
    voided_reason: str | None,
    void: bool,
    now: datetime,
) -> None:
    """The reopen's event (through the outbox, in its transaction) and log line."""
    await emit(
        conn,
        events.MATCH_VOIDED if void else events.MATCH_RESETTLED,
        events.match_key(match["external_id"]),
        events.resettled_payload(
            int(match["id"]),
            match["external_id"],
            generation,
            _current(match),
            result,
            reopened=reopened,
            reversed_total=reversed_total,
            reason=voided_reason,
        ),
        now,
    )
    log.warning(
        "match_voided" if void else "match_resettled",
        match_id=match["id"],
        generation=generation,
        before=_current(match),
        after=result,
        reopened_bets=reopened,
        reversed=reversed_total,
    )
