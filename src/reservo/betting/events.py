"""Events of the betting module."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from reservo.core.notify import Notification
from reservo.core.transport.base import Event

# The result webhook publishes here (key = the match's external id).
RESULT_TOPIC = "matches.result.v1"
# One event per settlement chunk, one item (notification) per settled bet.
BETS_SETTLED = "betting.bets.settled.v1"
SETTLEMENT_CONSUMER = "betting.settlement"

_RESULT_NS = uuid.UUID("1b7f3f0c-7d5e-4a8e-9a51-5b0c2f0e6a11")


def result_event_id(provider_event_id: str) -> uuid.UUID:
    """The same providerEventId always becomes the same event id, whichever path
    carried it (Kafka or the fallback table)."""
    return uuid.uuid5(_RESULT_NS, provider_event_id)


def settled_payload(match_id: int, rows: list[Any]) -> dict[str, Any]:
    return {
        "matchId": match_id,
        "bets": [
            {
                "betId": r["id"],
                "ownerId": r["owner_id"],
                "accountId": r["account_id"],
                "status": r["status"],
                "payout": r["payout"],
            }
            for r in rows
        ],
    }


def notifications(event: Event) -> list[Notification]:
    """One message per settled bet; each gets its own id derived from the chunk's
    event, so a redelivered chunk sends nothing twice."""
    out = []
    # uuid5(event.id, name) without rehashing the event id for each of the
    # chunk's thousands of bets: the same ids, in about half the time.
    base = hashlib.sha1(event.id.bytes, usedforsecurity=False)
    for bet in event.payload["bets"]:
        status, payout = bet["status"], bet["payout"]
        if status == "WON":
            subject, body = f"Bet #{bet['betId']} won", f"You won {payout}; it is in your account."
        elif status == "VOID":
            subject = f"Bet #{bet['betId']} void"
            body = f"Your bet was voided and {payout} refunded."
        else:
            subject, body = f"Bet #{bet['betId']} lost", "Better luck next time."
        digest = base.copy()
        digest.update(f"bet:{bet['betId']}".encode())
        message_id = uuid.UUID(bytes=digest.digest()[:16], version=5)
        out.append(Notification(int(bet["ownerId"]), subject, body, str(message_id)))
    return out
