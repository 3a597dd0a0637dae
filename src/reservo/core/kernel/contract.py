"""The event contract: what each module declares about the events it emits, and
the registry the transports and the AsyncAPI document read it from.

Names (one style, checked here):
- an event's name is ``<module>.<aggregate>.<event>.v<major>`` (lowercase, words
  joined by ``-``), e.g. ``appointments.appointment.booked.v1``; the outbox, the
  subscriptions and the handlers know an event by it;
- its CloudEvents ``type`` is that name under ``dev.reservo.``;
- its Kafka topic is its aggregate's stream, ``<module>.<aggregate>.v<major>``:
  every event of one aggregate goes to one topic under one key (the aggregate's),
  so one partition holds an aggregate's whole life in order. A topic per event
  would order nothing across an aggregate's events.

An event not in the registry (tests, tools) keeps its name as topic and type."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TYPE_PREFIX = "dev.reservo."
_WORD = r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*"
NAME_STYLE = re.compile(rf"^{_WORD}\.{_WORD}\.{_WORD}\.v[1-9][0-9]*$")
STREAM_STYLE = re.compile(rf"^{_WORD}\.{_WORD}\.v[1-9][0-9]*$")


@dataclass(frozen=True)
class EventSpec:
    """One event a module emits (or takes in and republishes)."""

    name: str
    stream: str
    summary: str
    # What the record key is, as a pattern (``appointment:{lineageId}``) and why.
    key: str
    key_doc: str
    # JSON Schema (draft 2020-12) of the payload, and one valid payload.
    schema: dict[str, Any]
    example: dict[str, Any]
    # Names the event had before (outbox rows, dead letters and records of the
    # release before still carry them): read as this event for one release.
    formerly: tuple[str, ...] = ()

    @property
    def type(self) -> str:
        return TYPE_PREFIX + self.name

    def check(self) -> None:
        """Refuse a name or stream off the style (at start-up, not on a consumer)."""
        if not NAME_STYLE.match(self.name):
            raise ValueError(f"event name {self.name!r} is not <module>.<aggregate>.<event>.vN")
        if not STREAM_STYLE.match(self.stream):
            raise ValueError(f"stream {self.stream!r} of {self.name} is not <module>.<aggr>.vN")
        if not self.name.startswith(self.stream.rsplit(".", 1)[0] + "."):
            raise ValueError(f"event {self.name} is not of its stream {self.stream}")


@dataclass
class EventRegistry:
    """Every declared event, filled by the composition root from the modules."""

    _specs: dict[str, EventSpec] = field(default_factory=dict)
    _renamed: dict[str, str] = field(default_factory=dict)

    def add(self, specs: Iterable[EventSpec]) -> None:
        for spec in specs:
            spec.check()
            if spec.name in self._specs or spec.name in self._renamed:
                raise RuntimeError(f"event {spec.name!r} is declared twice")
            self._specs[spec.name] = spec
            for old in spec.formerly:
                self._renamed[old] = spec.name

    def specs(self) -> list[EventSpec]:
        return sorted(self._specs.values(), key=lambda s: s.name)

    def current(self, name: str) -> str:
        """The event's name today (an old name is read as its successor)."""
        return self._renamed.get(name, name)

    def stream(self, name: str) -> str:
        """The Kafka topic an event goes to (an undeclared one: its own name)."""
        spec = self._specs.get(self.current(name))
        return name if spec is None else spec.stream

    def streams(self, names: Iterable[str]) -> list[str]:
        return sorted({self.stream(n) for n in names})

    def former_topics(self, names: Iterable[str]) -> list[str]:
        """The topics the release before published ``names`` on (one topic per
        event, under its old name): consumers drain them for one release."""
        wanted = {self.current(n) for n in names}
        return sorted(old for old, new in self._renamed.items() if new in wanted)

    def type_of(self, name: str) -> str:
        return TYPE_PREFIX + self.current(name)

    def name_of(self, ce_type: str) -> str:
        """The event name a CloudEvents ``type`` stands for (the release before
        used the bare topic name as type)."""
        return self.current(ce_type.removeprefix(TYPE_PREFIX))


