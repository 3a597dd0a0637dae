"""A mixed load through HTTP that behaves like real clients: every write carries an
Idempotency-Key (or, for webhooks, the provider's id), and a 503, a 429, a 409
``request_in_progress``, a timeout or a refused connection is retried with the SAME
key and body until the service gives a definitive answer. Everything the service
accepted (2xx) is written to the ledger the checks compare against."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import orjson

from reservo.core.http.auth import mint_token, sign_webhook
from reservo.core.kernel.clock import SystemClock
from tests.chaos.stack import JWT_SECRET, PAY_SECRET, RESULTS_SECRET

ODDS = {
    "1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},
    "TOTALS_2_5": {"OVER": "1.95", "UNDER": "1.85"},
    "BTTS": {"YES": "1.70", "NO": "2.10"},
}
# A client gives up on one operation after this long (an outage here lasts < 40 s).
GIVE_UP_S = 120.0
_ids = itertools.count(1000)


def token(role: str, sub: int) -> dict[str, str]:
    t = mint_token(JWT_SECRET, role, sub, timedelta(hours=2), SystemClock().now())
    return {"Authorization": f"Bearer {t}"}


ADMIN = token("admin", 1)
SERVICE = token("service", 1)


def new_id() -> int:
    return next(_ids)


@dataclass(frozen=True)
class Answer:
    """One attempt: when it was sent (monotonic), to which API process, and the
    status (None: no answer, a timeout or a refused connection)."""

    sent: float
    url: str
    method: str
    path: str
    status: int | None


@dataclass
class Traffic:
    """What the clients saw, per scenario."""

    statuses: Counter[int] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)  # "409 slot_full POST /api/..."
    connection_errors: int = 0
    server_errors: list[str] = field(default_factory=list)  # any 5xx but 503
    unresolved: list[str] = field(default_factory=list)  # gave up without an answer
    bad_503: list[str] = field(default_factory=list)  # a 503 whose code is not unavailable
    answers: list[Answer] = field(default_factory=list)  # every attempt, in order


@dataclass
class Ledger:
    """Every request the service accepted, with its ids."""

    # Jobs a scenario sent somewhere else than the recorder on purpose (it checks them).
    jobs_elsewhere: set[int] = field(default_factory=set)
    appointments: dict[int, int] = field(default_factory=dict)  # appointment -> patient
    appointments_cancelled: set[int] = field(default_factory=set)
    holds: dict[int, int] = field(default_factory=dict)  # booking -> deposit
    payments: dict[str, int] = field(default_factory=dict)  # providerTxnId -> booking
    rentals_cancelled: dict[int, int] = field(default_factory=dict)  # booking -> refund
    deposits: dict[int, tuple[int, int]] = field(default_factory=dict)  # transfer -> (acct, amt)
    transfers: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id -> (from,to,amt)
    bets: dict[int, tuple[int, int]] = field(default_factory=dict)  # bet -> (account, stake)
    results: dict[int, str] = field(default_factory=dict)  # match -> providerEventId
    jobs: set[int] = field(default_factory=set)
    # Operations whose outcome the client never learned (given up): 0 or 1 effect.
    unknown: Counter[str] = field(default_factory=Counter)


@dataclass
class Fixtures:
    """What the load works on, created before the faults."""

    slots: list[int] = field(default_factory=list)
    cars: list[tuple[int, int]] = field(default_factory=list)  # (car, host)
    accounts: list[tuple[int, int]] = field(default_factory=list)  # (account, owner)
    matches: list[dict[str, Any]] = field(default_factory=list)  # open for bets


class Client:
    """Round-robins over the API processes; retries like a real client."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._next = itertools.cycle(range(len(urls)))
        self.http = httpx.AsyncClient(timeout=15, limits=httpx.Limits(max_keepalive_connections=0))
        self.traffic = Traffic()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        sign: str | None = None,
        retry: bool = True,
    ) -> httpx.Response | None:
        """The definitive answer (2xx or a deterministic 4xx), or None after GIVE_UP_S.
        ``sign``: the webhook secret; each attempt is signed afresh, as a provider does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GIVE_UP_S
        what = f"{method} {path}"
        while True:
            base = self.urls[next(self._next)]
            hdrs = dict(headers or {})
            if sign is not None:
                assert content is not None
                hdrs["X-Signature"] = sign_webhook(sign, content)
                hdrs["Content-Type"] = "application/json"
            sent = time.monotonic()
            try:
                r = await self.http.request(
                    method, base + path, headers=hdrs, json=json, content=content
                )
            except httpx.TransportError:
                self.traffic.connection_errors += 1
                r = None
            status = None if r is None else r.status_code
            self.traffic.answers.append(Answer(sent, base, method, path, status))
            if r is not None:
                self.traffic.statuses[r.status_code] += 1
                code = _code(r)
                if r.status_code >= 400:
                    route = "/".join("{id}" if p.isdigit() else p for p in path.split("/"))
                    self.traffic.refusals[f"{r.status_code} {code} {method} {route}"] += 1
                if r.status_code == 503 and code != "unavailable":
                    self.traffic.bad_503.append(f"{what}: {r.text[:300]}")
                if r.status_code >= 500 and r.status_code != 503:
                    self.traffic.server_errors.append(f"{what}: {r.status_code} {r.text[:300]}")
                transient = (
                    r.status_code in (429, 503)
                    or r.status_code >= 500
                    or (r.status_code == 409 and code == "request_in_progress")
                )
                if not transient or not retry:
                    return r
            if not retry or loop.time() > deadline:
                self.traffic.unresolved.append(what)
                return None
            await asyncio.sleep(0.3 + random.random() * 0.3)


def _code(r: httpx.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


# -- fixtures (before any fault) ----------------------------------------------------
async def make_fixtures(client: Client, ledger: Ledger) -> Fixtures:
    fx = Fixtures()
    await make_slots(client, fx)
    await make_cars_and_accounts(client, ledger, fx)
    return fx


async def make_slots(client: Client, fx: Fixtures, doctors: int = 6) -> None:
    """``doctors`` doctors with 16 slots of capacity 4 each, three days ahead."""
    day = date.today() + timedelta(days=3)
    for _ in range(doctors):
        r = await client.send(
            "POST", "/api/doctors", headers=ADMIN, json={"name": "Dr. Chaos", "timezone": "UTC"}
        )
        assert r is not None and r.status_code == 201, r and r.text
        doctor = r.json()["id"]
        r = await client.send(
            "POST",
            f"/api/doctors/{doctor}/schedules",
            headers=ADMIN,
            json={
                "from": day.isoformat(),
                "to": day.isoformat(),
                "weekdays": list(range(1, 8)),
                "startTime": "08:00",
                "endTime": "12:00",
                "slotMinutes": 15,
                "capacity": 4,
            },
        )
        assert r is not None and r.status_code == 201, r and r.text
        r = await client.send(
            "GET", f"/api/doctors/{doctor}/slots?date={day.isoformat()}", headers=ADMIN
        )
        assert r is not None and r.status_code == 200, r and r.text
        fx.slots += [s["id"] for s in r.json()]


async def make_cars_and_accounts(client: Client, ledger: Ledger, fx: Fixtures) -> None:
    for i in range(20):
        host = new_id()
        r = await client.send(
            "POST",
            "/api/cars",
            headers={**ADMIN, **_key()},
            json={
                "plate": f"CHAOS-{uuid.uuid4().hex[:8]}",
                "model": f"Model {i}",
                "city": "Chaos City",
                "dailyPrice": 10_000,
                "hostId": host,
            },
        )
        assert r is not None and r.status_code == 201, r and r.text
        fx.cars.append((r.json()["id"], host))
    for _ in range(12):
        owner = new_id()
        r = await client.send(
            "POST", "/api/accounts", headers=ADMIN, json={"ownerId": owner, "currency": "EUR"}
        )
        assert r is not None and r.status_code == 201, r and r.text
        account = r.json()["id"]
        fx.accounts.append((account, owner))
        await deposit(client, ledger, fx, account, 5_000)


async def new_matches(client: Client, fx: Fixtures, count: int, starts_in_s: float) -> None:
    """Matches taking bets until ``starts_in_s`` from now (results only after that)."""
    fx.matches = []
    for _ in range(count):
        r = await client.send(
            "POST",
            "/api/matches",
            headers=ADMIN,
            json={
                "externalId": f"chaos-{uuid.uuid4()}",
                "home": "Home",
                "away": "Away",
                "startsAt": (datetime.now(UTC) + timedelta(seconds=starts_in_s)).isoformat(),
                "odds": ODDS,
            },
        )
        assert r is not None and r.status_code == 201, r and r.text
        fx.matches.append(r.json())


# -- operations -----------------------------------------------------------------------
async def deposit(
    client: Client, ledger: Ledger, fx: Fixtures, account: int | None = None, amount: int = 200
) -> None:
    account = account if account is not None else random.choice(fx.accounts)[0]
    r = await client.send(
        "POST",
        f"/api/accounts/{account}/deposits",
        headers={**SERVICE, **_key()},
        json={"amount": amount, "reference": f"dep-{uuid.uuid4()}"},
    )
    if r is None:
        ledger.unknown["deposit"] += 1
    elif r.is_success:
        ledger.deposits[r.json()["id"]] = (account, amount)


async def book_appointment(
    client: Client, ledger: Ledger, fx: Fixtures, cancel: float = 0.3
) -> None:
    """Books a slot as a new patient; cancels it with probability ``cancel``."""
    patient = new_id()
    r = await client.send(
        "POST",
        "/api/appointments",
        headers={**token("patient", patient), **_key()},
        json={"slotId": random.choice(fx.slots), "patientId": patient},
    )
    if r is None:
        ledger.unknown["appointment"] += 1
        return
    if not r.is_success:
        return
    appt = int(r.json()["id"])
    ledger.appointments[appt] = patient
    if random.random() < cancel:
        who = token("patient", patient)
        r = await client.send("DELETE", f"/api/appointments/{appt}", headers=who)
        if r is None:
            ledger.unknown["appointment_cancel"] += 1
        elif r.is_success:
            ledger.appointments_cancelled.add(appt)


def _at(hours: float) -> str:
    t = datetime.now(UTC) + timedelta(hours=hours)
    return t.replace(minute=0, second=0, microsecond=0).isoformat()


async def rent(client: Client, ledger: Ledger, fx: Fixtures) -> None:
    """Hold, pay (signed webhook), and usually cancel (a refund at the gateway)."""
    car, host = random.choice(fx.cars)
    customer = new_id()
    start = 100 + random.randrange(0, 2000, 30)
    r = await client.send(
        "POST",
        "/api/bookings",
        headers={**token("customer", customer), **_key()},
        json={"carId": car, "customerId": customer, "from": _at(start), "to": _at(start + 24)},
    )
    if r is None:
        ledger.unknown["hold"] += 1
        return
    if not r.is_success:
        return
    booking = r.json()
    bid, amount = int(booking["bookingId"]), int(booking["depositAmount"])
    ledger.holds[bid] = amount
    txn = f"txn-{uuid.uuid4().hex}"
    body = orjson.dumps(
        {"bookingId": bid, "providerTxnId": txn, "amount": amount, "status": "SUCCEEDED"}
    )
    r = await client.send("POST", "/api/payments/webhook", content=body, sign=PAY_SECRET)
    if r is None:
        ledger.unknown["payment"] += 1
        return
    assert r.is_success, r.text
    ledger.payments[txn] = bid
    if random.random() < 0.7:
        who = token("host", host) if random.random() < 0.5 else token("customer", customer)
        r = await client.send("POST", f"/api/bookings/{bid}/cancel", headers=who)
        if r is None:
            ledger.unknown["rental_cancel"] += 1
        elif r.is_success:
            ledger.rentals_cancelled[bid] = int(r.json()["refundAmount"] or 0)


async def bet(client: Client, ledger: Ledger, fx: Fixtures) -> None:
    open_matches = [
        m for m in fx.matches if datetime.fromisoformat(m["startsAt"]) > datetime.now(UTC)
    ]
    if not open_matches:
        return
    match = random.choice(open_matches)
    account, owner = random.choice(fx.accounts)
    market = random.choice(list(ODDS))
    pick = random.choice(list(ODDS[market]))
    stake = random.randint(10, 60)
    r = await client.send(
        "POST",
        "/api/bets",
        headers={**token("bettor", owner), **_key()},
        json={
            "accountId": account,
            "stake": stake,
            "selections": [
                {"matchId": match["id"], "market": market, "pick": pick, "odds": ODDS[market][pick]}
            ],
        },
    )
    if r is None:
        ledger.unknown["bet"] += 1
    elif r.is_success:
        ledger.bets[int(r.json()["id"])] = (account, stake)


async def transfer(client: Client, ledger: Ledger, fx: Fixtures) -> None:
    (src, owner), (dst, _) = random.sample(fx.accounts, 2)
    amount = random.randint(1, 40)
    r = await client.send(
        "POST",
        "/api/transfers",
        headers={**token("bettor", owner), **_key()},
        json={"fromAccountId": src, "toAccountId": dst, "amount": amount},
    )
    if r is None:
        ledger.unknown["transfer"] += 1
    elif r.is_success:
        ledger.transfers[int(r.json()["id"])] = (src, dst, amount)


async def post_results(client: Client, ledger: Ledger, fx: Fixtures) -> None:
    """Each match's result once it has started (a FINISHED result before is refused)."""
    for match in fx.matches:
        starts = datetime.fromisoformat(match["startsAt"])
        wait = (starts - datetime.now(UTC)).total_seconds() + 0.5
        if wait > 0:
            await asyncio.sleep(wait)
        event = f"prov-{uuid.uuid4()}"
        body = orjson.dumps(
            {
                "matchExternalId": match["externalId"],
                "homeScore": random.randint(0, 4),
                "awayScore": random.randint(0, 4),
                "status": "FINISHED",
                "providerEventId": event,
            }
        )
        r = await client.send(
            "POST", "/api/webhooks/match-results", content=body, sign=RESULTS_SECRET
        )
        if r is None:
            ledger.unknown["result"] += 1
        else:
            assert r.status_code == 202, r.text
            ledger.results[int(match["id"])] = event


