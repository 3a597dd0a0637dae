"""HTTP routes of the Betting API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from reservo.betting.corrections import Resettlement
from reservo.betting.domain import Bet, Leg, Match
from reservo.betting.intake import ResultIntake
from reservo.betting.schemas import (
    Accepted,
    BetIn,
    BetOut,
    BetPage,
    MatchIn,
    MatchOut,
    MatchPage,
    MatchPatch,
    MatchSummaryOut,
    ResettleIn,
    ResultIn,
    ResultOut,
    SelectionOut,
    SettlementOut,
    SettlementSummaryOut,
    VoidIn,
    odds_text,
)
from reservo.betting.service import BettingService
from reservo.core.http.auth import Principal
from reservo.core.http.callers import AdminCaller, Caller, role_caller
from reservo.core.http.idempotency import Within
from reservo.core.http.idempotent import RequiredIdempotencyKey, required_key, run_idempotent_route
from reservo.core.http.openapi import raises, raw_body
from reservo.core.http.pagination import (
    DEFAULT_LIMIT,
    After,
    Limit,
    decode_cursor,
    page,
    time_cursor,
    time_key,
)
from reservo.core.http.responses import json_response, model_from
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.kernel.errors import DomainError

router = APIRouter(prefix="/api", tags=["betting"])


_svc = from_state(BettingService, "betting")
# Who may use which route, checked before the request is parsed (core.http.callers.Roles).
Bettor = Annotated[Principal, role_caller("bettor")]
_intake = from_state(ResultIntake, "results")
_resettlement = from_state(Resettlement, "resettlement")
# MatchOut is a dataclass (the domain's Fixture on the wire): dumped through this.
_MATCH_OUT = TypeAdapter(MatchOut)


def _match_fields(m: Match) -> dict[str, Any]:
    """What a match and a list's summary of it both show."""
    result = None
    if m.result is not None:  # the wire fields are the result's own, by name
        result = ResultOut.model_validate(m.result, from_attributes=True)
    return {
        "id": m.id,
        "external_id": m.external_id,
        "home": m.home,
        "away": m.away,
        "starts_at": m.starts_at,
        "odds": m.odds,
        "suspended": m.suspended,
        "result": result,
    }


def render_match(m: Match) -> dict[str, Any]:
    assert m.pending_bets is not None  # read with every single match
    settlement = SettlementOut(
        status=m.settlement_status,
        pending_bets=m.pending_bets,
        settled_bets=m.settled_bets,
    )
    return _MATCH_OUT.dump_python(
        MatchOut(**_match_fields(m), settlement=settlement), mode="json", by_alias=True
    )


def render_match_summary(m: Match) -> MatchSummaryOut:
    settlement = SettlementSummaryOut(
        status=m.settlement_status,
        settled_bets=m.settled_bets,
    )
    return MatchSummaryOut(**_match_fields(m), settlement=settlement)


def render_bet(b: Bet) -> dict[str, Any]:
    return bet_out(b).wire()


def bet_out(b: Bet) -> BetOut:
    selections = [model_from(SelectionOut, s, odds=odds_text(s.odds)) for s in b.selections]
    return model_from(BetOut, b, selections=selections)


async def _own_account(svc: BettingService, caller: Principal, account_id: int) -> None:
    """404 account_not_found unless the account is a customer account the caller
    may act for: somebody else's is answered as one that does not exist (a 403
    would tell which ids exist)."""
    owner = await svc.customer_owner(account_id)
    if owner is None or not caller.owns("bettor", owner):
        raise DomainError("account_not_found", f"no account {account_id}")


@router.post(
    "/matches",
    status_code=201,
    response_model=MatchOut,
    operation_id="createMatch",
    openapi_extra=raises("match_exists"),
)
async def create_match(body: MatchIn, caller: AdminCaller, request: Request) -> JSONResponse:
    """Create a match (admin). Results the provider reported for this `externalId`
    before the match existed were kept: the first of them is applied in the same
    transaction, so the match is created with its `result` and settled (no bet
    can ever be placed on it). Another kept report that says the same changes
    nothing; one that says otherwise, or a FINISHED one while `startsAt` is still
    ahead, is parked as a dead letter of `betting.settlement` for an operator
    (`GET /api/ops/dead-letters`)."""
    match = await _svc(request).create_match(
        body.external_id,
        body.home,
        body.away,
        body.starts_at,
        {str(k): v for k, v in body.odds.items()},
    )
    return json_response(201, render_match(match))


