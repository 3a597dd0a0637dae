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
    """``rows``: settle_bets' (id, account_id, owner_id, status, payout), read by
    position (by name cost a third more at 5,000 rows a chunk)."""
    return {
        "matchId": match_id,
        "bets": [
            {"betId": i, "ownerId": o, "accountId": a, "status": s, "payout": p}
            for i, a, o, s, p in rows
        ],
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
