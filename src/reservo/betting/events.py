"""Events of the betting module."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from typing import Any

from reservo.core.kernel.contract import EventSpec
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import Event

# A match's result and its settlement, in order on one stream under one key.
STREAM = "betting.match.v1"
# The result webhook publishes this (key: match_key of the match's external id).
RESULT_TOPIC = "betting.match.result-reported.v1"
# One event per settlement chunk, one item (notification) per settled bet.
BETS_SETTLED = "betting.match.bets-settled.v1"
SETTLEMENT_CONSUMER = "betting.settlement"
# A settled match settled again: its result corrected, or voided by an admin.
MATCH_RESETTLED = "betting.match.resettled.v1"
MATCH_VOIDED = "betting.match.voided.v1"

_RESULT_NS = uuid.UUID("1b7f3f0c-7d5e-4a8e-9a51-5b0c2f0e6a11")


def match_key(external_id: str) -> str:
    """One aggregate, one key: a match's result and every chunk of its settlement."""
    return f"match:{external_id}"


def result_event_id(provider_event_id: str) -> uuid.UUID:
    """The same providerEventId always becomes the same event id, whichever path
    carried it (Kafka or the fallback table)."""
    return uuid.uuid5(_RESULT_NS, provider_event_id)


def settled_payload(match_id: int, external_id: str, rows: Iterable[Any]) -> dict[str, Any]:
    """``rows``: (id, account_id, owner_id, status, payout) per settled bet."""
    return {
        "matchId": match_id,
        "matchExternalId": external_id,
        "bets": [
            {"betId": i, "ownerId": o, "accountId": a, "status": s, "payout": p}
            for i, a, o, s, p in rows
        ],
    }


def resettled_payload(
    match_id: int,
    external_id: str,
    generation: int,
    before: tuple[str | None, int | None, int | None],
    after: tuple[str, int | None, int | None],
    *,
    reopened: int,
    reversed_total: int,
    reason: str | None,
) -> dict[str, Any]:
    def result(r: tuple[str | None, int | None, int | None]) -> dict[str, Any] | None:
        status, home, away = r
        return None if status is None else {"status": status, "homeScore": home, "awayScore": away}

    return {
        "matchId": match_id,
        "matchExternalId": external_id,
        "generation": generation,
        "previousResult": result(before),
        "result": result(after),
        "reopenedBets": reopened,
        "reversed": reversed_total,
        "reason": reason,
    }


def notifications(event: Event) -> list[Notification]:
    """One message per settled bet; each gets its own id derived from the chunk's
    event, so a redelivered chunk sends nothing twice."""
    out = []
    # uuid5(event.id, name) without rehashing the event id for each of the
    # chunk's thousands of bets, and written out without a UUID object: the
    # same ids, in a fraction of the time.
    base = hashlib.sha1(event.id.bytes, usedforsecurity=False)
    for bet in event.payload["bets"]:
        bet_id, status, payout = bet["betId"], bet["status"], bet["payout"]
        if status == "WON":
            subject, body = f"Bet #{bet_id} won", f"You won {payout}; it is in your account."
        elif status == "VOID":
            subject = f"Bet #{bet_id} void"
            body = f"Your bet was voided and {payout} refunded."
        else:
            subject, body = f"Bet #{bet_id} lost", "Better luck next time."
        digest = base.copy()
        digest.update(b"bet:%d" % bet_id)
        out.append(Notification(int(bet["ownerId"]), subject, body, _uuid5_text(digest.digest())))
    return out


def _uuid5_text(sha1: bytes) -> str:
    """The text of ``uuid.UUID(bytes=sha1[:16], version=5)``."""
    b = bytearray(sha1[:16])
    b[6] = (b[6] & 0x0F) | 0x50  # version 5
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- the contract (core/kernel/contract.py): what a subscriber may rely on ---------------

