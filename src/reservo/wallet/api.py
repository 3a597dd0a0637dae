"""HTTP routes of the Wallet API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from reservo.core.http.auth import Principal
from reservo.core.http.callers import AdminCaller, role_caller
from reservo.core.http.idempotency import Within, request_hash
from reservo.core.http.idempotent import RequiredIdempotencyKey, required_key, run_idempotent_route
from reservo.core.http.openapi import raises
from reservo.core.http.pagination import DEFAULT_LIMIT, After, Limit, decode_cursor, page
from reservo.core.http.responses import json_response
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.http.schemas import DAY_PATTERN, MAX_ID
from reservo.core.kernel.errors import validation_error
from reservo.wallet.batch import TransferBatch, TransferRequest
from reservo.wallet.domain import Account, BadRange, Transfer, may_act_for, statement_window
from reservo.wallet.errors import account_not_found
from reservo.wallet.export import StatementExport
from reservo.wallet.pending import PendingTransfers
from reservo.wallet.schemas import (
    AccountIn,
    AccountOut,
    AccountPage,
    DepositIn,
    EntryOut,
    PendingPage,
    PostIn,
    StatementOut,
    TransferIn,
    TransferOut,
)
from reservo.wallet.service import WalletService

router = APIRouter(prefix="/api", tags=["wallet"])


_svc = from_state(WalletService, "wallet")
_pending = from_state(PendingTransfers, "wallet_pending")


def render_account(a: Account) -> dict[str, Any]:
    return AccountOut.model_validate(a, from_attributes=True).wire()


def render_transfer(t: Transfer) -> dict[str, Any]:
    # The wire fields are the transfer's own, by name (kind and reference stay inside).
    return TransferOut.model_validate(t, from_attributes=True).wire()


# Who may use which route, checked before the request is parsed (core.http.callers.Roles).
Bettor = Annotated[Principal, role_caller("bettor")]
Service = Annotated[Principal, role_caller("service")]


async def _owned(request: Request, caller: Principal, account_id: int) -> Account:
    """The account, if the caller may act for it; anyone else's is 404 as one that
    does not exist."""
    account = await _svc(request).get_account(account_id)
    if not may_act_for(caller, account.owner_id):
        raise account_not_found(account_id)
    return account


@router.post(
    "/accounts",
    status_code=201,
    response_model=AccountOut,
    operation_id="createAccount",
    openapi_extra=raises(),
)
async def create_account(body: AccountIn, caller: AdminCaller, request: Request) -> JSONResponse:
    """Opens an account (admin) for an owner in one currency, at balance 0."""
    account = await _svc(request).create_account(body.owner_id, body.currency)
    return json_response(201, render_account(account))


@router.get(
    "/accounts",
    response_model=AccountPage,
    operation_id="listNegativeAccounts",
    openapi_extra=raises(),
)
async def negative_accounts(
    negative: Annotated[bool, Query(description="must be true: the one list offered")],
    caller: AdminCaller,
    request: Request,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """Customer accounts below zero (admin), by id, a page at a time (`{items,
    next}`; pass `next` as `after`). An account goes below zero only when a
    match is resettled and a payout it already spent is reversed; it can then
    neither bet nor transfer out (409 `insufficient_funds`) until deposits bring
    it back to zero."""
    if not negative:
        raise validation_error(
            "only negative=true is offered",
            [{"loc": ["query", "negative"], "msg": "must be true", "type": "value_error"}],
        )
    cursor = None if after is None else int(decode_cursor(after, int)[0])
    rows = await _svc(request).negative_accounts(cursor, limit + 1)
    items, next_cursor = page(rows, limit, lambda a: a.id)
    out = AccountPage(
        items=[AccountOut.model_validate(a, from_attributes=True) for a in items],
        next=next_cursor,
    )
    return json_response(200, out.wire())


@router.get(
    "/accounts/{accountId}",
    response_model=AccountOut,
    operation_id="getAccount",
    openapi_extra=raises("account_not_found"),
)
async def get_account(
    account_id: Annotated[PathId, Path(alias="accountId")], caller: Bettor, request: Request
) -> JSONResponse:
    """One account and its balance, to its owner or an admin; anybody else's
    is `account_not_found`, as if it did not exist."""
    return json_response(200, render_account(await _owned(request, caller, account_id)))


async def _idempotent(
    request: Request,
    caller: Principal,
    endpoint: str,
    key: str | None,
    run: Callable[[Within[Transfer] | None], Awaitable[Transfer]],
) -> JSONResponse:
    """Run a money movement at most once per key: the stored response commits in
    the same transaction as the transfer, so a retry can never move money again."""
    checked = required_key(key)
    return await run_idempotent_route(request, caller, endpoint, checked, run, render_transfer)


@router.post(
    "/accounts/{accountId}/deposits",
    status_code=201,
    response_model=TransferOut,
    operation_id="depositToAccount",
    openapi_extra=raises("account_not_found", "duplicate_reference", "balance_out_of_range"),
)
async def deposit(
    account_id: Annotated[PathId, Path(alias="accountId")],
    body: DepositIn,
    caller: Service,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """Credits the account (a service): at most once per Idempotency-Key, and
    once per `reference` (`duplicate_reference`)."""
    svc = _svc(request)
    return await _idempotent(
        request,
        caller,
        f"POST /api/accounts/{account_id}/deposits",
        idempotency_key,
        lambda within: svc.deposit(account_id, body.amount, body.reference, within),
    )


@router.post(
    "/transfers",
    status_code=201,
    response_model=TransferOut,
    operation_id="createTransfer",
    openapi_extra=raises(
        "account_not_found",
        "insufficient_funds",
        "currency_mismatch",
        "same_account",
        "balance_out_of_range",
    ),
)
async def transfer(
    body: TransferIn,
    caller: Bettor,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """Move `amount` now; or, with `"pending": true, "timeoutS": N`, a two-phase
    transfer: 201 `status: "PENDING"` with `expiresAt`, the amount reserved on
    the source (its `available`, not its `balance`, shrinks) until it is posted
    (`/post`), voided (`/void`) or reaches `expiresAt` (voided then). Every
    debit checks the source's `available` money."""
    if body.pending:
        return await _pending_flow(request, caller, body, idempotency_key)
    return await transfer_flow(
        request.app.state,
        caller,
        body,
        idempotency_key,
        await request.body(),
    )


