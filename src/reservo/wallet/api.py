"""HTTP routes of the Wallet API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from reservo.core.http.auth import Principal
from reservo.core.http.glue import (
    AdminCaller,
    PathId,
    RequiredIdempotencyKey,
    from_state,
    json_response,
    required_key,
    role_caller,
    run_idempotent_route,
)
from reservo.core.http.idempotency import Within, request_hash
from reservo.core.http.openapi import raises
from reservo.core.http.schemas import MAX_ID
from reservo.core.kernel.errors import validation_error
from reservo.wallet.batch import TransferBatch, TransferRequest
from reservo.wallet.domain import Account, BadRange, Transfer, may_act_for, statement_window
from reservo.wallet.errors import account_not_found
from reservo.wallet.export import StatementExport
from reservo.wallet.schemas import (
    AccountIn,
    AccountOut,
    DepositIn,
    EntryOut,
    StatementOut,
    TransferIn,
    TransferOut,
)
from reservo.wallet.service import WalletService

router = APIRouter(prefix="/api", tags=["wallet"])


_svc = from_state(WalletService, "wallet")


def render_account(a: Account) -> dict[str, Any]:
    return AccountOut.model_validate(a, from_attributes=True).wire()


def render_transfer(t: Transfer) -> dict[str, Any]:
    # The wire fields are the transfer's own, by name (kind and reference stay inside).
    return TransferOut.model_validate(t, from_attributes=True).wire()


# Who may use which route, checked before the request is parsed (core.http.glue.Roles).
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
    account = await _svc(request).create_account(body.owner_id, body.currency)
    return json_response(201, render_account(account))


@router.get(
    "/accounts/{accountId}",
    response_model=AccountOut,
    operation_id="getAccount",
    openapi_extra=raises("account_not_found"),
)
async def get_account(
    account_id: Annotated[PathId, Path(alias="accountId")], caller: Bettor, request: Request
) -> JSONResponse:
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


# Served on the fast path (core/http/hotroute.py).
HOT_ROUTES = (transfer,)


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
    from_: Annotated[str, Query(alias="from", max_length=10, examples=["2026-01-01"])],
    to: Annotated[str, Query(max_length=10, examples=["2026-12-31"])],
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
    await _owned(request, caller, account_id)
    account, entries, next_before = await _svc(request).statement(account_id, before, limit)
    # An entry's wire fields are its own, by name.
    rows = [EntryOut.model_validate(e, from_attributes=True) for e in entries]
    out = StatementOut(
        account_id=account.id, balance=account.balance, entries=rows, next_before=next_before
    )
    return json_response(200, out.wire())
