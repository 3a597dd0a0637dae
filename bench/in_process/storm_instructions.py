"""The storm's attempt in instructions: run under callgrind, it zeroes the
counters after a warm-up and dumps them after ``attempts`` attempts, so the
dump holds the attempts alone (instructions move neither with load nor with
the machine's speed: the figure to compare two trees by on a noisy machine).
The attempt is ``run.py``'s storm path: 64 at once at a full slot, each with a
token the process has not seen.

It does not stand for the storm over sockets (it put this tree at 0.66 of
0.3.0's instructions where the served storm's refusal is 1.06-1.09,
docs/BENCHMARKS.md): compare two trees' storms with ``booking_storm/run.py
--callgrind``; this counts the in-process path alone.

    PYTHONPATH=<tree>/src valgrind --tool=callgrind --callgrind-out-file=cg.out \\
        python bench/in_process/storm_instructions.py 3200
    grep '^summary:' cg.out.1     # divided by 3,200
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import uvloop
from run import benchlib, full_slot, reservo_app, storm_caller

WAVE, WARMUP_CALLS = 64, 10


def _callgrind(command: str) -> None:
    subprocess.run(["callgrind_control", command, str(os.getpid())], capture_output=True)


async def main(attempts: int) -> None:
    await benchlib.ensure_dataset(2000, 14, 40, False)
    app, stop = await reservo_app(True)
    try:
        slot_id = await full_slot(app)
        call = storm_caller(app, slot_id, WAVE, attempts + (WARMUP_CALLS + 1) * WAVE)
        for _ in range(WARMUP_CALLS):
            await call()
        _callgrind("-z")
        for _ in range(attempts // WAVE):
            await call()
        _callgrind("-d")
    finally:
        await stop()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3200))