def asyncapi(registry: EventRegistry, version: str) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of every declared event: one channel per stream
    (topic), one message per event, its payload schema, key and an example, and
    the CloudEvents binary-mode headers each record carries."""
    specs = registry.specs()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for stream in sorted({s.stream for s in specs}):
        of_stream = [s for s in specs if s.stream == stream]
        channel_id = _ident(stream)
        channels[channel_id] = {
            "address": stream,
            "title": stream,
            "description": (
                "Every event of one aggregate, keyed by that aggregate: one partition "
                "holds its whole life in order."
            ),
            "messages": {
                _ident(s.name): {"$ref": f"#/components/messages/{_ident(s.name)}"}
                for s in of_stream
            },
            "bindings": {"kafka": {"bindingVersion": "0.5.0"}},
        }
        operations["receive" + channel_id[0].upper() + channel_id[1:]] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "summary": f"Subscribe to {stream}.",
            "messages": [
                {"$ref": f"#/channels/{channel_id}/messages/{_ident(s.name)}"} for s in of_stream
            ],
        }
        for s in of_stream:
            messages[_ident(s.name)] = _message(s)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "reservo events",
            "version": version,
            "description": (
                "Events on the CloudEvents Kafka protocol binding, binary mode: the "
                "attributes in ce_* headers, content-type application/json, the "
                "payload as the record value, the record key (also in ce_partitionkey) "
                "the aggregate's."
            ),
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "messageTraits": {"cloudEvent": {"headers": _HEADERS}},
        },
    }


def _message(s: EventSpec) -> dict[str, Any]:
    return {
        "name": s.name,
        "title": s.name,
        "summary": s.summary,
        "contentType": "application/json",
        "traits": [{"$ref": "#/components/messageTraits/cloudEvent"}],
        "payload": s.schema,
        "bindings": {
            "kafka": {
                "bindingVersion": "0.5.0",
                "key": {"type": "string", "description": f"{s.key}: {s.key_doc}"},
            }
        },
        "examples": [
            {
                "name": "example",
                "headers": {
                    "ce_specversion": "1.0",
                    "ce_id": "3f2b6e0e-8b8e-4c41-9d4f-0c8c1c6f6a10",
                    "ce_source": "/reservo",
                    "ce_type": s.type,
                    "ce_time": "2030-01-06T09:00:00Z",
                    "ce_partitionkey": _example_key(s.key, s.example),
                    "content-type": "application/json",
                },
                "payload": s.example,
            }
        ],
        "x-cloudevents-type": s.type,
        "x-formerly": list(s.formerly),
    }


_HEADERS: dict[str, Any] = {
    "type": "object",
    "required": [
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
        "ce_partitionkey",
        "content-type",
    ],
    "properties": {
        "ce_specversion": {"type": "string", "const": "1.0"},
        "ce_id": {"type": "string", "description": "Unique per event; redeliveries repeat it."},
        "ce_source": {"type": "string", "description": "The deployment (RESERVO_KAFKA_SOURCE)."},
        "ce_type": {"type": "string", "description": "dev.reservo.<event name>"},
        "ce_time": {"type": "string", "format": "date-time"},
        "ce_subject": {"type": "string", "description": "The aggregate (same as the key)."},
        "ce_partitionkey": {"type": "string", "description": "The record key."},
        "content-type": {"type": "string", "const": "application/json"},
    },
}


def _ident(name: str) -> str:
    """A component id of a dotted, hyphenated name (``appointmentsAppointmentBookedV1``)."""
    words = re.split(r"[.\-_]", name)
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


def _example_key(pattern: str, example: dict[str, Any]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: str(example.get(m.group(1), m.group(1))), pattern)


def asyncapi_text(registry: EventRegistry, version: str) -> str:
    """The document as checked in (docs/asyncapi.json) and served: a stable text."""
    return json.dumps(asyncapi(registry, version), indent=2, ensure_ascii=False) + "\n"
