"""The accounts both wallet benchmarks start from: one world and eight house
accounts, and ``accounts`` customers funded by real deposits (a transfer and two
entries each), written by SQL alone so that any version of the schema since the
wallet's first release loads it (before/after pairs run older code)."""

from __future__ import annotations

import asyncpg


async def seed(url: str, accounts: int, balance: int) -> list[int]:
    conn = await asyncpg.connect(url)
    await conn.execute(
        f"""INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
            SELECT NULL::bigint, 'EUR', 'WORLD', 0, now()
            UNION ALL SELECT NULL, 'EUR', 'HOUSE', g, now() FROM generate_series(0, 7) g;
            INSERT INTO wallet_account (owner_id, currency, created_at)
            SELECT 5000000 + g, 'EUR', now() FROM generate_series(1, {accounts}) g;"""
    )
    world = await conn.fetchval("SELECT id FROM wallet_account WHERE kind = 'WORLD'")
    # Seed balances as real deposits (a transfer and two entries each).
    await conn.execute(
        f"""WITH t AS (
              INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id,
                                           amount, created_at)
              SELECT 'DEPOSIT', 'seed-' || id, {world}, id, {balance}, now()
                FROM wallet_account WHERE kind = 'CUSTOMER'
              RETURNING id, to_account_id, amount)
            INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind,
                                      reference, created_at)
            SELECT to_account_id, id, amount, amount, 'DEPOSIT', 'seed', now() FROM t
            UNION ALL
            SELECT {world}, id, -amount, -{balance}::bigint * (row_number() OVER (ORDER BY id)),
                   'DEPOSIT', 'seed', now() FROM t;
            UPDATE wallet_account SET balance = {balance} WHERE kind = 'CUSTOMER';
            UPDATE wallet_account SET balance = -{balance}::bigint * {accounts}
             WHERE id = {world};"""
    )
    await conn.execute("VACUUM ANALYZE")
    ids = [
        r["id"] for r in await conn.fetch("SELECT id FROM wallet_account WHERE kind = 'CUSTOMER'")
    ]
    await conn.close()
    return ids
