"""HTTP routes of the Betting API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import JSONResponse

from reservo.betting.domain import Leg
from reservo.betting.schemas import (
    Accepted,
    BetIn,
    BetOut,
    MatchIn,
    MatchOut,
    ResultOut,
    SelectionOut,
    SettlementOut,
    odds_text,
)
from reservo.betting.service import BettingService, ResultIntake
from reservo.core.http import (
    Caller,
    IdempotencyKey,
    idempotency_store,
    json_response,
    problem_responses,
    required_key,
    run_idempotent,
)
from reservo.core.idempotency import Within

router = APIRouter(prefix="/api", tags=["betting"])
PathId = Annotated[int, Path(ge=1, le=2**63 - 1)]
PROBLEMS = problem_responses(400, 401, 403, 404, 409, 422, 503)


def _svc(request: Request) -> BettingService:
    svc: BettingService = request.app.state.betting
    return svc


def render_match(m: dict[str, Any]) -> dict[str, Any]:
    result = None
    if m["result_status"] is not None:
        result = ResultOut(
            status=m["result_status"],
            home_score=m["home_score"],
            away_score=m["away_score"],
            provider_event_id=m["result_event_id"],
        )
    return MatchOut(
        id=m["id"],
        external_id=m["external_id"],
        home=m["home"],
        away=m["away"],
        starts_at=m["starts_at"],
        odds=m["odds"],
        result=result,
        settlement=SettlementOut(
            status=m["settlement_status"],
            pending_bets=m["pending_bets"],
            settled_bets=m["settled_bets"],
        ),
    ).wire()


def render_bet(b: dict[str, Any]) -> dict[str, Any]:
    return BetOut(
        id=b["id"],
        account_id=b["account_id"],
        stake=b["stake"],
        status=b["status"],
        potential_payout=b["potential_payout"],
        payout=b["payout"],
        selections=[
            SelectionOut(
                match_id=s["match_id"],
                market=s["market"],
                pick=s["pick"],
                odds=odds_text(s["odds"]),
                status=s["status"],
            )
            for s in b["selections"]
        ],
        created_at=b["created_at"],
    ).wire()


@router.post("/matches", status_code=201, response_model=MatchOut, responses=PROBLEMS)
async def create_match(body: MatchIn, caller: Caller, request: Request) -> JSONResponse:
    caller.require("admin")
    match = await _svc(request).create_match(
        body.external_id,
        body.home,
        body.away,
        body.starts_at,
        {str(k): v for k, v in body.odds.items()},
    )
    return json_response(201, render_match(match))


@router.get("/matches/{id}", response_model=MatchOut, responses=PROBLEMS)
async def get_match(
    match_id: Annotated[PathId, Path(alias="id")], caller: Caller, request: Request
) -> JSONResponse:
    return json_response(200, render_match(await _svc(request).get_match(match_id)))


@router.post("/bets", status_code=201, response_model=BetOut, responses=PROBLEMS)
async def place_bet(
    body: BetIn, caller: Caller, request: Request, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    caller.require("bettor")
    key = required_key(idempotency_key)
    svc = _svc(request)
    legs = [Leg(s.match_id, s.market, s.pick, Decimal(s.odds)) for s in body.selections]
    # The payout cap is checked before anything touches the database (the
    # idempotency claim included): it needs only the request.
    svc.potential_payout(body.stake, legs)
    caller.require_owner("bettor", await svc.account_owner(body.account_id))

    def place(within: Within[dict[str, Any]] | None) -> Awaitable[dict[str, Any]]:
        return svc.place_bet(body.account_id, body.stake, legs, within)

    raw = await request.body()
    store = idempotency_store(request)
    return await run_idempotent(store, caller, "POST /api/bets", key, raw, place, render_bet)


@router.get("/bets/{id}", response_model=BetOut, responses=PROBLEMS)
async def get_bet(
    bet_id: Annotated[PathId, Path(alias="id")], caller: Caller, request: Request
) -> JSONResponse:
    caller.require("bettor")
    bet = await _svc(request).get_bet(bet_id)
    caller.require_owner("bettor", bet["owner_id"])
    return json_response(200, render_bet(bet))


@router.post(
    "/webhooks/match-results",
    status_code=202,
    response_model=Accepted,
    responses=PROBLEMS,
)
async def match_result(
    request: Request, x_signature: Annotated[str | None, Header(alias="X-Signature")] = None
) -> JSONResponse:
    """Signed by the results provider (X-Signature over the raw body)."""
    intake: ResultIntake = request.app.state.results
    await intake.receive(await request.body(), x_signature)
    return json_response(202, Accepted(accepted=True).wire())
