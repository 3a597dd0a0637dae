"""A mixed write load through HTTP against a running reservo (any release that
serves the fixed API): bookings, wallet transfers, rental holds paid through the
signed webhook, and delayed jobs. Every answer is recorded; a 5xx or a request
that got no answer is a failure."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import orjson

from reservo.core.http.auth import sign_webhook
from tests.helpers.auth import PAY_SECRET, auth, new_id

ADMIN = auth("admin", 1)
SERVICE = auth("service", 1)
ACCOUNTS = 6
DEPOSIT = 100_000
# Answers a healthy service gives this load (a refused booking or transfer is
# still an answer: the slot may be taken, the account short).
EXPECTED = {200, 201, 409, 422, 429}


def _key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


@dataclass
class Answer:
    kind: str
    at: float
    status: int | None  # None: no answer (connection refused, reset, timeout)
    detail: str = ""


@dataclass
class Traffic:
    client: httpx.AsyncClient
    slots: list[int]
    accounts: list[tuple[int, int]]  # (account id, owner)
    answers: list[Answer] = field(default_factory=list)

    @classmethod
    async def setup(cls, client: httpx.AsyncClient) -> Traffic:
        slots = await _slots(client)
        accounts = [await _account(client) for _ in range(ACCOUNTS)]
        return cls(client, slots, accounts)

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status is None or a.status >= 500]

    def unexpected(self) -> list[Answer]:
        return [a for a in self.answers if a.status not in EXPECTED]

    def succeeded(self, kind: str, after: float = 0.0) -> int:
        return sum(
            1 for a in self.answers if a.kind == kind and a.at >= after and a.status in (200, 201)
        )

    async def run(self, stop: asyncio.Event) -> None:
        """One of the load's loops: every kind of write in turn until ``stop``."""
        while not stop.is_set():
            await self._one("booking", self._book())
            await self._one("transfer", self._transfer())
            await self._one("hold", self._hold_and_pay())
            await self._one("job", self._job())

    async def _one(self, kind: str, call: Any) -> None:
        try:
            r: httpx.Response = await call
        except httpx.HTTPError as exc:
            self.answers.append(Answer(kind, time.monotonic(), None, repr(exc)))
            return
        self.answers.append(Answer(kind, time.monotonic(), r.status_code, r.text[:300]))

    async def _book(self) -> httpx.Response:
        patient = new_id()
        return await self.client.post(
            "/api/appointments",
            json={"slotId": random.choice(self.slots), "patientId": patient},
            headers={**auth("patient", patient), **_key()},
        )

    async def _transfer(self) -> httpx.Response:
        (src, owner), (dst, _) = random.sample(self.accounts, 2)
        return await self.client.post(
            "/api/transfers",
            json={"fromAccountId": src, "toAccountId": dst, "amount": random.randint(1, 500)},
            headers={**auth("bettor", owner), **_key()},
        )

    async def _hold_and_pay(self) -> httpx.Response:
        car = await self.client.post(
            "/api/cars",
            json={
                "plate": f"D-{uuid.uuid4().hex[:10]}",
                "model": "Fiat Uno",
                "city": "Lisbon",
                "dailyPrice": 10_000,
                "hostId": new_id(),
            },
            headers=ADMIN,
        )
        if car.status_code != 201:
            return car
        customer = new_id()
        start = (datetime.now(UTC) + timedelta(days=3)).replace(second=0, microsecond=0)
        hold = await self.client.post(
            "/api/bookings",
            json={
                "carId": car.json()["id"],
                "customerId": customer,
                "from": start.isoformat(),
                "to": (start + timedelta(days=1)).isoformat(),
            },
            headers={**auth("customer", customer), **_key()},
        )
        if hold.status_code != 201:
            return hold
        booking = hold.json()
        raw = orjson.dumps(
            {
                "bookingId": booking["bookingId"],
                "providerTxnId": f"txn-{uuid.uuid4().hex}",
                "amount": booking["depositAmount"],
                "status": "SUCCEEDED",
            }
        )
        return await self.client.post(
            "/api/payments/webhook",
            content=raw,
            headers={
                "X-Signature": sign_webhook(PAY_SECRET, raw, int(time.time())),
                "Content-Type": "application/json",
            },
        )

    async def _job(self) -> httpx.Response:
        run_at = datetime.now(UTC) + timedelta(days=30)
        return await self.client.post(
            "/api/jobs",
            json={
                "category": "http",
                "urgency": 3,
                "runAt": run_at.isoformat(),
                "payload": {"url": "http://x.test/"},
            },
            headers={**SERVICE, **_key()},
        )


async def _slots(client: httpx.AsyncClient) -> list[int]:
    r = await client.post(
        "/api/doctors", json={"name": "Dr. Deploy", "timezone": "Europe/Lisbon"}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    doctor = r.json()["id"]
    day = (date.today() + timedelta(days=2)).isoformat()
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": day,
            "to": day,
            "weekdays": list(range(1, 8)),
            "startTime": "08:00",
            "endTime": "20:00",
            "slotMinutes": 15,
            "capacity": 20,
        },
    )
    assert r.status_code == 201, r.text
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return [s["id"] for s in r.json()]


async def _account(client: httpx.AsyncClient) -> tuple[int, int]:
    owner = new_id()
    r = await client.post(
        "/api/accounts", json={"ownerId": owner, "currency": "EUR"}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    account = int(r.json()["id"])
    r = await client.post(
        f"/api/accounts/{account}/deposits",
        json={"amount": DEPOSIT, "reference": f"dep-{uuid.uuid4()}"},
        headers={**SERVICE, **_key()},
    )
    assert r.status_code == 201, r.text
    return account, owner


def run_for(traffic: Traffic, loops: int, stop: asyncio.Event) -> asyncio.Future[Any]:
    """Start ``loops`` concurrent loops; the future ends once ``stop`` is set."""
    return asyncio.gather(*(traffic.run(stop) for _ in range(loops)))
