"""No accepted result disappears: the webhook's 202 means the result is applied to
its match, kept until the match exists, or parked as a dead letter for an
operator. A result that comes before its match is applied when the match is
created; the same providerEventId sent again after that is a no-op; a result that
conflicts with the one a match settled on is parked (replay refuses it while the
conflict stands). These run on the PostgreSQL fallback path (no Kafka); the
Kafka path is tests/integration/kafka/test_betting_kafka.py."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import hypothesis
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reservo.betting.events import result_event_id
from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core.db.migrate import available, migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from tests.helpers.auth import ADMIN, auth
from tests.helpers.betting import (
    ODDS,
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.helpers.databases import DatabaseAt
from tests.helpers.waiting import drain

SETTLEMENT = {"consumer": "betting.settlement"}


async def create_match(
    client: httpx.AsyncClient, external_id: str, starts_in: timedelta = -timedelta(hours=2)
) -> httpx.Response:
    """POST /api/matches for ``external_id`` (by default started two hours ago, so
    a final result may apply)."""
    return await client.post(
        "/api/matches",
        json={
            "externalId": external_id,
            "home": "Arsenal",
            "away": "Chelsea",
            "startsAt": (datetime.now(UTC) + starts_in).isoformat(),
            "odds": ODDS,
        },
        headers=ADMIN,
    )


async def settle_all(c: Container) -> None:
    await drain(c.module(Betting).resender, c.module(Outbox).relay)


async def outcome(db: asyncpg.Connection, event: str) -> str | None:
    got = await db.fetchval(
        "SELECT outcome FROM betting_result_inbox WHERE provider_event_id = $1", event
    )
    return None if got is None else str(got)


async def letters_of(client: httpx.AsyncClient, event: str) -> list[dict[str, Any]]:
    """The settlement consumer's dead letters of ``event``, as an operator lists them."""
    r = await client.get(
        "/api/ops/dead-letters", params={**SETTLEMENT, "limit": 100}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    wanted = str(result_event_id(event))
    return [d for d in r.json()["items"] if d["eventId"] == wanted]


async def test_a_result_before_its_match_is_applied_when_the_match_is_created(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """(a) UNKNOWN_MATCH: the result was answered 202 and then dropped."""
    external_id = f"before-{uuid.uuid4()}"
    event = f"prov-{uuid.uuid4()}"
    r = await post_result(client, result_body(external_id, 3, 1, event=event))
    assert r.status_code == 202, r.text
    await settle_all(container)
    assert await outcome(db, event) == "AWAITING_MATCH"
    kept = await db.fetchval(
        "SELECT payload->>'providerEventId' FROM betting_pending_result"
        " WHERE match_external_id = $1",
        external_id,
    )
    assert kept == event

    created = await create_match(client, external_id)
    assert created.status_code == 201, created.text
    match = created.json()
    # Applied in the creating transaction: the match is born with its result,
    # settled (it has no bet: none can be placed on a match with a result).
    result = {"status": "FINISHED", "homeScore": 3, "awayScore": 1, "providerEventId": event}
    assert match["result"] == result
    assert match["settlement"] == {"status": "SETTLED", "pendingBets": 0, "settledBets": 0}
    got = await client.get(f"/api/matches/{match['id']}", headers=ADMIN)
    assert got.json()["result"] == result
    assert await outcome(db, event) == "APPLIED"
    assert not await db.fetchval(
        "SELECT count(*) FROM betting_pending_result WHERE match_external_id = $1", external_id
    )
    account, owner = await make_account(client, 500)
    refused = await place(client, account, owner, 100, [(match["id"], "1X2", "HOME")])
    assert (refused.status_code, refused.json()["code"]) == (409, "match_closed")


async def test_the_same_event_sent_again_after_a_drop_is_applied_not_deduplicated(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """(b) The dedup remembered an event whose result was never applied, so its
    resend changed nothing: the match stayed OPEN and its bets pending."""
    # Through the webhook: before its match, then the match, then the same event again.
    external_id = f"before-{uuid.uuid4()}"
    event = f"prov-{uuid.uuid4()}"
    body = result_body(external_id, 0, 2, event=event)
    assert (await post_result(client, body)).status_code == 202
    await settle_all(container)
    created = await create_match(client, external_id)
    assert created.status_code == 201, created.text
    assert (await post_result(client, body)).status_code == 202
    await settle_all(container)
    row = await db.fetchrow(
        "SELECT result_event_id, away_score, settlement_status FROM betting_match"
        " WHERE external_id = $1",
        external_id,
    )
    assert tuple(row) == (event, 2, "SETTLED")
    assert await outcome(db, event) == "APPLIED"

    # An event the code before this change dropped (its inbox row says
    # UNKNOWN_MATCH) for a match that has since been created and taken bets: the
    # provider's (or an admin's) resend settles them.
    match = await make_match(client, timedelta(minutes=1))
    account, owner = await make_account(client, 1_000)
    bet = await place(client, account, owner, 100, [(match["id"], "1X2", "HOME")])
    assert bet.status_code == 201, bet.text
    dropped = f"prov-{uuid.uuid4()}"
    await db.execute(
        "INSERT INTO betting_result_inbox (provider_event_id, match_external_id, outcome,"
        " received_at) VALUES ($1, $2, 'UNKNOWN_MATCH', now())",
        dropped,
        match["externalId"],
    )
    kick_off(clock, match)
    r = await post_result(client, result_body(match["externalId"], 2, 0, event=dropped), clock)
    assert r.status_code == 202, r.text
    await settle_all(container)
    status = await db.fetchval("SELECT status FROM betting_bet WHERE id = $1", bet.json()["id"])
    assert status == "WON"
    assert await outcome(db, dropped) == "APPLIED"


async def test_a_conflicting_result_for_a_settled_match_is_parked_for_an_operator(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """(c) DUPLICATE_MATCH: a different result for a settled match was dropped."""
    match = await make_match(client, timedelta(minutes=1))
    account, owner = await make_account(client, 1_000)
    bet = await place(client, account, owner, 100, [(match["id"], "1X2", "HOME")])
    assert bet.status_code == 201, bet.text
    kick_off(clock, match)
    first = f"prov-{uuid.uuid4()}"
    r = await post_result(client, result_body(match["externalId"], 2, 1, event=first), clock)
    assert r.status_code == 202, r.text
    await settle_all(container)

    conflicting = f"prov-{uuid.uuid4()}"
    body = result_body(match["externalId"], 0, 3, event=conflicting)
    r = await post_result(client, body, clock)
    assert r.status_code == 202, r.text
    await settle_all(container)
    letters = await letters_of(client, conflicting)
    assert len(letters) == 1, letters
    letter = letters[0]
    assert letter["topic"] == "betting.match.result-reported.v1"
    assert letter["replayedAt"] is None
    assert "already has the result" in letter["error"]
    assert await outcome(db, conflicting) == "PARKED"
    # The match stays as it settled; the bet is not regraded.
    row = await db.fetchrow(
        "SELECT result_event_id, home_score, away_score, settlement_status FROM betting_match"
        " WHERE id = $1",
        match["id"],
    )
    assert tuple(row) == (first, 2, 1, "SETTLED")
    status = await db.fetchval("SELECT status FROM betting_bet WHERE id = $1", bet.json()["id"])
    assert status == "WON"

    # Sent again: still one letter. The same result under another event: a no-op.
    assert (await post_result(client, body, clock)).status_code == 202
    same = f"prov-{uuid.uuid4()}"
    r = await post_result(client, result_body(match["externalId"], 2, 1, event=same), clock)
    assert r.status_code == 202, r.text
    await settle_all(container)
    assert len(await letters_of(client, conflicting)) == 1
    assert await letters_of(client, same) == []
    assert await outcome(db, same) == "SAME_RESULT"

    # A replay: the consumer refuses it again while the match has another
    # result; the letter stays parked with the new attempt.
    r = await client.post(f"/api/ops/dead-letters/{letter['id']}/replay", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "not_replayable"), r.text
    (after,) = await letters_of(client, conflicting)
    assert (after["replayedAt"], after["attempts"]) == (None, 2)
    assert (
        await db.fetchval("SELECT result_event_id FROM betting_match WHERE id = $1", match["id"])
        == first
    )
    got = await client.get(f"/api/bets/{bet.json()['id']}", headers=auth("bettor", owner))
    assert got.json()["status"] == "WON"


async def test_a_kept_final_result_for_a_match_created_to_start_later_is_parked(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """A final result kept for a match then created to start later (the
    intake refuses one outright when the match exists) is parked, not applied:
    the match stays open. Its replay after kick-off applies it."""
    external_id = f"before-{uuid.uuid4()}"
    event = f"prov-{uuid.uuid4()}"
    assert (
        await post_result(client, result_body(external_id, 1, 1, event=event))
    ).status_code == 202
    await settle_all(container)
    created = await create_match(client, external_id, timedelta(minutes=1))
    assert created.status_code == 201, created.text
    assert created.json()["result"] is None
    assert created.json()["settlement"]["status"] == "OPEN"
    (letter,) = await letters_of(client, event)
    assert "no result yet" in letter["error"]
    assert await outcome(db, event) == "PARKED"

    r = await client.post(f"/api/ops/dead-letters/{letter['id']}/replay", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "not_replayable"), r.text
    kick_off(clock, created.json())
    r = await client.post(f"/api/ops/dead-letters/{letter['id']}/replay", headers=ADMIN)
    assert r.status_code == 200, r.text
    row = await db.fetchrow(
        "SELECT result_event_id, settlement_status FROM betting_match WHERE external_id = $1",
        external_id,
    )
    assert tuple(row) == (event, "SETTLED")
    assert await outcome(db, event) == "APPLIED"


async def test_match_creation_racing_results_applies_one_result_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """The creation of a match and more results for it, released together: the
    result kept first is applied, once; every other one is the same result or
    parked, and none is left kept for a match that exists."""
    settlement = container.module(Betting).settlement
    rounds, racers = 15, 4
    for _ in range(rounds):
        external_id = f"race-{uuid.uuid4()}"
        first = f"prov-{uuid.uuid4()}"
        assert (
            await post_result(client, result_body(external_id, 1, 0, event=first))
        ).status_code == 202
        await settle_all(container)
        # Half the racers report the same result, half another one.
        bodies = [
            orjson.loads(result_body(external_id, 1, i % 2, event=f"prov-{uuid.uuid4()}"))
            for i in range(racers)
        ]
        barrier = asyncio.Barrier(racers + 1)

        async def create(barrier: asyncio.Barrier, external_id: str) -> httpx.Response:
            await barrier.wait()
            return await create_match(client, external_id)

        async def report(barrier: asyncio.Barrier, payload: dict[str, Any]) -> None:
            await barrier.wait()
            async with container.db.transaction() as conn:
                match_id = await settlement.accept_in_tx(conn, payload)
            if match_id is not None:
                await settlement.settle(match_id)

        creating = asyncio.create_task(create(barrier, external_id))
        await asyncio.gather(*(report(barrier, b) for b in bodies))
        created = await creating
        assert created.status_code == 201, created.text
        row = await db.fetchrow(
            "SELECT result_event_id, settlement_status FROM betting_match WHERE external_id = $1",
            external_id,
        )
        assert tuple(row) == (first, "SETTLED")
        assert not await db.fetchval(
            "SELECT count(*) FROM betting_pending_result WHERE match_external_id = $1", external_id
        )
        outcomes = {b["providerEventId"]: await outcome(db, b["providerEventId"]) for b in bodies}
        for b in bodies:
            expected = "SAME_RESULT" if b["awayScore"] == 0 else "PARKED"
            assert outcomes[b["providerEventId"]] == expected, (b, outcomes)
        assert await outcome(db, first) == "APPLIED"
        parked = await db.fetchval(
            "SELECT count(*) FROM dead_letter WHERE consumer = 'betting.settlement'"
            " AND event_id = ANY($1::uuid[])",
            [result_event_id(b["providerEventId"]) for b in bodies],
        )
        assert parked == racers // 2


# -- the property: every result answered 202 is applied, kept or parked ----------------


def same_result(settled: tuple[Any, ...], reported: tuple[Any, ...]) -> bool:
    """The model: a second report changes nothing when it says the same; a
    cancelled match has no score to compare."""
    return settled[0] == reported[0] and (settled[0] == "CANCELLED" or settled == reported)


# One step of a provider and an operator: a result (match, score, a new event or
# the n-th one sent before again), the creation of a match, or the workers catching up.
_step = st.one_of(
    st.tuples(
        st.just("result"),
        st.integers(0, 2),
        st.sampled_from([(1, 0), (2, 2), None]),  # None: CANCELLED
        st.one_of(st.none(), st.integers(0, 20)),
    ),
    st.tuples(st.just("create"), st.integers(0, 2)),
    st.tuples(st.just("drain")),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(_step, min_size=1, max_size=14))
async def test_no_accepted_result_disappears(
    client: httpx.AsyncClient,
    container: Container,
    db: asyncpg.Connection,
    steps: list[tuple[Any, ...]],
) -> None:
    run = uuid.uuid4().hex[:8]
    externals = [f"p-{run}-{i}" for i in range(3)]
    sent: list[dict[str, Any]] = []  # every body answered 202, in order
    created: set[str] = set()
    for step in steps:
        if step[0] == "result":
            _, m, score, again = step
            if again is not None and sent:
                body = sent[again % len(sent)]  # the same event, sent again
            else:
                home, away = score or (0, 0)
                status = "CANCELLED" if score is None else "FINISHED"
                body = orjson.loads(
                    result_body(externals[m], home, away, status, f"prov-{uuid.uuid4()}")
                )
            r = await post_result(client, orjson.dumps(body))
            assert r.status_code == 202, r.text
            sent.append(body)
        elif step[0] == "create":
            external_id = externals[step[1]]
            r = await create_match(client, external_id)
            if external_id in created:
                assert (r.status_code, r.json()["code"]) == (409, "match_exists")
            else:
                assert r.status_code == 201, r.text
                created.add(external_id)
        else:
            await settle_all(container)
    await settle_all(container)

    first_of: dict[str, str] = {}  # the first event sent for each match: its result
    for body in sent:
        first_of.setdefault(body["matchExternalId"], body["providerEventId"])
    for body in sent:
        event, external_id = body["providerEventId"], body["matchExternalId"]
        reported = (body["status"], body["homeScore"], body["awayScore"])
        got = await outcome(db, event)
        match = await db.fetchrow(
            "SELECT result_event_id, result_status, home_score, away_score FROM betting_match"
            " WHERE external_id = $1",
            external_id,
        )
        kept_text = await db.fetchval(
            "SELECT payload::text FROM betting_pending_result WHERE provider_event_id = $1", event
        )
        kept = None if kept_text is None else orjson.loads(kept_text)
        letter = await db.fetchval(
            "SELECT replayed_at IS NULL FROM dead_letter"
            " WHERE consumer = 'betting.settlement' AND event_id = $1",
            result_event_id(event),
        )
        where = (body, got, match and tuple(match), kept, letter)
        hypothesis.event(f"outcome {got}")  # --hypothesis-show-statistics: what ran
        if match is None:
            assert (got, kept) == ("AWAITING_MATCH", body), where
            continue
        assert kept is None, where
        # First result wins: the first report of a match, before it or not, is its result.
        assert match["result_event_id"] == first_of[external_id], where
        settled = (match["result_status"], match["home_score"], match["away_score"])
        if got == "APPLIED":
            assert match["result_event_id"] == event, where
        elif got == "SAME_RESULT":
            assert same_result(settled, reported), where
        else:
            assert got == "PARKED" and letter is True, where
            assert not same_result(settled, reported), where


async def test_the_migration_keeps_the_dropped_results_the_fallback_table_still_holds(
    database_at: DatabaseAt,
) -> None:
    """The migration that brings betting_pending_result: a result the former
    code dropped as UNKNOWN_MATCH whose body the fallback table still holds, for
    a match still not created, is kept for its match; the others stay as they
    were (decided again when resent)."""
    ours = next(m.version for m in available() if m.name == "betting_pending_results")
    url = await database_at(ours - 1)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)"
            " VALUES ('exists', 'a', 'b', now(), '{}', now())"
        )
        legacy = [  # (match, event, outcome, home score of its body; None: no body left)
            ("gone-1", "e1", "UNKNOWN_MATCH", 1),
            ("gone-1", "e2", "UNKNOWN_MATCH", 2),
            ("exists", "e3", "UNKNOWN_MATCH", 1),  # its match was created since
            ("gone-2", "e4", "UNKNOWN_MATCH", None),  # pruned from the fallback table
            ("exists", "e5", "DUPLICATE_MATCH", 1),
        ]
        for n, (external_id, event, dropped, home) in enumerate(legacy):
            await conn.execute(
                "INSERT INTO betting_result_inbox"
                " VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
                event,
                external_id,
                dropped,
                n,
            )
            for _ in range(2 if home is not None else 0):  # posted twice: two rows
                await conn.execute(
                    "INSERT INTO webhook_events_fallback (id, provider_event_id, payload,"
                    " created_at, status) VALUES ($1, $2, $3::text::jsonb, now(), 'RESENT')",
                    uuid.uuid4(),
                    event,
                    result_body(external_id, home or 0, 0, event=event).decode(),
                )
        await migrate(url)
        kept = await conn.fetch(
            "SELECT provider_event_id, match_external_id, (payload->>'homeScore')::int"
            " FROM betting_pending_result ORDER BY id"
        )
        assert [tuple(r) for r in kept] == [("e1", "gone-1", 1), ("e2", "gone-1", 2)]
        outcomes = await conn.fetch(
            "SELECT provider_event_id, outcome FROM betting_result_inbox ORDER BY 1"
        )
        assert [tuple(r) for r in outcomes] == [
            ("e1", "AWAITING_MATCH"),
            ("e2", "AWAITING_MATCH"),
            ("e3", "UNKNOWN_MATCH"),
            ("e4", "UNKNOWN_MATCH"),
            ("e5", "DUPLICATE_MATCH"),
        ]
    finally:
        await conn.close()
