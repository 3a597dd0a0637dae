"""Betting use cases: matches and placing bets (the stake is debited through the
wallet's facade in the bet's transaction), and the account's bet lists."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import asyncpg

from reservo import wallet
from reservo.betting import domain, repo, results
from reservo.betting.domain import Bet, Match, Selection
from reservo.core.db.database import Database
from reservo.core.db.reads import read_one
from reservo.core.db.replicas import StaleReads
from reservo.core.http.idempotency import Within
from reservo.core.http.schemas import MAX_ID
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError, validation_error

# Below every match's start (betting_match_starts_at_range): the first page's key.
_BEFORE_ANY_MATCH = datetime(1970, 1, 1, tzinfo=UTC)
# Above every bet id (a bigint): the first page of an account's bets, newest first.
_AFTER_ANY_BET = MAX_ID


class BettingService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        house_shards: int = 8,
        max_payout: int = 1_000_000_000,
        *,
        stale: StaleReads,
    ) -> None:
        self.db, self.clock, self.house_shards = db, clock, house_shards
        self.stale = stale
        self.max_payout = max_payout

    def potential_payout(self, stake: int, legs: Sequence[domain.Leg]) -> int:
        """The bet's potential payout, or 422 at the stake when it exceeds
        ``max_payout``. Pure: callers run it before touching the database."""
        try:
            return domain.check_payout(stake, [leg.odds for leg in legs], self.max_payout)
        except domain.BetRefused as exc:
            at_stake = {"loc": ["body", "stake"], "msg": exc.detail, "type": "max_payout"}
            raise validation_error(exc.detail, [at_stake], code=exc.code) from None

    async def create_match(
        self,
        external_id: str,
        home: str,
        away: str,
        starts_at: datetime,
        odds: dict[str, dict[str, str]],
    ) -> Match:
        """A new match, with the results its provider reported before it existed
        applied in the same transaction (betting.results.apply_pending): it is
        created settled when one of them is its result."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            await repo.lock_match_results(conn, external_id)
            row = await repo.insert_match(conn, external_id, home, away, starts_at, odds, now)
            if await results.apply_pending(conn, external_id, now):
                row = await repo.get_match(conn, row["id"])
        return Match.from_row(row, pending_bets=0)

    async def get_match(self, match_id: int) -> Match:
        row = await read_one(
            self.db, repo.get_match, match_id, "match_not_found", f"no match {match_id}"
        )
        return Match.from_row(row)

    async def update_match(
        self,
        match_id: int,
        odds: dict[str, dict[str, str]] | None,
        suspended: bool | None,
    ) -> Match:
        """New odds and/or suspension, while the match is open. The UPDATE waits
        for bets that share-locked the row (matches_for_bet) and bets after it
        see the new row: a bet commits either before the change or under it."""
        async with self.db.transaction() as conn:
            changed = await repo.update_match(conn, match_id, odds, suspended, self.clock.now())
            row = await repo.get_match(conn, match_id)
        if row is None:
            raise DomainError("match_not_found", f"no match {match_id}")
        if changed is None:
            raise DomainError(
                "match_closed", f"match {match_id} has started or has a result: no more changes"
            )
        return Match.from_row(row)

    async def list_matches(
        self, status: str, after: tuple[datetime, int] | None, limit: int
    ) -> list[Match]:
        """One page of matches of a status, soonest first (keyset on startsAt, id).
        A replica may serve it (seconds stale): a bet is checked against the
        primary's odds (409 odds_changed)."""
        key = after or (_BEFORE_ANY_MATCH, 0)
        now = self.clock.now()
        rows = await self.stale.read(lambda conn: repo.matches_page(conn, status, now, key, limit))
        return [Match.from_row(r) for r in rows]

    async def customer_owner(self, account_id: int) -> int | None:
        """The owner of a customer account; None when there is no such account
        (unknown, or a system account: it places no bets)."""
        async with self.db.connection() as conn:
            customer = _customer(await wallet.get_account_in_tx(conn, account_id))
        return None if customer is None else customer[1]

    async def account_bets(
        self, account_id: int, before: int | None, limit: int, status: str | None
    ) -> list[Bet]:
        """One page of an account's bets with their legs, newest first (keyset on id)."""
        async with self.db.connection() as conn:
            rows = await repo.account_bets(
                conn, account_id, before or _AFTER_ANY_BET, limit, status
            )
            legs: dict[int, list[Selection]] = {r["id"]: [] for r in rows}
            for s in await repo.selections_of_bets(conn, list(legs)):
                legs[s["bet_id"]].append(Selection.from_row(s))
        return [Bet.from_row(r, legs[r["id"]]) for r in rows]

    async def place_bet(
        self,
        account_id: int,
        stake: int,
        legs: Sequence[domain.Leg],
        within: Within[Bet] | None = None,
    ) -> Bet:
        """Insert the bet and debit its stake in one transaction: either both
        happen or neither (the wallet's conditional update refuses overdrafts)."""
        potential = self.potential_payout(stake, legs)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            customer = _customer(await wallet.get_account_in_tx(conn, account_id))
            if customer is None:
                raise DomainError("account_not_found", f"no account {account_id}")
            account, owner = customer
            await _check_legs(conn, legs, now)
            row = await repo.insert_bet(
                conn,
                account_id,
                owner,
                account.currency,
                stake,
                potential,
                now,
                len(legs),
            )
            await repo.insert_selections(
                conn,
                row["id"],
                [leg.match_id for leg in legs],
                [leg.market for leg in legs],
                [leg.pick for leg in legs],
                [leg.odds for leg in legs],
            )
            house = await wallet.house_account_in_tx(
                conn,
                account.currency,
                wallet.house_shard(account_id, self.house_shards),
                self.house_shards,
                now,
                delta=stake,  # another house sub-account when this one is full
            )
            await wallet.transfer_in_tx(
                conn, account_id, house, stake, "STAKE", wallet.bet_reference(row["id"]), now
            )
            bet = Bet.from_row(
                row,
                (
                    Selection(leg.match_id, leg.market, leg.pick, leg.odds, "PENDING")
                    for leg in legs
                ),
            )
            if within is not None:
                await within(conn, bet)
        metrics.BETS_PLACED.inc()
        return bet

    async def get_bet(self, bet_id: int) -> Bet:
        async with self.db.connection() as conn:
            row = await repo.get_bet(conn, bet_id)
            if row is None:
                raise DomainError("bet_not_found", f"no bet {bet_id}")
            legs = await repo.bet_selections(conn, bet_id)
        return Bet.from_row(row, map(Selection.from_row, legs))


def _customer(account: wallet.Account | None) -> tuple[wallet.Account, int] | None:
    """A customer account and its owner; None for no account or a system one
    (WORLD, HOUSE: nobody's, it places no bets)."""
    if account is None or account.kind != "CUSTOMER" or account.owner_id is None:
        return None
    return account, account.owner_id


async def _check_legs(conn: asyncpg.Connection, legs: Sequence[domain.Leg], now: datetime) -> None:
    """The bet's legs against their matches as they are in this transaction:
    every match exists, and the domain's rules pass (raises the refusal)."""
    rows = await repo.matches_for_bet(conn, [leg.match_id for leg in legs])
    matches = {
        r["id"]: domain.MatchState(
            r["id"],
            r["starts_at"],
            r["odds"],
            r["result_status"] is not None,
            r["suspended"],
        )
        for r in rows
    }
    for leg in legs:
        if leg.match_id not in matches:
            raise DomainError("match_not_found", f"no match {leg.match_id}")
    try:
        domain.check_bet(legs, matches, now)
    except domain.BetRefused as exc:
        raise DomainError(exc.code, exc.detail) from None
