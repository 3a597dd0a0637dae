"""`reservo up` settles results while its API is saturated with them.

One process runs the API and every background role. When the roles ran on the
API's event loop and database pool, a burst of result webhooks starved them:
each loop turn ran every ready request and one step of each role, and the roles
queued for connections behind the requests, so settlement went at a quarter of
the intake and the lag grew for as long as the burst lasted
(bench/results_intake, docs/BENCHMARKS.md). Here closed-loop clients post
signed results as fast as `reservo up` answers them; when they stop, most of
what was accepted must already be settled (the rest is the last seconds' lag),
and every accepted result settles, each winner paid once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg

from reservo.core.http.auth import sign_webhook
from reservo.settings import Settings
from tests.helpers.auth import RESULTS_SECRET
from tests.helpers.procs import env_for, free_port, running, wait_http

MATCHES = 20_000  # more than the burst can post: every request is a new match
CLIENTS = 32
BURST_S = 12.0
# Settled by the burst's end, of what it accepted: 0.23 with the roles on the
# API's loop (measured here on a loaded 2-core machine; 83 of 341 results/s in
# bench/results_intake), 0.8 on their own thread.
SETTLED_SHARE = 0.5
PATH = "/api/webhooks/match-results"


async def seed(url: str) -> None:
    """MATCHES started matches, one pending single on each (1X2 HOME at 2.00)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
            SELECT NULL::bigint, 'EUR', 'WORLD', 0, now()
            UNION ALL SELECT NULL, 'EUR', 'HOUSE', g, now() FROM generate_series(0, 7) g;
            INSERT INTO wallet_account (owner_id, currency, created_at)
            SELECT 7000000 + g, 'EUR', now() FROM generate_series(1, 100) g;
            INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
            SELECT 'share-' || g, 'H', 'A', now() - interval '2 hours',
                   '{{"1X2": {{"HOME": "2.00", "DRAW": "3.00", "AWAY": "4.00"}}}}'::jsonb, now()
              FROM generate_series(1, {MATCHES}) g;
            """
        )
        await conn.execute(
            """
            WITH m AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM betting_match),
                 a AS (SELECT id, owner_id, row_number() OVER (ORDER BY id) - 1 AS k
                         FROM wallet_account WHERE kind = 'CUSTOMER'),
                 b AS (INSERT INTO betting_bet (account_id, owner_id, currency, stake,
                                                potential_payout, created_at, legs)
                       SELECT a.id, a.owner_id, 'EUR', 100, 200, now(), 1
                         FROM m JOIN a ON a.k = m.n % 100
                        ORDER BY m.n
                       RETURNING id)
            INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
            SELECT b.id, m.id, '1X2', 'HOME', 2.00
              FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM b) b
              JOIN m USING (n)
            """
        )
    finally:
        await conn.close()


def request(g: int, port: int, t: int) -> bytes:
    """Match g's result, signed: home wins every other match."""
    body = (
        f'{{"matchExternalId":"share-{g}","homeScore":{g % 2},"awayScore":0,'
        f'"status":"FINISHED","providerEventId":"share-{g}"}}'
    ).encode()
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"X-Signature: {sign_webhook(RESULTS_SECRET, body, t)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def burst(port: int, seconds: float) -> list[int]:
    """CLIENTS connections post results back to back for ``seconds``; returns the
    matches whose result was answered 202 (raw streams: a light client)."""
    t, until = int(time.time()), time.monotonic() + seconds
    ids = iter(range(1, MATCHES + 1))
    accepted: list[int] = []

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for g in ids:
                if time.monotonic() >= until:
                    return
                writer.write(request(g, port, t))
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line[15:])
                    for line in head.split(b"\r\n")
                    if line[:15].lower() == b"content-length:"
                )
                await reader.readexactly(length)
                if head[9:12] == b"202":
                    accepted.append(g)
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return accepted


async def settled(conn: asyncpg.Connection, accepted: list[int]) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM betting_match WHERE settlement_status = 'SETTLED'"
            " AND external_id = ANY($1::text[])",
            [f"share-{g}" for g in accepted],
        )
    )


async def test_up_settles_while_its_api_is_saturated_with_results(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    settings = base_settings.with_(database_url=own_database)
    port = free_port()
    log = tmp_path / "up.log"
    env = env_for(settings, RESERVO_BETTING_RESEND_INTERVAL_S="0.1")
    with running(["up", "--port", str(port)], env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        await seed(own_database)
        accepted = await burst(port, BURST_S)
        conn = await asyncpg.connect(own_database)
        try:
            done = await settled(conn, accepted)
            assert len(accepted) > 500, log.read_text()[-3000:]
            share = done / len(accepted)
            assert share >= SETTLED_SHARE, (done, len(accepted), share)
            deadline = time.monotonic() + 60
            while done < len(accepted) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                done = await settled(conn, accepted)
            assert done == len(accepted)
            paid = await conn.fetchrow(
                """SELECT count(*) AS credits, count(DISTINCT reference) AS bets
                     FROM wallet_transfer WHERE kind = 'PAYOUT'"""
            )
            winners = sum(1 for g in accepted if g % 2 == 1)
            assert paid["credits"] == paid["bets"] == winners
        finally:
            await conn.close()
