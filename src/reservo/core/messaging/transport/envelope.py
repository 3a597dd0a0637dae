"""The CloudEvents 1.0 forms of an event.

On Kafka: the Kafka protocol binding's BINARY mode (``to_record``): the
attributes in ``ce_*`` headers, ``content-type: application/json``, the payload
as the record value and the aggregate's key as the record key and the
``partitionkey`` extension. Any Kafka client reads the payload as plain JSON;
a CloudEvents SDK reads the headers.

At rest (dead letters): STRUCTURED JSON (``to_cloudevent``), one document with
the attributes and the data, so a parked event reads the same whichever
transport parked it (a Kafka record's headers are not kept).

Records of the release before (structured mode, no headers, ``type`` = the bare
topic name) are still read (``from_record``), for the one release their topics
are drained."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from reservo.core.kernel.contract import TYPE_PREFIX
from reservo.core.messaging.transport.base import Event

SPECVERSION = "1.0"
JSON = "application/json"
Headers = Sequence[tuple[str, bytes]]


def to_record(event: Event, source: str, ce_type: str) -> tuple[list[tuple[str, bytes]], bytes]:
    """(headers, value) of the event's Kafka record, binary content mode."""
    headers = [
        ("ce_specversion", SPECVERSION.encode()),
        ("ce_id", str(event.id).encode()),
        ("ce_source", source.encode()),
        ("ce_type", ce_type.encode()),
        ("ce_time", event.created_at.isoformat().encode()),
        ("content-type", JSON.encode()),
    ]
    if event.key is not None:
        key = event.key.encode()
        headers += [("ce_subject", key), ("ce_partitionkey", key)]
    return headers, orjson.dumps(event.payload)


def from_record(headers: Headers | None, value: bytes | None) -> Event:
    """The Event a handler sees, from a binary-mode record (or a structured one
    of the release before); ValueError when it is neither. Its ``topic`` is the
    event's name as the type carries it (the caller maps an old name)."""
    attrs = {k: v for k, v in headers or () if k.startswith("ce_") or k == "content-type"}
    if "ce_specversion" not in attrs:
        return from_cloudevent(value)
    try:
        if attrs["ce_specversion"] != SPECVERSION.encode():
            raise ValueError("not a CloudEvents 1.0 record")
        data = orjson.loads(value or b"")
        if not isinstance(data, dict):
            raise ValueError("data must be a JSON object")
        key = attrs.get("ce_partitionkey")
        return Event(
            id=uuid.UUID(attrs["ce_id"].decode()),
            topic=attrs["ce_type"].decode().removeprefix(TYPE_PREFIX),
            key=None if key is None else key.decode(),
            payload=data,
            created_at=datetime.fromisoformat(attrs["ce_time"].decode()),
        )
    except (KeyError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"invalid record: {exc!r}") from exc


def to_cloudevent(event: Event, source: str) -> bytes:
    """CloudEvents 1.0, structured JSON mode (dead letters)."""
    envelope: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": str(event.id),
        "source": source,
        "type": TYPE_PREFIX + event.topic,
        "time": event.created_at,  # orjson writes RFC 3339
        "datacontenttype": JSON,
        "data": event.payload,
    }
    if event.key is not None:
        envelope["subject"] = event.key
        envelope["partitionkey"] = event.key
    return orjson.dumps(envelope)


def from_cloudevent(value: bytes | None) -> Event:
    """The Event of a structured envelope; ValueError when it is not a valid one."""
    if value is None:
        raise ValueError("empty record")
    try:
        doc = orjson.loads(value)
        if not isinstance(doc, dict) or doc.get("specversion") != SPECVERSION:
            raise ValueError("not a CloudEvents 1.0 envelope")
        data = doc["data"]
        if not isinstance(data, dict):
            raise ValueError("data must be a JSON object")
        key = doc.get("partitionkey", doc.get("subject"))
        return Event(
            id=uuid.UUID(doc["id"]),
            topic=str(doc["type"]).removeprefix(TYPE_PREFIX),
            key=None if key is None else str(key),
            payload=data,
            created_at=datetime.fromisoformat(doc["time"]),
        )
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"invalid envelope: {exc!r}") from exc
