"""The settled-bet notifications a settlement chunk's event renders."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from reservo.betting import events
from reservo.core.transport.base import Event


def test_each_bet_gets_the_uuid5_message_id_of_its_event() -> None:
    # The ids must not change from one release to the next: a chunk redelivered
    # across a deploy is then still recognised as sent, message by message.
    rows = [
        {"id": 7, "owner_id": 70, "account_id": 700, "status": "WON", "payout": 185},
        {"id": 8, "owner_id": 80, "account_id": 800, "status": "LOST", "payout": 0},
        {"id": 9, "owner_id": 90, "account_id": 900, "status": "VOID", "payout": 100},
    ]
    event = Event(
        uuid.uuid4(),
        events.BETS_SETTLED,
        "match:1:0",
        events.settled_payload(1, rows),
        datetime.now(UTC),
    )
    sent = events.notifications(event)
    assert [n.event_id for n in sent] == [str(uuid.uuid5(event.id, f"bet:{r['id']}")) for r in rows]
    assert [n.recipient_user_id for n in sent] == [70, 80, 90]
    assert [n.subject for n in sent] == ["Bet #7 won", "Bet #8 lost", "Bet #9 void"]
