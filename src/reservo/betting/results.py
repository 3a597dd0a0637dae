"""Where an accepted match result goes. Never nowhere: the webhook's 202 promises
that the result is applied to its match, kept until its match exists, or parked
as a dead letter for an operator.

- A result for a match no one has created yet is kept (betting_pending_result) and
  applied in the transaction that creates the match.
- A result for a match that has one already is a no-op when it says the same
  (SAME_RESULT), else it is parked as a dead letter of the settlement consumer:
  the match stays as it settled. Unless it is a correction (``"correction":
  true``): then the match is reopened and settled again under it
  (betting.resettlement), or, when its ``sequence`` is not after the match's
  last correction (stale_correction), parked like a conflicting result.
- A final result for a match that has not started, found when its match is
  created, is parked too (the intake refuses it outright when the match exists).

The settlement consumer and the match's creation both call this under the match's
result lock (repo.lock_match_results), so a result is never kept for a match whose
creation already took the kept ones."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import structlog

from reservo.betting import domain, events, repo, resettlement
from reservo.betting.schemas import ResultIn
from reservo.core.messaging.deadletters import park_once_in_tx
from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.transport.base import Event

log = structlog.get_logger(__name__)

# Outcomes recorded in the settlement inbox (betting_result_inbox) per providerEventId.
APPLIED = "APPLIED"  # the match's result
AWAITING_MATCH = "AWAITING_MATCH"  # kept until the match is created
SAME_RESULT = "SAME_RESULT"  # the match's result, reported again by another event
PARKED = "PARKED"  # a dead letter for an operator
# After these, a redelivery of the event changes nothing. Any other outcome is
# decided again, its result never having been applied: AWAITING_MATCH is kept
# again (a no-op while its row waits) or placed once its match exists, PARKED is
# parked once (park_once_in_tx), and the UNKNOWN_MATCH / DUPLICATE_MATCH of
# results dropped before migration 0052 are placed again.
DONE = frozenset({APPLIED, SAME_RESULT})


def reported(result: ResultIn) -> domain.Reported:
    return result.status, result.home_score, result.away_score


def _match_result(match: asyncpg.Record) -> domain.Reported:
    return match["result_status"], match["home_score"], match["away_score"]


def result_event(result: ResultIn, created_at: datetime) -> Event:
    """The result as the event the settlement consumer handles (the id Kafka and
    the fallback path give it): what a dead letter parks and a replay delivers."""
    return Event(
        events.result_event_id(result.provider_event_id),
        events.RESULT_TOPIC,
        events.match_key(result.match_external_id),
        result.wire(),
        created_at,
    )


async def keep_until_created(conn: asyncpg.Connection, result: ResultIn, now: datetime) -> None:
    """Keep a result whose match does not exist yet, until it is created."""
    await repo.pending_insert(
        conn, result.provider_event_id, result.match_external_id, result.wire(), now
    )
    await repo.record_outcome(
        conn, result.provider_event_id, result.match_external_id, AWAITING_MATCH, now
    )
    log.info(
        "match_result_awaiting_match",
        provider_event_id=result.provider_event_id,
        match_external_id=result.match_external_id,
    )


async def place(
    conn: asyncpg.Connection,
    result: ResultIn,
    now: datetime,
    created_at: datetime,
    house_shards: int = 1,
) -> int | None:
    """Apply ``result`` to its existing match, or find it the same as the match's,
    or park it; records the outcome. Returns the match to settle (also one still
    settling when the result is the same, so a redelivery resumes it)."""
    external_id = result.match_external_id
    match = await repo.match_by_external_id(conn, external_id)
    assert match is not None  # the callers hold the lock and saw the match
    refusal = _not_started(result, match, now)
    settle: int | None = None
    if refusal is None:
        settle = await repo.record_result(
            conn,
            external_id,
            result.status,
            result.home_score,
            result.away_score,
            result.provider_event_id,
            now,
            result.sequence if result.correction else None,
        )
        outcome = APPLIED
        if settle is None and result.correction:
            settle, refusal = await _correct(conn, result, match, now, house_shards)
            if settle is None and refusal is None:
                outcome = SAME_RESULT
                settle = match["id"] if match["settlement_status"] == "SETTLING" else None
        elif settle is None:
            if domain.same_result(_match_result(match), reported(result)):
                outcome = SAME_RESULT
                settle = match["id"] if match["settlement_status"] == "SETTLING" else None
            else:
                refusal = (
                    f"match {external_id} already has the result {_match_result(match)} "
                    f"(provider event {match['result_event_id']}); this one says "
                    f"{reported(result)}: left for an operator, the match stays as it is"
                )
    if refusal is not None:
        await park_once_in_tx(
            conn,
            events.SETTLEMENT_CONSUMER,
            result_event(result, created_at),
            Rejected(refusal),
            now,
        )
        outcome = PARKED
        log.warning(
            "match_result_parked",
            provider_event_id=result.provider_event_id,
            match_external_id=external_id,
            reason=refusal,
        )
    await repo.record_outcome(conn, result.provider_event_id, external_id, outcome, now)
    return None if settle is None else int(settle)


async def _correct(
    conn: asyncpg.Connection,
    result: ResultIn,
    match: asyncpg.Record,
    now: datetime,
    house_shards: int,
) -> tuple[int | None, str | None]:
    """A correction for a match with a result: reopened under it (the match to
    settle again), or the same result (neither), or refused: a stale correction
    is parked like a conflicting result (the webhook answered 202 already, and
    the provider never resends; an operator sees it in the dead letters)."""
    try:
        await resettlement.reopen_in_tx(
            conn,
            int(match["id"]),
            reported(result),
            now,
            house_shards=house_shards,
            provider_event_id=result.provider_event_id,
            sequence=result.sequence,
        )
    except domain.BetRefused as exc:
        if exc.code == "same_result":
            return None, None
        return None, f"{exc.code}: {exc.detail} (match {result.match_external_id})"
    return int(match["id"]), None


def _not_started(result: ResultIn, match: asyncpg.Record, now: datetime) -> str | None:
    try:
        domain.check_result(result.status, match["starts_at"], now)
    except domain.BetRefused as exc:
        return exc.detail
    return None


async def apply_pending(conn: asyncpg.Connection, external_id: str, now: datetime) -> int:
    """In the transaction that creates the match: place the results kept for it,
    oldest first (the first applicable one is its result, the others are the same
    or parked). The new match has no bet, so a result settles it at once: no bet
    is ever taken on a match whose result is known. Returns how many were kept."""
    kept = await repo.pending_take(conn, external_id)
    for row in kept:
        settle = await place(conn, ResultIn.model_validate(row["payload"]), now, row["received_at"])
        if settle is not None:
            await repo.finish_settlement(conn, settle, now)
    return len(kept)