async def job(client: Client, ledger: Ledger, fx: Fixtures, recorder_port: int) -> None:
    n = new_id()
    r = await client.send(
        "POST",
        "/api/jobs",
        headers={**SERVICE, **_key()},
        json={
            "category": "http",
            "delayMs": random.randint(0, 4000),
            "payload": {
                "url": f"http://127.0.0.1:{recorder_port}/job/{n}",
                "method": "POST",
                "body": {"n": n},
            },
        },
    )
    if r is None:
        ledger.unknown["job"] += 1
    elif r.is_success:
        ledger.jobs.add(int(r.json()["jobId"]))


async def run_load(
    client: Client,
    ledger: Ledger,
    fx: Fixtures,
    recorder_port: int,
    stop: asyncio.Event,
    concurrency: int = 5,
) -> int:
    """Client loops until ``stop``; returns how many operations were started."""
    started = 0

    async def one_client() -> None:
        nonlocal started
        while not stop.is_set():
            started += 1
            kind = random.choices(
                ["appointment", "rent", "bet", "transfer", "deposit", "job"],
                weights=[30, 15, 20, 15, 5, 15],
            )[0]
            if kind == "appointment":
                await book_appointment(client, ledger, fx)
            elif kind == "rent":
                await rent(client, ledger, fx)
            elif kind == "bet":
                await bet(client, ledger, fx)
            elif kind == "transfer":
                await transfer(client, ledger, fx)
            elif kind == "deposit":
                await deposit(client, ledger, fx)
            else:
                await job(client, ledger, fx, recorder_port)
            await asyncio.sleep(random.random() * 0.2)

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return started
