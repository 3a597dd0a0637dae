"""POST /api/transfers as a group commit (wallet/batch.py): the transfers a
process receives together commit in one transaction, each answered exactly as
alone; a refusal in a batch is its own request's; a client cut off mid-flight
does not cancel the batch it joined; the database down is 503 and nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.bootstrap import Container
from reservo.core.http.auth import Principal
from reservo.core.http.batching import Outcome
from reservo.core.http.idempotency import IdempotencyStore, request_hash
from reservo.core.kernel.clock import SystemClock
from reservo.core.kernel.errors import DomainError
from reservo.wallet.api import render_transfer
from reservo.wallet.batch import Answer, TransferBatch, TransferRequest
from reservo.wallet.setup import Wallet
from tests.helpers.auth import auth, new_id
from tests.helpers.batching import (
    assert_all_unavailable,
    assert_grouped,
    assert_stored_and_replayed,
    unreachable_database,
)
from tests.helpers.betting import make_account
from tests.helpers.http import post_together

PAIRS = 40


async def _ledger_holds(db: asyncpg.Connection, accounts: list[int]) -> dict[int, int]:
    """Every account's balance is the sum of its entries, and each entry's
    balance_after is the running sum in id order; each transfer is two entries
    summing to zero. Returns the balances."""
    balances = dict(
        await db.fetch("SELECT id, balance FROM wallet_account WHERE id = ANY($1)", accounts)
    )
    for account in accounts:
        entries = await db.fetch(
            "SELECT amount, balance_after FROM wallet_entry WHERE account_id = $1 ORDER BY id",
            account,
        )
        running = 0
        for e in entries:
            running += e["amount"]
            assert e["balance_after"] == running, (account, list(map(tuple, entries)))
        assert running == balances[account]
    assert not await db.fetchval(
        """SELECT count(*) FROM (
               SELECT t.id FROM wallet_transfer t JOIN wallet_entry e ON e.transfer_id = t.id
                WHERE t.from_account_id = ANY($1)
                GROUP BY t.id HAVING count(*) <> 2 OR sum(e.amount) <> 0) x""",
        accounts,
    )
    return balances


async def test_transfers_released_together_commit_in_fewer_transactions(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    sources = [await make_account(client, 100) for _ in range(PAIRS)]
    targets = [await make_account(client, 0) for _ in range(PAIRS)]
    calls = []
    for (source, owner), (target, _) in zip(sources, targets, strict=True):
        body = {"fromAccountId": source, "toAccountId": target, "amount": 30}
        calls.append((body, {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}))
    responses = await post_together(client, "/api/transfers", calls)
    assert [r.status_code for r in responses] == [201] * PAIRS, [r.text for r in responses]
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == PAIRS
    await assert_grouped(db, "wallet_transfer", ids)
    # Each 201 is the transfer it names, and the key stored exactly that answer.
    for (body, headers), r in zip(calls, responses, strict=True):
        row = await db.fetchrow(
            "SELECT from_account_id, to_account_id, amount FROM wallet_transfer WHERE id = $1",
            r.json()["id"],
        )
        assert (row["from_account_id"], row["to_account_id"], row["amount"]) == (
            body["fromAccountId"],
            body["toAccountId"],
            30,
        )
        assert {k: r.json()[k] for k in body} == body
        await assert_stored_and_replayed(client, db, "/api/transfers", body, headers, r)
    accounts = [a for a, _ in sources] + [a for a, _ in targets]
    balances = await _ledger_holds(db, accounts)
    assert all(balances[a] == 70 for a, _ in sources)
    assert all(balances[a] == 30 for a, _ in targets)


async def test_refusals_in_a_batch_are_each_requests_own(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """One batch: good transfers, each kind of refusal, two debits of one account
    of which only one fits, and the same key twice. Each answer is the one the
    request gets alone; the refusals move nothing and the others are unaffected."""
    rich, rich_owner = await make_account(client, 1_000)
    poor, poor_owner = await make_account(client, 10)
    shared, shared_owner = await make_account(client, 100)
    sink, _ = await make_account(client, 0)
    usd = await client.post(
        "/api/accounts", json={"ownerId": new_id(), "currency": "USD"}, headers=auth("admin", 1)
    )
    foreign = int(usd.json()["id"])
    me = {
        rich: auth("bettor", rich_owner),
        poor: auth("bettor", poor_owner),
        shared: auth("bettor", shared_owner),
    }

    def call(source: int, target: int, amount: int, key: str | None = None) -> Any:
        body = {"fromAccountId": source, "toAccountId": target, "amount": amount}
        return body, {**me[source], "Idempotency-Key": key or str(uuid.uuid4())}

    dup = f"dup-{uuid.uuid4()}"
    calls = [
        call(rich, sink, 100),  # 201
        call(poor, sink, 11),  # 409 insufficient_funds
        call(rich, 2**62, 1),  # 404 account_not_found (target)
        call(rich, rich, 1),  # 422 same_account
        call(rich, foreign, 1),  # 409 currency_mismatch
        call(shared, sink, 60),  # one of these two fits, the other is refused
        call(shared, sink, 70),
        call(rich, sink, 5, dup),  # the same key twice: moves money once
        call(rich, sink, 5, dup),
        (call(rich, sink, 1)[0], {**me[poor], "Idempotency-Key": str(uuid.uuid4())}),  # 404
        call(poor, sink, 10),  # 201: poor's refused 11 did not take its money
    ]
    r = await post_together(client, "/api/transfers", calls)
    got = [(x.status_code, x.json().get("code")) for x in r]
    assert got[0] == (201, None)
    assert got[1] == (409, "insufficient_funds")
    assert r[1].json()["detail"] == f"account {poor} does not hold 11 EUR"
    assert got[2] == (404, "account_not_found")
    assert got[3] == (422, "same_account")
    assert got[4] == (409, "currency_mismatch")
    assert sorted(got[5:7]) == [(201, None), (409, "insufficient_funds")]
    assert sorted(s for s, _ in got[7:9]) == [200, 201]  # the duplicate waits, replays
    assert got[9] == (404, "account_not_found")  # not poor's: as if it did not exist
    assert got[10] == (201, None)
    dup_ids = {x.json()["id"] for x in r[7:9]}
    assert len(dup_ids) == 1
    # Every stored refusal replays as it was answered; the 404 was not stored.
    for (body, headers), x in zip(calls, r, strict=True):
        again = await client.post("/api/transfers", json=body, headers=headers)
        if x.status_code == 201:
            assert (again.status_code, again.json()) == (200, x.json())
        else:
            assert (again.status_code, again.json()) == (x.status_code, x.json())
    assert not await db.fetchval(
        "SELECT count(*) FROM idempotency_key WHERE key = $1",
        calls[9][1]["Idempotency-Key"],
    )
    moved_shared = 60 if got[5][0] == 201 else 70
    balances = await _ledger_holds(db, [rich, poor, shared, sink, foreign])
    assert balances == {
        rich: 1_000 - 100 - 5,
        poor: 0,
        shared: 100 - moved_shared,
        sink: 100 + 10 + moved_shared + 5,
        foreign: 0,
    }
    transfers = await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE to_account_id = $1", sink
    )
    assert transfers == 4


async def test_money_received_in_a_batch_can_be_spent_later_in_it(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Chains through one account in one batch: the batch applies in order on the
    balances it locked, and every entry's balance_after is its running sum."""
    accounts = [await make_account(client, 50) for _ in range(6)]
    calls = []
    for i in range(30):
        (source, owner), (target, _) = accounts[i % 6], accounts[(i * 5 + 1) % 6]
        if source == target:
            continue
        body = {"fromAccountId": source, "toAccountId": target, "amount": 20 + i}
        calls.append((body, {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}))
    responses = await post_together(client, "/api/transfers", calls)
    assert {r.status_code for r in responses} <= {201, 409}
    assert all(r.json()["code"] == "insufficient_funds" for r in responses if r.status_code == 409)
    ids = [a for a, _ in accounts]
    balances = await _ledger_holds(db, ids)
    assert sum(balances.values()) == 50 * 6 and min(balances.values()) >= 0
    created = [r.json()["id"] for r in responses if r.status_code == 201]
    assert await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE from_account_id = ANY($1)", ids
    ) == len(created)


