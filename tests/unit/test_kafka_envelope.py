"""CloudEvents 1.0 envelope of the Kafka transport (no I/O)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from reservo.core.transport.base import Event
from reservo.core.transport.envelope import from_cloudevent, to_cloudevent


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
        "type": "appointments.booked.v1",
        "subject": "42",
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