async def transfer_flow(
    state: Any, caller: Principal, body: TransferIn, idempotency_key: str | None, raw: bytes
) -> JSONResponse:
    """What POST /api/transfers does once the request is parsed: the request joins the process's
    next batch of transfers (wallet/batch.py), where its owner check, its key,
    the transfer and the stored response commit in one transaction with the
    batch's other transfers, so a retry can never move money again."""
    key = required_key(idempotency_key)
    batch: TransferBatch = state.wallet_transfers
    answer = await batch.submit(
        TransferRequest(
            caller,
            key,
            request_hash(raw),
            body.from_account_id,
            body.to_account_id,
            body.amount,
        )
    )
    return json_response(answer.status, answer.body)


async def _pending_flow(
    request: Request, caller: Principal, body: TransferIn, idempotency_key: str | None
) -> JSONResponse:
    """A pending transfer in its own transaction (not the batch: it writes no
    entry), at most once per key, under the same endpoint's keys as the batch."""
    key = required_key(idempotency_key)
    await _owned(request, caller, body.from_account_id)
    pending = _pending(request)
    timeout_s = body.timeout_s or 0  # present: TransferIn requires it with pending

    async def create(within: Within[Transfer] | None) -> Transfer:
        return await pending.create(
            body.from_account_id, body.to_account_id, body.amount, timeout_s, within
        )

    return await run_idempotent_route(
        request, caller, "POST /api/transfers", key, create, render_transfer
    )


# Served on the fast path (core/http/hotroute.py).
HOT_ROUTES = (transfer,)


@router.post(
    "/transfers/{transferId}/post",
    response_model=TransferOut,
    operation_id="postPendingTransfer",
    openapi_extra=raises(
        "transfer_not_found",
        "not_pending",
        "pending_expired",
        "amount_above_pending",
        "balance_out_of_range",
    ),
)
async def post_pending(
    transfer_id: Annotated[PathId, Path(alias="transferId")],
    caller: Bettor,
    request: Request,
    body: PostIn | None = None,
) -> JSONResponse:
    """Post a pending transfer: `amount` (default: the whole pending amount; at
    most it, else 422 `amount_above_pending`) moves now, with its two statement
    entries, and the rest of the reservation is released. Its creator (the
    owner of `fromAccountId`) or an admin; anyone else's is 404. 409
    `not_pending` once posted or voided, `pending_expired` past `expiresAt`."""
    amount = None if body is None else body.amount
    done = await _pending(request).post(caller, transfer_id, amount)
    return json_response(200, render_transfer(done))


