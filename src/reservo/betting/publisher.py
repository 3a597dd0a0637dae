"""Where the result webhook and the resender hand a result: Kafka, through a
transport, acknowledged or raising."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from reservo.core.messaging.transport.base import Event, Transport


class Publisher(Protocol):
    """Returns once the event is held durably (acknowledged); raises otherwise."""

    async def publish(self, event: Event) -> None: ...


@dataclass
class TransportPublisher:
    """Publishes one event through a transport (Kafka); raises unless acknowledged."""

    transport: Transport
    timeout_s: float = 2.0

    async def publish(self, event: Event) -> None:
        results = await asyncio.wait_for(self.transport.deliver([event]), self.timeout_s)
        if results[0] is not None:
            raise results[0]