def _request(source: int, target: int, owner: int, amount: int, key: str) -> TransferRequest:
    body = orjson.dumps({"fromAccountId": source, "toAccountId": target, "amount": amount})
    return TransferRequest(
        Principal(sub=owner, role="bettor"), key, request_hash(body), source, target, amount
    )


async def test_a_cut_off_request_does_not_cancel_its_batch(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    batch = container.module(Wallet).transfers
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    key = f"cut-{uuid.uuid4()}"
    task = asyncio.create_task(batch.submit(_request(source, target, owner, 40, key)))
    await asyncio.sleep(0)  # submitted: the request waits for its batch
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await batch.close()  # the batch it joined runs to its end
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    balances = await _ledger_holds(db, [source, target])
    assert balances == {source: 60, target: 40}
    # The retry learns what happened to it.
    again = await client.post(
        "/api/transfers",
        json={"fromAccountId": source, "toAccountId": target, "amount": 40},
        headers={**auth("bettor", owner), "Idempotency-Key": key},
    )
    assert (again.status_code, again.json()) == (200, orjson.loads(stored["response_body"]))


async def test_the_database_down_is_503_for_each_request_and_moves_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    down = unreachable_database()
    clock = SystemClock()
    batch = TransferBatch(down, clock, IdempotencyStore(down, clock), render_transfer)
    keys = [f"down-{uuid.uuid4()}" for _ in range(5)]
    results = await asyncio.gather(
        *(batch.submit(_request(source, target, owner, 10, k)) for k in keys),
        return_exceptions=True,
    )
    assert_all_unavailable(results)
    assert not await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = ANY($1)", keys)
    assert await _ledger_holds(db, [source, target]) == {source: 100, target: 0}
    await down.close()


class _DeadlockOnce(TransferBatch):
    """A batch whose first transaction dies of a deadlock after writing."""

    failed = False

    async def _once(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        if not self.failed:
            self.failed = True
            async with self.db.transaction() as conn:
                await conn.execute("UPDATE wallet_account SET balance = balance + 1000")
                raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
        return await super()._once(items)


async def test_a_batch_rolled_back_as_a_whole_is_run_again(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    batch = _DeadlockOnce(container.db, container.clock, container.idempotency, render_transfer)
    keys = [f"retry-{uuid.uuid4()}" for _ in range(3)]
    answers = await asyncio.gather(
        *(batch.submit(_request(source, target, owner, 10, k)) for k in keys)
    )
    assert batch.failed and batch.transactions == 2
    assert [a.status for a in answers] == [201] * 3
    assert await _ledger_holds(db, [source, target]) == {source: 70, target: 30}


class _MovedMeanwhile(TransferBatch):
    """A batch before whose locks other transfers commit: the balances it
    planned on are no longer the ones it locks."""

    locks = 0
    meanwhile: Any = None

    async def _lock(self, *args: Any) -> Any:
        self.locks += 1
        await self.meanwhile()
        return await super()._lock(*args)


async def test_a_balance_moved_between_plan_and_lock_is_decided_on_the_locked_one(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """The batch plans on balances read without a lock; transfers committed
    before it locks change them so that its funds checks decide otherwise. It
    answers what the rules give on the balances it locked: the debit that no
    longer fits is refused, the one that now fits is made."""
    spent, spent_owner = await make_account(client, 100)
    fed, fed_owner = await make_account(client, 10)
    feeder, feeder_owner = await make_account(client, 90)
    sink, _ = await make_account(client, 0)

    async def meanwhile() -> None:
        for source, owner, target, amount in (
            (spent, spent_owner, sink, 50),
            (feeder, feeder_owner, fed, 90),
        ):
            r = await client.post(
                "/api/transfers",
                json={"fromAccountId": source, "toAccountId": target, "amount": amount},
                headers={**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())},
            )
            assert r.status_code == 201, r.text

    batch = _MovedMeanwhile(container.db, container.clock, container.idempotency, render_transfer)
    batch.meanwhile = meanwhile
    keys = [f"moved-{uuid.uuid4()}" for _ in range(2)]
    results = await asyncio.gather(
        batch.submit(_request(spent, sink, spent_owner, 80, keys[0])),  # planned 201
        batch.submit(_request(fed, sink, fed_owner, 60, keys[1])),  # planned 409
        return_exceptions=True,
    )
    assert batch.locks == 1 and batch.transactions == 1  # planned again, not split
    refused, made = results
    assert isinstance(refused, DomainError) and refused.code == "insufficient_funds"
    assert isinstance(made, Answer) and made.status == 201
    stored = dict(
        await db.fetch("SELECT key, response_status FROM idempotency_key WHERE key = ANY($1)", keys)
    )
    assert stored == {keys[0]: 409, keys[1]: 201}
    assert await _ledger_holds(db, [spent, fed, feeder, sink]) == {
        spent: 50,
        fed: 40,
        feeder: 0,
        sink: 110,
    }


async def test_racing_processes_keep_the_bank_and_every_answer_true(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Two processes' batchers (as two API workers) and many clients released at
    once on a few accounts with little money, so batches meet on their locks and
    plan on balances the other moved: money is conserved, no balance goes
    negative, every ledger is exact, and every stored answer is what happened
    (a 201 names its transfer, a 409 moved nothing)."""
    clock = container.clock
    batches = [
        container.module(Wallet).transfers,
        TransferBatch(container.db, clock, container.idempotency, render_transfer),
    ]
    accounts = [await make_account(client, 100) for _ in range(6)]
    gate = asyncio.Event()
    calls: list[tuple[str, int, int, int]] = []
    for i in range(240):
        (source, _), (target, _) = accounts[i % 6], accounts[(i * 7 + 1) % 6]
        if source != target:
            calls.append((f"race-{uuid.uuid4()}", source, target, 15 + i % 40))

    async def one(n: int, key: str, source: int, target: int, amount: int) -> Any:
        await gate.wait()
        owner = dict(accounts)[source]
        request = _request(source, target, owner, amount, key)
        try:
            return await batches[n % 2].submit(request)
        except DomainError as err:
            return err

    tasks = [asyncio.create_task(one(n, *c)) for n, c in enumerate(calls)]
    await asyncio.sleep(0.05)
    gate.set()
    results = await asyncio.gather(*tasks)
    await batches[1].close()
    made = [r for r in results if isinstance(r, Answer)]
    refused = [r for r in results if isinstance(r, DomainError)]
    assert made and refused  # the race really decided both ways
    assert {r.status for r in made} == {201}
    assert {r.code for r in refused} == {"insufficient_funds"}
    ids = [a for a, _ in accounts]
    balances = await _ledger_holds(db, ids)
    assert sum(balances.values()) == 600 and min(balances.values()) >= 0
    stored = dict(
        await db.fetch(
            "SELECT key, response_status FROM idempotency_key WHERE key = ANY($1)",
            [c[0] for c in calls],
        )
    )
    for (key, source, target, amount), result in zip(calls, results, strict=True):
        assert stored[key] == (201 if isinstance(result, Answer) else 409)
        if isinstance(result, Answer):
            row = await db.fetchrow(
                "SELECT from_account_id, to_account_id, amount FROM wallet_transfer WHERE id = $1",
                result.body["id"],
            )
            assert tuple(row) == (source, target, amount)
    assert await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE from_account_id = ANY($1)", ids
    ) == len(made)


class _Counted(TransferBatch):
    """A batch that counts, on its own connection, the key rows it inserts and
    updates: from reading its keys to its locks, and in its write."""

    before_locks: tuple[int, int] | None = None
    in_write: tuple[int, int] | None = None
    _mark: tuple[int, int] = (0, 0)

    async def _keys(self, conn: asyncpg.Connection, *args: Any) -> Any:
        self._mark = await _key_writes(conn)
        return await super()._keys(conn, *args)

    async def _lock(self, conn: asyncpg.Connection, *args: Any) -> Any:
        self.before_locks, self._mark = await self._since(conn)
        return await super()._lock(conn, *args)

    async def _write(self, conn: asyncpg.Connection, *args: Any) -> None:
        await super()._write(conn, *args)
        self.in_write, self._mark = await self._since(conn)

    async def _since(self, conn: asyncpg.Connection) -> tuple[tuple[int, int], tuple[int, int]]:
        now = await _key_writes(conn)
        return (now[0] - self._mark[0], now[1] - self._mark[1]), now


async def _key_writes(conn: asyncpg.Connection) -> tuple[int, int]:
    """Rows of idempotency_key inserted and updated on this connection and not
    yet reported to the statistics (a running count: read differences)."""
    row = await conn.fetchrow(
        "SELECT pg_stat_get_xact_tuples_inserted('idempotency_key'::regclass) AS ins, "
        "pg_stat_get_xact_tuples_updated('idempotency_key'::regclass) AS upd"
    )
    return row["ins"], row["upd"]


async def test_a_batch_writes_each_key_once_after_its_locks(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A free key is not claimed before the transfer (nobody could see the
    claim: it commits with its answer): its row is inserted once, DONE, by the
    batch's write, never inserted and then updated."""
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    batch = _Counted(container.db, container.clock, container.idempotency, render_transfer)
    keys = [f"once-{uuid.uuid4()}" for _ in range(3)]
    answers = await asyncio.gather(
        *(batch.submit(_request(source, target, owner, 10, k)) for k in keys)
    )
    assert [a.status for a in answers] == [201] * 3 and batch.transactions == 1
    assert batch.before_locks == (0, 0)
    assert batch.in_write == (3, 0)
    stored = await db.fetch(
        "SELECT key, status, response_status, response_body FROM idempotency_key "
        "WHERE key = ANY($1)",
        keys,
    )
    assert {r["key"]: (r["status"], r["response_status"]) for r in stored} == {
        k: ("DONE", 201) for k in keys
    }
    assert sorted(orjson.loads(r["response_body"])["id"] for r in stored) == sorted(
        a.body["id"] for a in answers
    )
    assert await _ledger_holds(db, [source, target]) == {source: 70, target: 30}


class _Raced(TransferBatch):
    """A batch before whose locks another process's batch commits the same
    request under the same key (the key was free when this batch read it)."""

    rival: TransferBatch | None = None
    rival_answer: Answer | None = None
    request: TransferRequest | None = None

    async def _lock(self, *args: Any) -> Any:
        if self.rival is not None and self.rival_answer is None:
            assert self.request is not None
            self.rival_answer = await self.rival.submit(self.request)
        return await super()._lock(*args)


async def test_a_key_written_by_another_process_meanwhile_keeps_its_answer(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """The batch's write of a key another transaction wrote since the batch
    read it fails: nothing of the batch commits (no second transfer), and the
    request is answered, in the next batch, with the other's transfer."""
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    other_source, other_owner = await make_account(client, 100)
    key = f"race-{uuid.uuid4()}"
    request = _request(source, target, owner, 30, key)
    batch = _Raced(container.db, container.clock, container.idempotency, render_transfer)
    batch.rival = TransferBatch(
        container.db, container.clock, container.idempotency, render_transfer
    )
    batch.request = request
    other = _request(other_source, target, other_owner, 20, f"other-{uuid.uuid4()}")
    answer, other_answer = await asyncio.gather(batch.submit(request), batch.submit(other))
    assert batch.rival_answer is not None and batch.rival_answer.status == 201
    assert (answer.status, answer.body) == (200, batch.rival_answer.body)
    assert other_answer.status == 201  # decided again in the next batch, made once
    assert batch.transactions == 2
    stored = await db.fetch(
        "SELECT response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert [(r["response_status"], orjson.loads(r["response_body"])) for r in stored] == [
        (201, batch.rival_answer.body)
    ]
    assert await _ledger_holds(db, [source, other_source, target]) == {
        source: 70,
        other_source: 80,
        target: 50,
    }


async def test_a_claim_left_by_the_two_commit_path_is_409_then_taken_over(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A key claimed IN_PROGRESS by ``begin`` (the one-request flow) answers 409 (past
    the wait) while its lease runs; after it, the batch takes the claim over, makes the
    transfer and completes the claim with its answer (stored, replayed)."""
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    batch = container.module(Wallet).transfers
    key = f"leased-{uuid.uuid4()}"
    body = orjson.dumps({"fromAccountId": source, "toAccountId": target, "amount": 40})
    await container.idempotency.begin(str(owner), "POST /api/transfers", key, body)
    request = _request(source, target, owner, 40, key)
    with pytest.raises(DomainError) as busy:
        await batch.submit(request)
    assert busy.value.code == "request_in_progress"
    await db.execute(
        "UPDATE idempotency_key SET locked_until = locked_until - interval '1 hour' WHERE key = $1",
        key,
    )
    answer = await batch.submit(request)
    assert answer.status == 201
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    assert orjson.loads(stored["response_body"]) == answer.body
    again = await batch.submit(request)
    assert (again.status, again.body) == (200, answer.body)
    assert await _ledger_holds(db, [source, target]) == {source: 60, target: 40}
