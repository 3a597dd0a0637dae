"""Web Push, and every channel a contact has.

A patient's contact takes the browser Push API's subscriptions (checked: keys,
https, the egress rules of `http` jobs). Every notification goes to every
channel the contact has: e-mail, SMS and each push subscription, each delivered
and retried on its own. The push service here is the test's own, on loopback:
it checks the VAPID token with our public key (signature, audience, expiry,
subject), and the browser decrypts the payload with its own private key, so
the RFC 8291 encryption is proven, not assumed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from aiosmtpd.controller import Controller

from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.notifications.setup import Notifications
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import problem
from tests.helpers.notify import Collector, HttpSink
from tests.helpers.procs import free_port
from tests.helpers.push import SUBJECT, Browser, PushService, VapidKeys, verify_vapid
from tests.helpers.scheduler import Stack, api_stack, running
from tests.helpers.waiting import drain, wait_until

PUBLIC_ENDPOINT = "https://fcm.googleapis.com/fcm/send/dGVzdC1zdWJzY3JpcHRpb24"


async def put_contact(client: httpx.AsyncClient, patient: int, body: Any) -> httpx.Response:
    return await client.put(
        f"/api/patients/{patient}/contact", json=body, headers=auth("patient", patient)
    )


@pytest.fixture
async def push_service() -> AsyncIterator[PushService]:
    service = PushService()
    server = await asyncio.start_server(service.handle, "127.0.0.1", 0)
    service.port = server.sockets[0].getsockname()[1]
    try:
        yield service
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def vapid() -> VapidKeys:
    return VapidKeys.generate()


def push_settings(service: PushService, keys: VapidKeys, **more: Any) -> dict[str, Any]:
    return {
        "push_vapid_private_key": keys.private_pem,
        "push_vapid_subject": SUBJECT,
        # The test's push service is on loopback: allowed as an operator would.
        "jobs_http_allow": f"127.0.0.1:{service.port}",
        "notify_retry_base_s": 0.2,
        "notify_retry_max_s": 0.5,
        **more,
    }


async def deliver(stack: Stack) -> None:
    """The relay hands every pending event to the consumers, until none is left."""
    await drain(stack.container.module(Outbox).relay)


# -- the contact -------------------------------------------------------------------------


async def test_a_patient_stores_their_push_subscriptions(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    patient, browser = new_id(), Browser()
    sub = browser.subscription(PUBLIC_ENDPOINT)
    r = await put_contact(client, patient, {"email": "ana@example.com", "pushSubscriptions": [sub]})
    assert r.status_code == 200, r.text
    assert r.json()["pushSubscriptions"] == [{"endpoint": PUBLIC_ENDPOINT, "keys": sub["keys"]}]
    rows = await db.fetch(
        "SELECT endpoint, p256dh, auth FROM push_subscription WHERE user_id = $1", patient
    )
    assert [tuple(r) for r in rows] == [
        (PUBLIC_ENDPOINT, sub["keys"]["p256dh"], sub["keys"]["auth"])
    ]
    # PUT replaces: omitted, they are removed.
    r = await put_contact(client, patient, {"email": "ana@example.com"})
    assert r.json()["pushSubscriptions"] == []
    assert await _subscriptions(db, patient) == 0


def _with_keys(**keys: str) -> dict[str, Any]:
    sub = Browser().subscription(PUBLIC_ENDPOINT)
    sub["keys"].update(keys)
    return sub


_OFF_CURVE = "BA" + "A" * 85  # 65 bytes: 0x04 then zeros, not a point on P-256


@pytest.mark.parametrize(
    ("sub", "code"),
    [
        (_with_keys(p256dh="not base64url!"), "validation_error"),
        (_with_keys(p256dh="BBBB"), "validation_error"),  # wrong length
        (_with_keys(p256dh=_OFF_CURVE), "validation_error"),
        (_with_keys(auth="c2hvcnQ"), "validation_error"),  # 5 bytes, not 16
        (_with_keys(auth="@@@@"), "validation_error"),
        ({"endpoint": PUBLIC_ENDPOINT, "keys": {"p256dh": Browser().p256dh}}, "validation_error"),
        # Plain http to a public host: refused (only an allowed destination may be http).
        ({**_with_keys(), "endpoint": "http://push.example.com/x"}, "destination_not_allowed"),
        # Destinations the egress rules refuse: loopback, private, metadata, credentials.
        ({**_with_keys(), "endpoint": "https://127.0.0.1:8443/x"}, "destination_not_allowed"),
        ({**_with_keys(), "endpoint": "https://10.0.0.7/x"}, "destination_not_allowed"),
        ({**_with_keys(), "endpoint": "https://169.254.169.254/x"}, "destination_not_allowed"),
        ({**_with_keys(), "endpoint": "https://[::1]/x"}, "destination_not_allowed"),
        ({**_with_keys(), "endpoint": "https://u:p@push.example.com/x"}, "destination_not_allowed"),
        ({**_with_keys(), "endpoint": "ftp://push.example.com/x"}, "destination_not_allowed"),
    ],
)
async def test_a_bad_subscription_is_422_and_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, sub: dict[str, Any], code: str
) -> None:
    patient = new_id()
    r = await put_contact(client, patient, {"email": "ana@example.com", "pushSubscriptions": [sub]})
    problem(r, 422, code)
    assert await db.fetchval("SELECT count(*) FROM contact WHERE user_id = $1", patient) == 0
    assert await _subscriptions(db, patient) == 0


async def test_at_most_five_distinct_subscriptions(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    patient = new_id()
    subs = [Browser().subscription(f"{PUBLIC_ENDPOINT}{i}") for i in range(6)]
    problem(
        await put_contact(client, patient, {"pushSubscriptions": subs}), 422, "validation_error"
    )
    twice = [subs[0], subs[0]]
    problem(
        await put_contact(client, patient, {"pushSubscriptions": twice}), 422, "validation_error"
    )
    assert await _subscriptions(db, patient) == 0
    assert (await put_contact(client, patient, {"pushSubscriptions": subs[:5]})).status_code == 200
    assert await _subscriptions(db, patient) == 5


async def test_plain_http_only_to_an_allowed_destination(
    base_settings: Settings, own_database: str, push_service: PushService, vapid: VapidKeys
) -> None:
    async with api_stack(
        base_settings, own_database, **push_settings(push_service, vapid)
    ) as stack:
        patient = new_id()
        allowed = Browser().subscription(push_service.endpoint("a"))
        r = await put_contact(stack.client, patient, {"pushSubscriptions": [allowed]})
        assert r.status_code == 200, r.text
        # Another port of the same host is not in the allowance.
        other = Browser().subscription(f"http://127.0.0.1:{push_service.port + 1}/push/b")
        r = await put_contact(stack.client, patient, {"pushSubscriptions": [other]})
        problem(r, 422, "destination_not_allowed")


# -- delivery ------------------------------------------------------------------------------


async def test_push_is_encrypted_for_each_browser_and_signed_with_vapid(
    base_settings: Settings, own_database: str, push_service: PushService, vapid: VapidKeys
) -> None:
    async with api_stack(
        base_settings, own_database, **push_settings(push_service, vapid)
    ) as stack:
        _, slots = await make_slots(stack.client)
        patient, phone, laptop = new_id(), Browser(), Browser()
        body = {
            "pushSubscriptions": [
                phone.subscription(push_service.endpoint("phone")),
                laptop.subscription(push_service.endpoint("laptop")),
            ]
        }
        assert (await put_contact(stack.client, patient, body)).status_code == 200
        assert (await book(stack.client, slots[0]["id"], patient)).status_code == 201
        await deliver(stack)

        (to_phone,) = push_service.to("phone")
        (to_laptop,) = push_service.to("laptop")
        sent = await stack.db.fetchrow(
            "SELECT event_id, subject, body FROM notification WHERE recipient = $1 "
            "AND channel = 'push' AND target = $2",
            patient,
            push_service.endpoint("phone"),
        )
        for req, browser in ((to_phone, phone), (to_laptop, laptop)):
            assert req.method == "POST"
            assert req.headers["content-encoding"] == "aes128gcm"
            assert int(req.headers["ttl"]) == 86_400
            verify_vapid(req, vapid, push_service.origin)
            assert browser.decrypt(req.body) == {
                "title": sent["subject"],
                "body": sent["body"],
                "eventId": str(sent["event_id"]),
            }
        # Encrypted for one browser: the other's keys cannot read it.
        with pytest.raises(Exception):  # noqa: B017 (http_ece raises cryptography's InvalidTag)
            laptop.decrypt(to_phone.body)
        rows = await stack.db.fetch(
            "SELECT channel, target, status FROM notification WHERE recipient = $1 ORDER BY 1, 2",
            patient,
        )
        assert [tuple(r) for r in rows] == [
            ("log", "", "SENT"),
            ("push", push_service.endpoint("laptop"), "SENT"),
            ("push", push_service.endpoint("phone"), "SENT"),
        ]


async def test_a_410_removes_the_subscription(
    base_settings: Settings, own_database: str, push_service: PushService, vapid: VapidKeys
) -> None:
    push_service.by_path["/push/old"] = 410
    async with api_stack(
        base_settings, own_database, **push_settings(push_service, vapid)
    ) as stack:
        _, slots = await make_slots(stack.client)
        patient = new_id()
        subs = [
            Browser().subscription(push_service.endpoint("old")),
            Browser().subscription(push_service.endpoint("new")),
        ]
        assert (await put_contact(stack.client, patient, {"pushSubscriptions": subs})).is_success
        appt = (await book(stack.client, slots[0]["id"], patient)).json()
        await deliver(stack)
        assert len(push_service.to("old")) == 1 and len(push_service.to("new")) == 1
        left = await stack.db.fetch(
            "SELECT endpoint FROM push_subscription WHERE user_id = $1", patient
        )
        assert [r["endpoint"] for r in left] == [push_service.endpoint("new")]
        status = await stack.db.fetchval(
            "SELECT status FROM notification WHERE recipient = $1 AND target = $2",
            patient,
            push_service.endpoint("old"),
        )
        assert status == "GONE"
        # The next message goes to the remaining subscription only; nothing is retried.
        r = await stack.client.delete(
            f"/api/appointments/{appt['id']}", headers=auth("patient", patient)
        )
        assert r.status_code == 200, r.text
        await deliver(stack)
        assert len(push_service.to("old")) == 1 and len(push_service.to("new")) == 2
        retries = "SELECT count(*) FROM scheduled_job WHERE category = 'notification_retry'"
        assert await stack.db.fetchval(retries) == 0


async def test_smtp_down_delays_no_push_or_sms_and_nothing_is_sent_twice(
    base_settings: Settings,
    own_database: str,
    push_service: PushService,
    vapid: VapidKeys,
    http_server: HttpSink,
) -> None:
    smtp_port = free_port()  # nothing listens yet: every connection is refused
    settings = push_settings(
        push_service,
        vapid,
        notify_channel="smtp,http",
        notify_smtp_port=smtp_port,
        notify_http_url=http_server.url,
    )
    async with api_stack(base_settings, own_database, **settings) as stack:
        _, slots = await make_slots(stack.client)
        patient, browser = new_id(), Browser()
        contact = {
            "email": "ana@example.com",
            "phone": "+351912345678",
            "pushSubscriptions": [browser.subscription(push_service.endpoint("ana"))],
        }
        assert (await put_contact(stack.client, patient, contact)).is_success
        appt = (await book(stack.client, slots[0]["id"], patient)).json()
        await deliver(stack)
        # The cancellation: the same aggregate's next event, after a failed e-mail.
        r = await stack.client.delete(f"/api/appointments/{appt['id']}", headers=ADMIN)
        assert r.status_code == 200, r.text
        await deliver(stack)

        # On time: both messages went out by push and SMS without any retry
        # having run, and no event waits in the outbox behind the e-mail.
        decrypted = [browser.decrypt(req.body)["eventId"] for req in push_service.to("ana")]
        sms = [orjson.loads(req.body)["eventId"] for req in http_server.requests]
        assert len(decrypted) == 2 and sorted(sms) == sorted(decrypted)
        assert await stack.db.fetchval("SELECT count(*) FROM outbox WHERE status <> 'DONE'") == 0
        pending = await stack.db.fetch(
            "SELECT status, attempts, last_error FROM notification WHERE channel = 'smtp'"
        )
        assert [r["status"] for r in pending] == ["PENDING", "PENDING"]
        assert all("SMTPConnectError" in r["last_error"] for r in pending), pending

        collector = Collector()
        scheduler: Any = stack.container.scheduler
        async with running(scheduler):
            # Still down: the retries count attempts, and send nothing anywhere else.
            await wait_until(
                _attempts_at_least(stack.db, 2), 20, "a second failed attempt per e-mail"
            )
            smtp = Controller(collector, hostname="127.0.0.1", port=smtp_port)
            smtp.start()
            try:
                await wait_until(_all_sent(stack.db), 20, "every e-mail sent after SMTP is back")
                await asyncio.sleep(1.0)  # a duplicate would have time to arrive
            finally:
                smtp.stop()
        assert sorted(m["X-Reservo-Event-Id"] for _, _, m in collector.messages) == sorted(
            decrypted
        )
        assert [rcpts for _, rcpts, _ in collector.messages] == [["ana@example.com"]] * 2
        assert len(push_service.to("ana")) == 2 and len(http_server.requests) == 2

        # The events delivered to the consumer again send nothing again, on any channel.
        consumer = stack.container.module(Notifications).consumer
        assert consumer.channel_names == ["smtp", "http", "push"]
        rows = await stack.db.fetch(
            "SELECT event_id, topic, key, payload, created_at FROM outbox WHERE key = $1",
            f"appointment:{appt['id']}",
        )
        assert len(rows) == 2
        await consumer.handle_many(
            [
                Event(
                    r["event_id"], r["topic"], r["key"], orjson.loads(r["payload"]), r["created_at"]
                )
                for r in rows
            ]
        )
        assert len(collector.messages) == 2
        assert len(push_service.to("ana")) == 2 and len(http_server.requests) == 2


async def _subscriptions(db: asyncpg.Connection, patient: int) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM push_subscription WHERE user_id = $1", patient)
    )


def _attempts_at_least(db: asyncpg.Connection, n: int) -> Any:
    async def check() -> bool:
        low = await db.fetchval(
            "SELECT min(attempts) FROM notification WHERE channel = 'smtp' AND status = 'PENDING'"
        )
        return low is not None and low >= n

    return check


def _all_sent(db: asyncpg.Connection) -> Any:
    async def check() -> bool:
        rows = await db.fetch("SELECT status FROM notification")
        return bool(rows) and all(r["status"] == "SENT" for r in rows)

    return check


async def test_a_push_service_that_fails_is_retried_alone_until_it_accepts_once(
    base_settings: Settings, own_database: str, push_service: PushService, vapid: VapidKeys
) -> None:
    push_service.status = 503
    async with api_stack(
        base_settings, own_database, **push_settings(push_service, vapid)
    ) as stack:
        _, slots = await make_slots(stack.client)
        patient, browser = new_id(), Browser()
        sub = {"pushSubscriptions": [browser.subscription(push_service.endpoint("ana"))]}
        assert (await put_contact(stack.client, patient, sub)).is_success
        assert (await book(stack.client, slots[0]["id"], patient)).status_code == 201
        await deliver(stack)
        rows = await stack.db.fetch(
            "SELECT channel, status FROM notification WHERE recipient = $1 ORDER BY 1", patient
        )
        assert [tuple(r) for r in rows] == [("log", "SENT"), ("push", "PENDING")]
        scheduler: Any = stack.container.scheduler
        async with running(scheduler):
            await wait_until(lambda: len(push_service.to("ana")) >= 3, 20, "two retries")
            push_service.status = 201
            await wait_until(_all_sent(stack.db), 20, "the push sent once the service is back")
            accepted = len(push_service.to("ana"))
            await asyncio.sleep(1.0)  # a duplicate would have time to arrive
        # The last request was the accepted one, and nothing followed it.
        assert len(push_service.to("ana")) == accepted
        event_ids = {browser.decrypt(r.body)["eventId"] for r in push_service.to("ana")}
        assert len(event_ids) == 1  # every attempt carried the same message
        verify_vapid(push_service.to("ana")[-1], vapid, push_service.origin)
