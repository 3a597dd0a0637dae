"""A consumer process that dies (SIGKILL) right after its handler committed the
effect of one chosen event, i.e. before the runner could commit the offset.

python -m tests.integration.kafka.crash_consumer BOOTSTRAP DB_URL TOPIC CONSUMER EVENT_ID
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid

from reservo.core.db.database import Database
from reservo.core.kernel.clock import SystemClock
from reservo.core.messaging.transport.base import Event
from tests.helpers.kafka import effect_handler, runner


async def main(bootstrap: str, db_url: str, topic: str, consumer: str, victim: str) -> None:
    db = Database(db_url, min_size=1, max_size=5)
    apply = effect_handler(db, consumer)

    async def handle(event: Event) -> None:
        await apply(event)  # the effect's transaction has committed here
        if event.id == uuid.UUID(victim):
            os.kill(os.getpid(), signal.SIGKILL)

    await runner(bootstrap, consumer, {topic: handle}, db, SystemClock()).run(asyncio.Event())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
