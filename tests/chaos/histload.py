"""The partition scenarios' load: clients that retry like real ones and write
every operation into a history (tests/chaos/history) for the checker.

Each write carries an Idempotency-Key, and a 503, a 429, a 409
``request_in_progress``, a timeout or a refused connection is retried with the
same key and body until the answer is definitive (``ok``: 2xx, ``fail``: any
other 4xx) or the client gives up (``info``: its effect unknown). Every HTTP
attempt's status and response time is kept, to hold them against the deadline.

Operations are made identifiable without the service's help (what the checker
needs): a transfer's amount is used by no other transfer, a deposit has its own
reference, each booking its own patient, each job its own ``ref``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import httpx

from tests.chaos.history.record import History, Op
from tests.chaos.load import ADMIN, SERVICE, token

GIVE_UP_S = 90.0


@dataclass
class Attempt:
    at: float  # monotonic, when it was sent
    seconds: float
    status: int | None  # None: no answer (timeout or connection error)


@dataclass
class Setup:
    accounts: list[tuple[int, int]] = field(default_factory=list)  # (account, owner)
    slots: list[int] = field(default_factory=list)
    receiver: str = ""  # the job receiver's base URL
    job_prefix: str = field(default_factory=lambda: f"p{uuid.uuid4().hex[:6]}")


class Clients:
    """Many client loops over one HTTP client; what each saw goes to ``history``
    and ``attempts``."""

    def __init__(self, url: str, attempt_timeout_s: float) -> None:
        self.url = url
        self.http = httpx.AsyncClient(
            base_url=url, timeout=attempt_timeout_s, limits=httpx.Limits(max_connections=200)
        )
        self.history = History()
        self.attempts: list[Attempt] = []
        self._amounts = itertools.count(1)
        self._patients = itertools.count(10_000_000 + random.randrange(10**6) * 100)
        self._refs = itertools.count(1)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _try(self, method: str, path: str, headers: dict[str, str], body: Any) -> (
        httpx.Response | None
    ):  # fmt: skip
        t0 = time.monotonic()
        try:
            r: httpx.Response | None = await self.http.request(
                method, path, headers=headers, json=body
            )
        except httpx.TransportError:
            r = None
        self.attempts.append(
            Attempt(t0, time.monotonic() - t0, None if r is None else r.status_code)
        )
        return r

    async def call(
        self, op: Op, method: str, path: str, headers: dict[str, str], body: Any = None
    ) -> httpx.Response | None:
        """Until definitive or GIVE_UP_S; the op completed in the history."""
        headers = {**headers, "Idempotency-Key": str(uuid.uuid4())}
        deadline = time.monotonic() + GIVE_UP_S
        last = "no answer"
        while time.monotonic() < deadline:
            op.attempts += 1
            r = await self._try(method, path, headers, body)
            code = _code(r)
            if r is not None and r.is_success:
                self.history.ok(op, status=r.status_code, **_id(r))
                return r
            transient = r is None or r.status_code in (429, 503) or r.status_code >= 500
            if r is not None and not transient and code != "request_in_progress":
                self.history.fail(op, f"{r.status_code} {code}")
                return r
            last = "no answer" if r is None else f"{r.status_code} {code}"
            await asyncio.sleep(0.2 + random.random() * 0.3)
        self.history.info(op, f"gave up after {GIVE_UP_S:.0f} s: {last}")
        return None

    # -- operations -------------------------------------------------------------------
    async def deposit(self, account: int, amount: int) -> None:
        ref = f"dep-{uuid.uuid4().hex}"
        op = self.history.invoke("deposit", account=account, amount=amount, reference=ref)
        await self.call(op, "POST", f"/api/accounts/{account}/deposits", SERVICE,
                        {"amount": amount, "reference": ref})  # fmt: skip

    async def transfer(self, setup: Setup) -> None:
        (src, owner), (dst, _) = random.sample(setup.accounts, 2)
        amount = next(self._amounts)  # no other transfer moves this amount
        op = self.history.invoke("transfer", source=src, target=dst, amount=amount)
        await self.call(op, "POST", "/api/transfers", token("bettor", owner),
                        {"fromAccountId": src, "toAccountId": dst, "amount": amount})  # fmt: skip

    async def book(self, setup: Setup) -> None:
        patient, slot = next(self._patients), random.choice(setup.slots)
        who = token("patient", patient)
        op = self.history.invoke("book", slot=slot, patient=patient)
        r = await self.call(op, "POST", "/api/appointments", who,
                            {"slotId": slot, "patientId": patient})  # fmt: skip
        if r is None or not r.is_success or random.random() > 0.3:
            return
        appointment = int(r.json()["id"])
        op = self.history.invoke("cancel", appointment=appointment, patient=patient)
        await self.call(op, "DELETE", f"/api/appointments/{appointment}", who)

    async def job(self, setup: Setup) -> None:
        ref = f"{setup.job_prefix}-{next(self._refs)}"
        op = self.history.invoke("job", ref=ref)
        await self.call(op, "POST", "/api/jobs", SERVICE, {
            "category": "http",
            "delayMs": random.randint(0, 1000),
            "payload": {"url": f"{setup.receiver}/job/{ref}", "method": "POST",
                        "body": {"ref": ref}},
        })  # fmt: skip

    async def run(self, setup: Setup, stop: asyncio.Event, concurrency: int) -> None:
        async def one() -> None:
            while not stop.is_set():
                kind = random.choices(["transfer", "deposit", "book", "job"], [40, 10, 30, 20])[0]
                if kind == "transfer":
                    await self.transfer(setup)
                elif kind == "deposit":
                    await self.deposit(random.choice(setup.accounts)[0], 100)
                elif kind == "book":
                    await self.book(setup)
                else:
                    await self.job(setup)
                await asyncio.sleep(random.random() * 0.1)

        await asyncio.gather(*(one() for _ in range(concurrency)))

    def statuses(self, since: float = 0.0, until: float = float("inf")) -> Counter[int | None]:
        return Counter(a.status for a in self.attempts if since <= a.at < until)


def _code(r: httpx.Response | None) -> str | None:
    if r is None:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _id(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    if not isinstance(body, dict):
        return {}
    for name in ("id", "jobId"):
        if name in body:
            return {"id": int(body[name])}
    return {}


async def make_setup(clients: Clients, receiver: str) -> Setup:
    """Accounts funded well beyond what the transfers move, and a day of slots of
    capacity 3 (the bookings overfill them: refusals are part of the history)."""
    setup = Setup(receiver=receiver)
    http = clients.http
    for _ in range(8):
        owner = random.randrange(10**9)
        body = {"ownerId": owner, "currency": "EUR"}
        r = await http.post("/api/accounts", headers=ADMIN, json=body)
        assert r.status_code == 201, r.text
        setup.accounts.append((int(r.json()["id"]), owner))
        await clients.deposit(setup.accounts[-1][0], 10_000_000)
    day = date.today() + timedelta(days=2)
    r = await http.post("/api/doctors", headers=ADMIN, json={"name": "Dr. Net", "timezone": "UTC"})
    assert r.status_code == 201, r.text
    doctor = r.json()["id"]
    r = await http.post(f"/api/doctors/{doctor}/schedules", headers=ADMIN, json={
        "from": day.isoformat(), "to": day.isoformat(), "weekdays": list(range(1, 8)),
        "startTime": "08:00", "endTime": "18:00", "slotMinutes": 15, "capacity": 3,
    })  # fmt: skip
    assert r.status_code == 201, r.text
    r = await http.get(f"/api/doctors/{doctor}/slots?date={day.isoformat()}", headers=ADMIN)
    assert r.status_code == 200, r.text
    setup.slots = [s["id"] for s in r.json()]
    assert all(op.outcome == "ok" for op in clients.history.ops), clients.history.counts()
    return setup
