"""The CloudEvents 1.0 envelope of an event on the wire (Kafka records) and at
rest (dead letters), so a parked event reads the same whichever transport parked it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import orjson

from reservo.core.transport.base import Event


def to_cloudevent(event: Event, source: str) -> bytes:
    """CloudEvents 1.0, structured JSON mode."""
    envelope: dict[str, Any] = {
        "specversion": "1.0",
        "id": str(event.id),
        "source": source,
        "type": event.topic,
        "time": event.created_at,  # orjson writes RFC 3339
        "datacontenttype": "application/json",
        "data": event.payload,
    }
    if event.key is not None:
        envelope["subject"] = event.key
    return orjson.dumps(envelope)


def from_cloudevent(value: bytes | None) -> Event:
    """The Event a handler sees; ValueError when the record is not a valid envelope."""
    if value is None:
        raise ValueError("empty record")
    try:
        doc = orjson.loads(value)
        if not isinstance(doc, dict) or doc.get("specversion") != "1.0":
            raise ValueError("not a CloudEvents 1.0 envelope")
        data = doc["data"]
        if not isinstance(data, dict):
            raise ValueError("data must be a JSON object")
        subject = doc.get("subject")
        return Event(
            id=uuid.UUID(doc["id"]),
            topic=str(doc["type"]),
            key=None if subject is None else str(subject),
            payload=data,
            created_at=datetime.fromisoformat(doc["time"]),
        )
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"invalid envelope: {exc!r}") from exc
