"""A deposit's reference is unique per account, not across accounts: a 409
duplicate_reference must never tell one owner about another owner's reference."""

from __future__ import annotations

import uuid

import httpx

from tests.helpers.auth import ADMIN, SERVICE
from tests.helpers.betting import make_account


async def _deposit(
    client: httpx.AsyncClient, account: int, reference: str, key: str | None = None
) -> httpx.Response:
    return await client.post(
        f"/api/accounts/{account}/deposits",
        json={"amount": 100, "reference": reference},
        headers={**SERVICE, "Idempotency-Key": key or str(uuid.uuid4())},
    )


async def test_two_owners_may_use_the_same_reference(client: httpx.AsyncClient) -> None:
    mine, _ = await make_account(client, 0)
    theirs, _ = await make_account(client, 0)
    reference = f"invoice-{uuid.uuid4()}"
    first = await _deposit(client, mine, reference)
    second = await _deposit(client, theirs, reference)
    assert (first.status_code, second.status_code) == (201, 201), second.text
    assert second.json()["toAccountId"] == theirs


async def test_the_same_account_still_refuses_a_reused_reference(
    client: httpx.AsyncClient,
) -> None:
    account, _ = await make_account(client, 0)
    reference, key = f"invoice-{uuid.uuid4()}", str(uuid.uuid4())
    first = await _deposit(client, account, reference, key)
    assert first.status_code == 201, first.text
    # The same key: the stored answer, nothing moved twice.
    again = await _deposit(client, account, reference, key)
    assert (again.status_code, again.json()) == (200, first.json())
    # Another key, same reference, same account: refused, nothing moved.
    other = await _deposit(client, account, reference)
    assert (other.status_code, other.json()["code"]) == (409, "duplicate_reference")
    assert other.headers["content-type"].startswith("application/problem+json")
    statement = await client.get(f"/api/accounts/{account}/statement", headers=ADMIN)
    assert statement.json()["balance"] == 100
    assert len(statement.json()["entries"]) == 1