@router.post(
    "/transfers/{transferId}/void",
    response_model=TransferOut,
    operation_id="voidPendingTransfer",
    openapi_extra=raises("transfer_not_found", "not_pending"),
)
async def void_pending(
    transfer_id: Annotated[PathId, Path(alias="transferId")],
    caller: Bettor,
    request: Request,
) -> JSONResponse:
    """Void a pending transfer: its whole reservation is released, nothing is
    written to the statement. Its creator or an admin; anyone else's is 404.
    409 `not_pending` once posted or voided (by a void or its expiry)."""
    done = await _pending(request).void(caller, transfer_id)
    return json_response(200, render_transfer(done))


@router.get(
    "/accounts/{accountId}/pending-transfers",
    response_model=PendingPage,
    operation_id="listPendingTransfers",
    openapi_extra=raises("account_not_found"),
)
async def pending_transfers(
    account_id: Annotated[PathId, Path(alias="accountId")],
    caller: Bettor,
    request: Request,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """The account's pending transfers out that still reserve money (not past
    `expiresAt`), oldest first, a page at a time (`{items, next}`; pass `next`
    as `after`). The owner or an admin; anyone else's account is 404."""
    cursor = None if after is None else int(decode_cursor(after, int)[0])
    await _owned(request, caller, account_id)
    rows = await _pending(request).list_pending(account_id, cursor, limit + 1)
    items, next_cursor = page(rows, limit, lambda t: t.id)
    out = PendingPage(
        items=[TransferOut.model_validate(t, from_attributes=True) for t in items],
        next=next_cursor,
    )
    return json_response(200, out.wire())


# A statement's day as the document gives it: statement_window reads the text
# (its own 422s), the pattern says which years it takes.
_STATEMENT_DAY: dict[str, Any] = {
    "max_length": 10,
    "pattern": DAY_PATTERN,
    "json_schema_extra": {"format": "date"},
}


@router.get(
    "/accounts/{accountId}/statement.csv",
    response_class=StreamingResponse,
    operation_id="getAccountStatementCsv",
    openapi_extra=raises("account_not_found", "statement_busy"),
    responses={
        200: {
            "description": "The entries as CSV, oldest first",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        }
    },
)
async def statement_csv(
    account_id: Annotated[PathId, Path(alias="accountId")],
    from_: Annotated[str, Query(alias="from", examples=["2026-01-01"], **_STATEMENT_DAY)],
    to: Annotated[str, Query(examples=["2026-12-31"], **_STATEMENT_DAY)],
    caller: Bettor,
    request: Request,
) -> StreamingResponse:
    """The account's entries created from `from` to `to` (UTC days, both
    included, at most 366 of them; YYYY-MM-DD in [2000, 2100)), oldest first:
    `entry_id,created_at,kind,amount,balance_after,transfer_id,reference`,
    amounts in minor units, `balance_after` the balance right after the entry.
    Streamed; the owner or an admin (anyone else's account is 404). A download
    runs at most RESERVO_WALLET_STATEMENT_MAX_S (cut short after); 503
    `statement_busy` while RESERVO_WALLET_STATEMENT_STREAMS downloads run in
    this process."""
    try:
        start, end = statement_window(from_, to)
    except BadRange as exc:
        raise validation_error(
            str(exc), [{"loc": ["query", exc.field], "msg": str(exc), "type": "value_error"}]
        ) from None
    await _owned(request, caller, account_id)
    export: StatementExport = request.app.state.wallet_export
    return export.response(account_id, start, end, f"statement-{account_id}-{from_}-{to}.csv")


@router.get(
    "/accounts/{accountId}/statement",
    response_model=StatementOut,
    operation_id="getAccountStatement",
    openapi_extra=raises("account_not_found"),
)
async def statement(
    account_id: Annotated[PathId, Path(alias="accountId")],
    caller: Bettor,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> JSONResponse:
    """The account's balance and entries, newest first, `limit` per page;
    `nextBefore` asks for the next page. Balance and page are one snapshot. The
    owner or an admin; anybody else's account is `account_not_found`, as if it
    did not exist (a 403 would tell which ids exist)."""
    await _owned(request, caller, account_id)
    account, entries, next_before = await _svc(request).statement(account_id, before, limit)
    # An entry's wire fields are its own, by name.
    rows = [EntryOut.model_validate(e, from_attributes=True) for e in entries]
    out = StatementOut(
        account_id=account.id, balance=account.balance, entries=rows, next_before=next_before
    )
    return json_response(200, out.wire())