_RESULT_SCHEMA = {
    "type": ["object", "null"],
    "properties": {
        "status": {"enum": ["CANCELLED", "FINISHED"]},
        "homeScore": {"type": ["integer", "null"], "minimum": 0},
        "awayScore": {"type": ["integer", "null"], "minimum": 0},
    },
}
_RESETTLED_SCHEMA = {
    "type": "object",
    "required": ["matchId", "matchExternalId", "generation", "result", "reopenedBets", "reversed"],
    "properties": {
        "matchId": {"type": "integer", "minimum": 1},
        "matchExternalId": {"type": "string"},
        "generation": {"type": "integer", "minimum": 1, "description": "The settlement now run."},
        "previousResult": _RESULT_SCHEMA,
        "result": _RESULT_SCHEMA,
        "reopenedBets": {"type": "integer", "minimum": 0},
        "reversed": {"type": "integer", "minimum": 0, "description": "Minor units taken back."},
        "reason": {"type": ["string", "null"]},
    },
    "additionalProperties": True,
}
_RESETTLED_EXAMPLE: dict[str, Any] = {
    "matchId": 9,
    "matchExternalId": "m-2030-0107-1",
    "generation": 2,
    "previousResult": {"status": "FINISHED", "homeScore": 2, "awayScore": 1},
    "result": {"status": "FINISHED", "homeScore": 1, "awayScore": 1},
    "reopenedBets": 3,
    "reversed": 180,
    "reason": None,
}
_KEY_DOC = "the match (its external id): its result, then its settlement, in order"
CONTRACT = (
    EventSpec(
        name=RESULT_TOPIC,
        stream=STREAM,
        summary="A match's result, as the results provider reported it (webhook, or an "
        "admin by hand); the settlement consumer settles the match's bets.",
        key="match:{matchExternalId}",
        key_doc=_KEY_DOC,
        schema={
            "type": "object",
            "required": ["matchExternalId", "status", "providerEventId"],
            "properties": {
                "matchExternalId": {"type": "string"},
                "status": {"enum": ["CANCELLED", "FINISHED"]},
                "homeScore": {"type": ["integer", "null"], "minimum": 0},
                "awayScore": {"type": ["integer", "null"], "minimum": 0},
                "providerEventId": {"type": "string"},
                "correction": {
                    "type": "boolean",
                    "description": "A correction of the match's result: settled again.",
                },
                "sequence": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "The provider's order of its corrections.",
                },
            },
            "additionalProperties": True,
        },
        example={
            "matchExternalId": "m-2030-0107-1",
            "status": "FINISHED",
            "homeScore": 2,
            "awayScore": 1,
            "providerEventId": "prov-88412",
        },
        formerly=("matches.result.v1",),
    ),
    EventSpec(
        name=BETS_SETTLED,
        stream=STREAM,
        summary="A chunk of a match's bets was settled (one item per bet).",
        key="match:{matchExternalId}",
        key_doc=_KEY_DOC,
        schema={
            "type": "object",
            "required": ["matchId", "matchExternalId", "bets"],
            "properties": {
                "matchId": {"type": "integer", "minimum": 1},
                "matchExternalId": {"type": "string"},
                "bets": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["betId", "ownerId", "accountId", "status", "payout"],
                        "properties": {
                            "betId": {"type": "integer", "minimum": 1},
                            "ownerId": {"type": "integer", "minimum": 1},
                            "accountId": {"type": "integer", "minimum": 1},
                            "status": {"enum": ["LOST", "VOID", "WON"]},
                            "payout": {
                                "type": ["integer", "null"],
                                "minimum": 0,
                                "description": "Minor units.",
                            },
                        },
                    },
                },
            },
            "additionalProperties": True,
        },
        example={
            "matchId": 9,
            "matchExternalId": "m-2030-0107-1",
            "bets": [
                {"betId": 501, "ownerId": 3001, "accountId": 77, "status": "WON", "payout": 2500}
            ],
        },
        formerly=("betting.bets.settled.v1",),
    ),
    *(
        EventSpec(
            name=name,
            stream=STREAM,
            summary=summary,
            key="match:{matchExternalId}",
            key_doc=_KEY_DOC,
            schema=_RESETTLED_SCHEMA,
            example=example,
        )
        for name, summary, example in (
            (
                MATCH_RESETTLED,
                "A match's result was corrected (the provider's correction or an admin's "
                "resettle): the payouts of its settled bets were reversed and it settles "
                "again under `generation` (bets-settled events follow).",
                _RESETTLED_EXAMPLE,
            ),
            (
                MATCH_VOIDED,
                "An admin voided a match: every leg on it is void (payouts already made "
                "reversed first); it settles again under `generation`.",
                {
                    **_RESETTLED_EXAMPLE,
                    "result": {"status": "CANCELLED", "homeScore": None, "awayScore": None},
                    "reason": "match fixed",
                },
            ),
        )
    ),
)
