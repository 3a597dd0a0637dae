"""The settled-bet notifications a settlement chunk's event renders."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from reservo.betting import events
from reservo.core.messaging.transport.base import Event


def test_each_bet_gets_the_uuid5_message_id_of_its_event() -> None:
    # The ids must not change from one release to the next: a chunk redelivered
    # across a deploy is then still recognised as sent, message by message.
    # settle_bets' rows: (id, account_id, owner_id, status, payout)
    rows = [(7, 700, 70, "WON", 185), (8, 800, 80, "LOST", 0), (9, 900, 90, "VOID", 100)]
    event = Event(
        uuid.uuid4(),
        events.BETS_SETTLED,
        "match:1:0",
        events.settled_payload(1, "m-1", rows),
        datetime.now(UTC),
    )
    sent = events.notifications(event)
    assert [n.event_id for n in sent] == [str(uuid.uuid5(event.id, f"bet:{r[0]}")) for r in rows]
    assert [n.recipient_user_id for n in sent] == [70, 80, 90]
    assert [n.subject for n in sent] == ["Bet #7 won", "Bet #8 lost", "Bet #9 void"]


def test_message_ids_equal_uuid5_over_a_chunk_of_bet_ids() -> None:
    # The hand-written uuid5 text (version and variant bits) against the stdlib's,
    # over ids of every length a bigint sequence reaches.
    ids = [*range(1, 2_000), 10**9 + 7, 2**62, 2**63 - 1]
    event = Event(
        uuid.uuid4(),
        events.BETS_SETTLED,
        "match:1:0",
        events.settled_payload(1, "m-1", [(i, 1, 2, "LOST", 0) for i in ids]),
        datetime.now(UTC),
    )
    assert [n.event_id for n in events.notifications(event)] == [
        str(uuid.uuid5(event.id, f"bet:{i}")) for i in ids
    ]