@router.get(
    "/matches/{matchId}",
    response_model=MatchOut,
    operation_id="getMatch",
    openapi_extra=raises("match_not_found"),
)
async def get_match(
    match_id: Annotated[PathId, Path(alias="matchId")], caller: Caller, request: Request
) -> JSONResponse:
    """One match: its odds, whether its market is suspended, its settlement."""
    return json_response(200, render_match(await _svc(request).get_match(match_id)))


def _match_key(m: Match) -> tuple[int, int]:
    """A match's place in the lists: (startsAt, id). No match starts outside
    [EARLIEST, LATEST) (betting_match_starts_at_range)."""
    return time_key(m.starts_at, m.id)


@router.get(
    "/matches", response_model=MatchPage, operation_id="listMatches", openapi_extra=raises()
)
async def list_matches(
    caller: Caller,
    request: Request,
    status: Annotated[
        Literal["UPCOMING", "STARTED", "SETTLED"],
        Query(
            description="UPCOMING: not started (server clock) and no result, open for "
            "bets unless suspended. STARTED: not settled yet, and started or with a "
            "result (a match cancelled before kick-off, while its bets are voided). "
            "SETTLED: every bet on it settled."
        ),
    ] = "UPCOMING",
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """Matches of one status, soonest first (startsAt, then id). Items are matches
    without `settlement.pendingBets` (GET /api/matches/{matchId} counts it)."""
    matches = await _svc(request).list_matches(status, time_cursor(after), limit + 1)
    items, nxt = page(matches, limit, _match_key)
    body = MatchPage(items=[render_match_summary(m) for m in items], next=nxt)
    return json_response(200, body.wire())


@router.patch(
    "/matches/{matchId}",
    response_model=MatchOut,
    operation_id="updateMatch",
    openapi_extra=raises("match_not_found", "match_closed"),
)
async def update_match(
    match_id: Annotated[PathId, Path(alias="matchId")],
    body: MatchPatch,
    caller: AdminCaller,
    request: Request,
) -> JSONResponse:
    """Change the odds and/or suspend or reopen betting, before kick-off only (409
    match_closed once the match started by the server clock or has a result). A
    bet placed concurrently commits either before the change (at the odds it saw)
    or after it (refused with odds_changed or market_suspended), never in between."""
    odds = None if body.odds is None else {str(k): v for k, v in body.odds.items()}
    match = await _svc(request).update_match(match_id, odds, body.suspended)
    return json_response(200, render_match(match))


@router.get(
    "/accounts/{accountId}/bets",
    response_model=BetPage,
    operation_id="listAccountBets",
    openapi_extra=raises("account_not_found"),
)
async def account_bets(
    account_id: Annotated[PathId, Path(alias="accountId")],
    caller: Bettor,
    request: Request,
    status: Annotated[Literal["PENDING", "WON", "LOST", "VOID"] | None, Query()] = None,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """The bets of an account, newest first, optionally of one status. A bettor
    sees only the accounts they own: any other account id, existing or not, is
    404 account_not_found, so ids cannot be probed."""
    svc = _svc(request)
    await _own_account(svc, caller, account_id)
    before = decode_cursor(after, int)[0] if after is not None else None
    bets = await svc.account_bets(account_id, before, limit + 1, status)
    items, nxt = page(bets, limit, lambda b: b.id)
    body = BetPage(items=[bet_out(b) for b in items], next=nxt)
    return json_response(200, body.wire())


@router.post(
    "/bets",
    status_code=201,
    response_model=BetOut,
    operation_id="placeBet",
    openapi_extra=raises(
        "account_not_found",
        "match_not_found",
        "insufficient_funds",
        "odds_changed",
        "match_closed",
        "market_suspended",
    ),
)
async def place_bet(
    body: BetIn, caller: Bettor, request: Request, idempotency_key: RequiredIdempotencyKey = None
) -> JSONResponse:
    """Places a bet of `stake` from the bettor's account on one or more
    selections at the odds the bettor saw: odds that moved since are
    `odds_changed`, a stake past the balance `insufficient_funds`."""
    key = required_key(idempotency_key)
    svc = _svc(request)
    legs = [Leg(s.match_id, s.market, s.pick, Decimal(s.odds)) for s in body.selections]
    # The payout cap is checked before anything touches the database (the
    # idempotency claim included): it needs only the request.
    svc.potential_payout(body.stake, legs)
    await _own_account(svc, caller, body.account_id)

    def place(within: Within[Bet] | None) -> Awaitable[Bet]:
        return svc.place_bet(body.account_id, body.stake, legs, within)

    return await run_idempotent_route(request, caller, "POST /api/bets", key, place, render_bet)


@router.get(
    "/bets/{betId}",
    response_model=BetOut,
    operation_id="getBet",
    openapi_extra=raises("bet_not_found"),
)
async def get_bet(
    bet_id: Annotated[PathId, Path(alias="betId")], caller: Bettor, request: Request
) -> JSONResponse:
    """One bet, to its bettor or an admin; anybody else's is `bet_not_found`,
    as if it did not exist."""
    bet = await _svc(request).get_bet(bet_id)
    if not caller.owns("bettor", bet.owner_id):  # somebody else's: as if none
        raise DomainError("bet_not_found", f"no bet {bet_id}")
    return json_response(200, render_bet(bet))


@router.post(
    "/webhooks/match-results",
    status_code=202,
    response_model=Accepted,
    operation_id="receiveMatchResult",
    openapi_extra={
        **raises("bad_signature", "payload_too_large", "duplicate_key", "match_not_started"),
        **raw_body(ResultIn),
    },
)
async def match_result(
    request: Request, x_signature: Annotated[str | None, Header(alias="X-Signature")] = None
) -> JSONResponse:
    """Signed by the results provider (X-Signature over the raw body). 202 means
    the result is held durably and will be applied to its match or stand in front
    of an operator, never dropped: a result for a `matchExternalId` no match has
    yet is kept and applied when that match is created (`POST /api/matches`); the
    same `providerEventId` again, or the same result under another event id,
    changes nothing; a different result for a match that already has one is not
    applied but parked as a dead letter of `betting.settlement`
    (`GET /api/ops/dead-letters`), which a replay refuses while the match keeps
    its first result."""
    await _intake(request).receive(await request.body(), x_signature)
    return json_response(202, Accepted(accepted=True).wire())


@router.post(
    "/matches/{matchId}/resettle",
    status_code=202,
    response_model=Accepted,
    operation_id="resettleMatch",
    openapi_extra=raises("match_not_found", "not_settled", "same_result"),
)
async def resettle_match(
    match_id: Annotated[PathId, Path(alias="matchId")],
    body: ResettleIn,
    caller: AdminCaller,
    request: Request,
) -> JSONResponse:
    """Correct a match's result (admin): the payouts and refunds of its settled
    bets are reversed (REVERSAL entries in their accounts' statements; an account
    that spent the payout goes below zero) and the match is settled again under
    the new result, each bet paid once in this new settlement `generation`. 202
    once reopened: the settlement runs after (`settlement.status` SETTLING until
    done). 409 `not_settled` for a match without a result, `same_result` when it
    already has this one. The provider corrects through the results webhook
    (`"correction": true`)."""
    r = body.result
    await _resettlement(request).resettle(
        match_id, (r.status, r.home_score, r.away_score), caller.sub
    )
    return json_response(202, Accepted(accepted=True).wire())


@router.post(
    "/matches/{matchId}/void",
    status_code=202,
    response_model=Accepted,
    operation_id="voidMatch",
    openapi_extra=raises("match_not_found", "already_void"),
)
async def void_match(
    match_id: Annotated[PathId, Path(alias="matchId")],
    body: VoidIn,
    caller: AdminCaller,
    request: Request,
) -> JSONResponse:
    """Void a match (admin): every bet leg on it is void. A single on it is
    refunded its stake; in an accumulator the leg counts odds 1.00. A match
    already settled is reversed first, as a resettlement; a match not started
    takes no more bets. 409 `already_void` once void (or cancelled)."""
    await _resettlement(request).void(match_id, body.reason, caller.sub)
    return json_response(202, Accepted(accepted=True).wire())
