"""Lateness of `http` jobs posted in a burst, as a new user meets it (issue 39).

Starts `reservo up` from scratch as a subprocess (embedded PostgreSQL and Redis
in a fresh data directory, the API and every worker in one process), with
``RESERVO_JOBS_HTTP_ALLOW=127.0.0.1`` so its `http` jobs may call a plain
loopback listener (HTTP/1.1, ``connection: close``) that runs in a process of
its own and notes the moment each job's first call arrives (its
``Idempotency-Key`` is the job's id).

``--clients`` concurrent clients post ``--jobs`` jobs through ``POST /api/jobs``
at ``--rate`` a second in all, due evenly over ``--spread-s`` seconds starting
``--lead-s`` seconds after the first post. Then it prints the lateness of the
first calls (the call's arrival minus ``runAt``, or minus the job's acceptance
when the 201 came after its ``runAt``): p50, p99 and max, and checks that every
job called back exactly once and none before its ``runAt``.

    PYTHONPATH=src:. .venv/bin/python bench/scheduler/http_burst.py --runs 3

Extra settings for `reservo up` go through the environment as usual
(``RESERVO_SCHEDULER_FIRE_AHEAD_S=0 python bench/scheduler/http_burst.py``).
Exits 1 when a check fails or ``--max-p99-ms`` is exceeded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import psutil

from reservo.core.http.auth import mint_token

BIN = Path(sys.executable).parent
SECRET = "http-burst-secret-not-for-production-0123456789"
# Every secret `reservo up` refuses to start without, each its own.
SECRETS_ENV = {
    "RESERVO_JWT_SECRET": SECRET,
    "RESERVO_PAYMENTS_WEBHOOK_SECRET": f"payments-{SECRET}",
    "RESERVO_RESULTS_WEBHOOK_SECRET": f"results-{SECRET}",
}
# Variables that would point `reservo up` at servers of their own: unset, so it
# starts its embedded ones as a fresh clone does.
OWN_SERVERS = ("RESERVO_DATABASE_URL", "RESERVO_REDIS_URL", "RESERVO_KAFKA_BOOTSTRAP")
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the listener (a process of its own) ------------------------------------------


def _listen(port: int, ready: Connection, done: Connection) -> None:
    """Notes each call's arrival (wall clock, seconds) by Idempotency-Key until
    ``done`` asks for them."""
    arrivals: dict[str, list[float]] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            at = time.time()
            length = 0
            key = ""
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"idempotency-key":
                    key = value.strip().decode()
                elif name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            arrivals.setdefault(key, []).append(at)
            writer.write(ANSWER)
            await writer.drain()
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=1024)
        ready.send(True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, done.recv)
        done.send(arrivals)
        server.close()

    asyncio.run(main())


# --- reservo up ---------------------------------------------------------------


@contextlib.contextmanager
def reservo_up(port: int) -> Iterator[Path]:
    data_dir = Path(tempfile.mkdtemp(prefix="reservo-http-burst-"))
    env = {k: v for k, v in os.environ.items() if k not in OWN_SERVERS}
    env.update(SECRETS_ENV)
    env.setdefault("RESERVO_LOG_LEVEL", "WARNING")
    env["RESERVO_DATA_DIR"] = str(data_dir)
    env["RESERVO_JOBS_HTTP_ALLOW"] = "127.0.0.1"
    log = (data_dir / "up.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "reservo"), "up", "--port", str(port)],
        env=env,
        cwd=data_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                tail = (data_dir / "up.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"reservo up exited:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"reservo up not ready; see {data_dir / 'up.log'}")
            time.sleep(0.3)
        yield data_dir
    finally:
        warnings = Counter(
            event
            for line in (data_dir / "up.log").read_text(errors="replace").splitlines()
            if (event := _event(line))
        )
        if warnings:
            print(f"  reservo up logged: {dict(warnings.most_common(8))}", flush=True)
        with contextlib.suppress(psutil.Error):
            cpu = psutil.Process(proc.pid).cpu_times()
            print(f"  reservo up used {cpu.user + cpu.system:.1f} s of CPU", flush=True)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _event(line: str) -> str | None:
    with contextlib.suppress(ValueError, AttributeError):
        fields = json.loads(line)
        return f"{fields.get('level')}:{fields.get('event')}"
    return None


# --- the load -----------------------------------------------------------------


@dataclass
class Posted:
    job_id: str
    run_at: float  # wall clock, seconds
    accepted: float  # when its 201 arrived


async def post_all(
    base: str, token: str, listener: str, jobs: int, clients: int, rate: float,
    lead_s: float, spread_s: float,
) -> tuple[list[Posted], Counter[int]]:  # fmt: skip
    t0 = time.time() + 0.5
    posted: list[Posted] = []
    refused: Counter[int] = Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)
    headers = {"authorization": f"Bearer {token}"}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                # Paced: job i leaves at t0 + i / rate, whichever client takes it.
                await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
                run_at = t0 + lead_s + spread_s * i / jobs
                body = {
                    "category": "http",
                    "runAt": datetime.fromtimestamp(run_at, UTC).isoformat(),
                    "payload": {"url": f"{listener}/cb/{i}", "method": "POST", "body": {"i": i}},
                }
                answer = await http.post("/api/jobs", json=body)
                if answer.status_code != 201:
                    refused[answer.status_code] += 1
                    continue
                created = answer.json()
                at = datetime.fromisoformat(created["runAt"]).timestamp()
                posted.append(Posted(str(created["jobId"]), at, time.time()))

    await asyncio.gather(*(client() for _ in range(clients)))
    return posted, refused


def quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    max_ms: float
    failures: list[str]
    split: str = ""

    def line(self) -> str:
        checks = "; ".join(self.failures) or "every job fired once, none early"
        return (
            f"lateness p50 {self.p50_ms:.1f} ms  p99 {self.p99_ms:.1f} ms  "
            f"max {self.max_ms:.1f} ms  ({checks})" + (f"\n  {self.split}" if self.split else "")
        )


def judge(posted: list[Posted], arrivals: dict[str, list[float]], refused: Counter[int]) -> Result:
    failures = [f"{n} posts answered {status}" for status, n in sorted(refused.items())]
    late: list[float] = []
    missing = twice = early = 0
    for job in posted:
        calls = arrivals.get(job.job_id, [])
        if not calls:
            missing += 1
            continue
        twice += len(calls) > 1
        first = min(calls)
        early += first < job.run_at
        late.append(first - max(job.run_at, job.accepted))
    strangers = set(arrivals) - {job.job_id for job in posted}
    for n, what in (
        (missing, "never called back"),
        (twice, "called back more than once"),
        (early, "called back before runAt"),
        (len(strangers), "calls for no posted job"),
    ):
        if n:
            failures.append(f"{n} {what}")
    if not late:
        return Result(math.nan, math.nan, math.nan, [*failures, "no call arrived"])
    return Result(
        quantile(late, 0.5) * 1000, quantile(late, 0.99) * 1000, max(late) * 1000, failures
    )


def run_once(args: argparse.Namespace) -> Result:
    listener_port, api_port = free_port(), free_port()
    ready_here, ready_there = multiprocessing.Pipe()
    done_here, done_there = multiprocessing.Pipe()
    listener = multiprocessing.Process(
        target=_listen, args=(listener_port, ready_there, done_there), daemon=True
    )
    listener.start()
    ready_here.recv()
    try:
        with reservo_up(api_port):
            token = mint_token(SECRET, "service", 1, timedelta(hours=1), datetime.now(UTC))
            posted, refused = asyncio.run(
                post_all(
                    f"http://127.0.0.1:{api_port}", token, f"http://127.0.0.1:{listener_port}",
                    args.jobs, args.clients, args.rate, args.lead_s, args.spread_s,
                )
            )  # fmt: skip
            last = max((job.run_at for job in posted), default=time.time())
            time.sleep(max(0.0, last - time.time()) + args.settle_s)
            started = asyncio.run(started_ats(f"http://127.0.0.1:{api_port}", token))
    finally:
        done_here.send(True)
        arrivals = done_here.recv()
        listener.join(5)
    result = judge(posted, arrivals, refused)
    result.split = split(posted, arrivals, started)
    return result


async def started_ats(base: str, token: str) -> dict[str, float]:
    """Each job's startedAt (its claim, or its runAt when claimed within the
    fire-ahead), read through GET /api/jobs."""
    out: dict[str, float] = {}
    after: str | None = None
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        while True:
            params = {"category": "http", "limit": "200", **({"after": after} if after else {})}
            page = (await http.get("/api/jobs", params=params)).json()
            for item in page["items"]:
                if item["startedAt"]:
                    out[str(item["jobId"])] = datetime.fromisoformat(item["startedAt"]).timestamp()
            after = page["next"]
            if not after:
                return out


def split(posted: list[Posted], arrivals: dict[str, list[float]], started: dict[str, float]) -> str:
    """Where the lateness went: before the handler started (startedAt minus
    runAt: Redis, the mover, the executor's claim) and after (the call's
    arrival minus startedAt: the handler and its HTTP call)."""
    before, after = [], []
    for job in posted:
        if job.job_id in started and arrivals.get(job.job_id):
            at = started[job.job_id]
            before.append(at - max(job.run_at, job.accepted))
            after.append(min(arrivals[job.job_id]) - at)
    if not before:
        return "no startedAt"
    return f"before start {_p50_p99(before)}; start to call {_p50_p99(after)}"


def _p50_p99(xs: list[float]) -> str:
    return f"p50 {quantile(xs, 0.5) * 1000:.1f} p99 {quantile(xs, 0.99) * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--rate", type=float, default=250.0, help="posts a second, in all")
    parser.add_argument("--lead-s", type=float, default=6.0)
    parser.add_argument("--spread-s", type=float, default=8.0)
    parser.add_argument("--settle-s", type=float, default=10.0, help="wait after the last runAt")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--max-p99-ms", type=float, default=None)
    args = parser.parse_args()
    failed = False
    for run in range(1, args.runs + 1):
        result = run_once(args)
        print(f"run {run}: {result.line()}", flush=True)
        over = args.max_p99_ms is not None and not result.p99_ms <= args.max_p99_ms
        failed = failed or bool(result.failures) or over
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
