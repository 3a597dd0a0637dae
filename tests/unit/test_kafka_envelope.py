"""CloudEvents 1.0 envelope of the Kafka transport (no I/O)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from reservo.core.messaging.transport.base import Event
from reservo.core.messaging.transport.envelope import (
    from_cloudevent,
    from_record,
    to_cloudevent,
    to_record,
)


def test_envelope_round_trip_keeps_what_handlers_see() -> None:
    event = Event(
        uuid.uuid4(),
        "appointments.booked.v1",
        "42",
        {"slotId": 7, "note": "é"},
        datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )
    raw = to_cloudevent(event, "/reservo")
    doc = orjson.loads(raw)
    assert doc == {
        "specversion": "1.0",
        "id": str(event.id),
        "source": "/reservo",
        "type": "dev.reservo.appointments.booked.v1",
        "subject": "42",
        "partitionkey": "42",
        "time": "2026-01-02T03:04:05.678000+00:00",
        "datacontenttype": "application/json",
        "data": {"slotId": 7, "note": "é"},
    }
    assert from_cloudevent(raw) == event


def test_event_without_key_has_no_subject() -> None:
    event = Event(uuid.uuid4(), "t.v1", None, {}, datetime.now(UTC))
    raw = to_cloudevent(event, "/x")
    assert "subject" not in orjson.loads(raw)
    assert from_cloudevent(raw).key is None


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"not json",
        b"[]",
        b'{"specversion": "0.3"}',
        b'{"specversion": "1.0", "id": "nope", "type": "t", "time": "2026-01-01T00:00:00Z",'
        b' "data": {}}',
        b'{"specversion": "1.0", "id": "' + str(uuid.uuid4()).encode() + b'", "type": "t",'
        b' "time": "2026-01-01T00:00:00Z", "data": [1]}',
    ],
)
def test_malformed_records_are_value_errors(raw: bytes | None) -> None:
    with pytest.raises(ValueError):
        from_cloudevent(raw)


def test_binary_record_round_trip() -> None:
    event = Event(uuid.uuid4(), "a.b.c.v1", "k:1", {"x": 1}, datetime.now(UTC))
    headers, value = to_record(event, "/reservo", "dev.reservo.a.b.c.v1")
    h = dict(headers)
    assert h["ce_type"] == b"dev.reservo.a.b.c.v1" and h["ce_partitionkey"] == b"k:1"
    assert h["content-type"] == b"application/json" and orjson.loads(value) == {"x": 1}
    assert from_record(headers, value) == event


def test_structured_records_of_the_release_before_are_still_read() -> None:
    event = Event(uuid.uuid4(), "wallet.payout.requested.v1", "m:1:0", {}, datetime.now(UTC))
    old = orjson.dumps(
        {
            "specversion": "1.0",
            "id": str(event.id),
            "source": "/reservo",
            "type": event.topic,
            "time": event.created_at,
            "subject": event.key,
            "data": {},
        }
    )
    assert from_record([], old) == event
