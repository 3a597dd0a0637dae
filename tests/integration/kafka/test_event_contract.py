"""The event contract as an adopting team checks it, with the ecosystem's own tools:
a mixed run (bookings with reschedules and a cancel, a waitlist, a rental hold
paid and cancelled, bets settled and paid out) goes through the API onto Kafka;
a stock client (confluent-kafka, librdkafka) reads every record; the official
CloudEvents SDK parses each one (Kafka binding, binary mode); jsonschema checks
each payload against the AsyncAPI document the service serves; and each
aggregate's records sit in one partition in the order the outbox wrote them.

The stock client reads by assignment (what ``kcat -C`` does). Tansu, the
embedded broker, holds a librdkafka group join open for the whole rebalance
timeout (see docs/OPERATIONS.md, "Subscribing to events")."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest

from reservo.app import create_app
from reservo.appointments import events as appointment_events
from reservo.betting.domain import Leg
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build, run_workers
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots, reschedule, wait
from tests.helpers.auth import auth, new_id
from tests.helpers.betting import kick_off, make_account, make_match, post_result, result_body
from tests.helpers.rentals import at, hold, make_car, webhook
from tests.helpers.waiting import wait_until

ck = pytest.importorskip("confluent_kafka", reason="dev extra: confluent-kafka")
ce_kafka = pytest.importorskip("cloudevents.core.bindings.kafka", reason="dev extra: cloudevents")
ce_json = pytest.importorskip("cloudevents.core.formats.json")
jsonschema = pytest.importorskip("jsonschema", reason="dev extra: jsonschema")

BETTORS = 6
# The stock reader stops after this long without a new record.
IDLE_S = 3.0


@pytest.fixture
async def kafka_container(
    base_settings: Settings, kafka_bootstrap: str, kafka_database_url: str
) -> AsyncIterator[Container]:
    settings = base_settings.with_(
        database_url=kafka_database_url,
        kafka_bootstrap=kafka_bootstrap,
        kafka_idempotence=False,
        kafka_group_prefix=f"contract-{uuid.uuid4().hex[:6]}",
        wallet_house_shards=4,
    )
    c = build(settings, OffsetClock())
    yield c
    await c.close()


async def _mixed_run(client: httpx.AsyncClient, c: Container) -> dict[str, Any]:
    """Drive every module through HTTP; returns what the checks look for."""
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    me = auth("patient", patient)
    first = (await book(client, slots[0]["id"], patient)).json()
    moved = (await reschedule(client, first["id"], slots[2]["id"], me)).json()
    moved_again = (await reschedule(client, moved["id"], slots[3]["id"], me)).json()
    r = await client.delete(f"/api/appointments/{moved_again['id']}", headers=me)
    assert r.status_code == 200, r.text
    # A waitlist: the holder cancels, the waiting patient gets the seat.
    holder, waiting = new_id(), new_id()
    held = (await book(client, slots[1]["id"], holder)).json()
    assert (await wait(client, slots[1]["id"], waiting)).status_code == 201
    r = await client.delete(f"/api/appointments/{held['id']}", headers=auth("patient", holder))
    assert r.status_code == 200, r.text
    # A rental: held, paid, cancelled (a refund).
    car = await make_car(client)
    customer = new_id()
    r = await hold(client, car["id"], customer, at(200), at(224))
    assert r.status_code == 201, r.text
    booking = r.json()
    w = await webhook(client, c.clock, booking["bookingId"], booking["depositAmount"])
    assert w.status_code == 200, w.text
    r = await client.post(
        f"/api/bookings/{booking['bookingId']}/cancel",
        headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 200, r.text
    # Bets on two matches, settled and paid out.
    matches = [await make_match(client, starts_in=timedelta(minutes=30)) for _ in range(2)]
    accounts = [await make_account(client, 1_000) for _ in range(BETTORS)]
    for i, (account, _) in enumerate(accounts):
        for m in matches:
            pick, odds = ("OVER", "1.95") if i % 2 == 0 else ("UNDER", "1.85")
            await c.module(Betting).service.place_bet(
                account, 100, [Leg(m["id"], "TOTALS_2_5", pick, Decimal(odds))]
            )
    kick_off(c.clock, *matches)
    for m in matches:
        r = await post_result(client, result_body(m["externalId"], 3, 2), c.clock)
        assert r.status_code == 202, r.text
    return {
        "chain": f"appointment:{first['id']}",
        "waitlisted": waiting,
        "booking": f"booking:{booking['bookingId']}",
        "matches": [f"match:{m['externalId']}" for m in matches],
        "accounts": [a for a, _ in accounts],
    }


async def _settled(c: Container, accounts: list[int], matches: list[str]) -> bool:
    async with c.db.connection() as conn:
        pending = await conn.fetchval("SELECT count(*) FROM outbox WHERE status <> 'DONE'")
        # Each match's settled list written (the payouts are credited by the
        # settlement's own transactions, so they can be complete before the
        # last settled list is written).
        settled_lists = await conn.fetchval(
            "SELECT count(DISTINCT key) FROM outbox WHERE key = ANY($1)", matches
        )
        paid = await conn.fetchval(
            "SELECT count(*) FROM wallet_transfer t JOIN wallet_account a"
            " ON a.id = t.to_account_id WHERE t.kind = 'PAYOUT' AND a.id = ANY($1)",
            accounts,
        )
    # Half the bettors picked OVER (3-2 is over 2.5): one payout per match each.
    return pending == 0 and settled_lists == len(matches) and paid == 2 * ((BETTORS + 1) // 2)


def _read_all(bootstrap: str, topics: list[str]) -> list[Any]:
    """Every record of ``topics``, by a stock librdkafka consumer (assignment)."""
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "stock-reader", "enable.auto.commit": False}
    )
    try:
        meta = consumer.list_topics(timeout=10)
        parts = [ck.TopicPartition(t, p) for t in topics for p in sorted(meta.topics[t].partitions)]
        consumer.assign(
            [ck.TopicPartition(tp.topic, tp.partition, ck.OFFSET_BEGINNING) for tp in parts]
        )
        # Until nothing more comes (every event is acked before this runs). Not
        # up to the high watermarks: Tansu's lag behind what it has acked.
        by_position: dict[tuple[str, int, int], Any] = {}
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < IDLE_S:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            by_position[(msg.topic(), msg.partition(), msg.offset())] = msg
            idle_since = time.monotonic()
        offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
        for topic, partition, offset in sorted(by_position):
            offsets[(topic, partition)].append(offset)
        for tp, got in offsets.items():
            assert got == list(range(len(got))), f"a gap in {tp}"
        return [by_position[p] for p in sorted(by_position)]
    finally:
        consumer.close()


async def test_a_stock_client_reads_valid_cloudevents_in_per_aggregate_order(
    kafka_container: Container, kafka_bootstrap: str
) -> None:
    c = kafka_container
    app = create_app(c, owns_container=False)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        run_workers(c, ["relay", "betting.settlement", "wallet.payouts"], stop)
    )
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            run = await _mixed_run(client, c)
            await wait_until(
                lambda: _settled(c, run["accounts"], run["matches"]), 90, "the run to settle"
            )
            document = (await client.get("/asyncapi.json")).json()
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)

    channels = {ch["address"]: ch for ch in document["channels"].values()}
    messages = document["components"]["messages"]
    by_type = {m["x-cloudevents-type"]: m for m in messages.values()}
    records = await asyncio.to_thread(_read_all, kafka_bootstrap, sorted(channels))

    # Every record: a valid CloudEvent (official SDK), its payload valid (AsyncAPI).
    seen: dict[str, list[tuple[str, int, int, str, dict[str, Any]]]] = defaultdict(list)
    for msg in records:
        headers = {k: v for k, v in msg.headers() or []}
        assert headers["content-type"] == b"application/json"
        event = ce_kafka.from_binary(
            ce_kafka.KafkaMessage(headers=headers, key=msg.key(), value=msg.value()),
            ce_json.JSONFormat(),
        )
        assert event.get_specversion() == "1.0"
        assert event.get_type().startswith("dev.reservo.")
        spec = by_type[event.get_type()]
        assert f"#/components/messages/{_ident(spec['name'])}" in str(
            channels[msg.topic()]["messages"]
        ), (msg.topic(), event.get_type())
        jsonschema.Draft202012Validator.check_schema(spec["payload"])
        jsonschema.validate(event.get_data(), spec["payload"])
        key = msg.key().decode()
        assert event.get_extension("partitionkey") == key == headers["ce_partitionkey"].decode()
        seen[key].append(
            (msg.topic(), msg.partition(), msg.offset(), event.get_id(), event.get_data())
        )

    # One aggregate, one topic and one partition, in the order the outbox wrote it.
    async with c.db.connection() as conn:
        for key, items in seen.items():
            assert len({(t, p) for t, p, *_ in items}) == 1, key
            in_offsets = [i for _, _, _, i, _ in sorted(items, key=lambda x: x[2])]
            written = await conn.fetch(
                "SELECT event_id::text FROM outbox WHERE key = $1 ORDER BY id",
                key,
            )
            if key.startswith("accounts:"):
                # Two matches settle at once: their credits to one bucket are
                # written by concurrent transactions (no order between them to
                # keep; each is paid once), and leave in commit order, not id order.
                continue
            # (A match's result comes from the webhook straight to Kafka, not the outbox.)
            outbox_ids = [r[0] for r in written]
            assert [i for i in in_offsets if i in outbox_ids] == outbox_ids, key
        types = await conn.fetch(
            "SELECT topic FROM outbox WHERE key = $1 ORDER BY id", run["chain"]
        )
    # The appointment's whole life under its first appointment's key.
    assert [t[0] for t in types] == [
        appointment_events.BOOKED,
        appointment_events.RESCHEDULED,
        appointment_events.RESCHEDULED,
        appointment_events.CANCELLED,
    ]
    assert len(seen[run["booking"]]) == 4  # held, confirmed, cancelled, refund requested
    for match_key in run["matches"]:  # its result, then its settlement
        first_record = min(seen[match_key], key=lambda x: x[2])
        assert "matchExternalId" in first_record[4] and "bets" not in first_record[4]
        assert len(seen[match_key]) >= 2
    # Payouts are credited by the settlement's own transaction: where every
    # credit lands, no payout event leaves (it is the fallback of one that cannot).
    payout_events = [
        key
        for key, items in seen.items()
        if key.startswith("accounts:") and any("items" in data for *_, data in items)
    ]
    assert payout_events == []


def _ident(name: str) -> str:
    words = name.replace("-", ".").split(".")
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])
