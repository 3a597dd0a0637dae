"""One pgqueuer worker process for peer.py: a QueueManager on its own
connection, with a no-op entrypoint recording (execute_after, lateness ms) as
reservo's does, written as JSON to OUT when it stops (SIGTERM).

    python bench/scheduler/pgq_worker.py DB_URL OUT BATCH ENTRYPOINT

A script of its own, started as a plain process: a multiprocessing child would
import peer.py, and with it reservo, before its first job, and pgqueuer's
workers would pay reservo's start-up (about 0.2 s each) in the drain's time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from datetime import timedelta

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries


def main(db_url: str, out: str, batch: int, entrypoint: str) -> None:
    samples: list[tuple[float, float]] = []

    async def run() -> None:
        conn = await asyncpg.connect(db_url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(entrypoint)
        async def noop(job: Job) -> None:
            at = job.execute_after.timestamp()
            samples.append((at, (time.time() - at) * 1000))

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        try:
            await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))
        finally:
            await conn.close()

    logging.disable(logging.WARNING)
    # As pgqueuer's own CLI runs its workers: on uvloop where it is installed.
    uvloop.run(run())
    with open(out, "w") as f:
        json.dump(samples, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
