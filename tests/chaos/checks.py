"""What must hold once every fault is healed and the work has drained: each
accepted request's effect exists exactly once, money is conserved, counters match
their rows, nothing is DEAD, FAILED or parked, and no 500 was ever answered.

Each check returns (ok, detail). "Exactly once" at a receiver (SMTP, the payment
gateway, the job recorder) is counted the way the receiver dedupes: by the
Message-ID / Idempotency-Key the service sends (delivery is at least once; a
redelivery after a lost reply carries the same id)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import asyncpg

from tests.chaos.fakes import HttpRecorder, SmtpRecorder
from tests.chaos.load import Ledger, Traffic


@dataclass
class Result:
    name: str
    ok: bool
    detail: str


Check = Callable[[], Awaitable[Result]]
_APPT = re.compile(r"appointment #(\d+)")
NO_SERVER_ERRORS = "no 500; every 503 is `unavailable`; every request answered"


def _short(items: Iterable[object], limit: int = 8) -> str:
    seq = list(items)
    more = f" (+{len(seq) - limit} more)" if len(seq) > limit else ""
    return f"{seq[:limit]}{more}"


class Checks:
    def __init__(
        self,
        db: asyncpg.Connection,
        ledger: Ledger,
        traffic: Traffic,
        smtp: SmtpRecorder,
        gateway: HttpRecorder,
        recorder: HttpRecorder,
    ) -> None:
        self.db, self.ledger, self.traffic = db, ledger, traffic
        self.smtp, self.gateway, self.recorder = smtp, gateway, recorder

    def all(self) -> list[Check]:
        return [
            self.appointments_once,
            self.slot_counters,
            self.notifications_once,
            self.rentals_once,
            self.refunds_once,
            self.money_conserved,
            self.transfers_once,
            self.bets_settled_once,
            self.jobs_once,
            self.nothing_dead,
            self.no_server_errors,
        ]

    # -- appointments -------------------------------------------------------------------
    async def appointments_once(self) -> Result:
        rows = await self.db.fetch("SELECT id, patient_id, status FROM appointment")
        db = {r["id"]: (r["patient_id"], r["status"]) for r in rows}
        accepted = self.ledger.appointments
        missing = [a for a in accepted if a not in db]
        wrong = [a for a, p in accepted.items() if a in db and db[a][0] != p]
        phantom = [a for a in db if a not in accepted]
        per_patient = Counter(p for p, _ in db.values())
        doubled = [p for p, n in per_patient.items() if n > 1]
        bad_status = [
            a
            for a in accepted
            if a in db
            and db[a][1] != ("CANCELLED" if a in self.ledger.appointments_cancelled else "BOOKED")
        ]
        unknown = self.ledger.unknown["appointment"] + self.ledger.unknown["appointment_cancel"]
        ok = not (missing or wrong or doubled or bad_status) and len(phantom) <= unknown
        return Result(
            "appointments: every accepted booking once",
            ok,
            f"{len(accepted)} accepted, {len(self.ledger.appointments_cancelled)} cancelled; "
            f"missing {_short(missing)}, doubled patients {_short(doubled)}, wrong status "
            f"{_short(bad_status)}, not accepted {_short(phantom)} (unknown outcomes {unknown})",
        )

    async def slot_counters(self) -> Result:
        rows = await self.db.fetch(
            """SELECT s.id FROM time_slot s
                 LEFT JOIN appointment a ON a.slot_id = s.id AND a.status = 'BOOKED'
                GROUP BY s.id
               HAVING s.booked_count <> count(a.id) OR s.booked_count > max(s.capacity)"""
        )
        n = await self.db.fetchval("SELECT count(*) FROM time_slot")
        return Result(
            "slots: booked_count = BOOKED rows",
            not rows,
            f"{n} slots, mismatched {_short([r['id'] for r in rows])}",
        )

    async def notifications_once(self) -> Result:
        """Every notification reached SMTP once per (event id, recipient): the
        Message-ID is derived from the event id, and an event may notify several
        people. No appointment was confirmed (or cancelled) under two events."""
        mails = self.smtp.snapshot()
        rows = await self.db.fetch(
            "SELECT event_id::text AS e, recipient, status FROM notification"
        )
        expected = {(r["e"], f"user-{r['recipient']}@example.invalid") for r in rows}
        not_sent = [r["e"] for r in rows if r["status"] != "SENT"]
        got = Counter((m.event_id, m.to) for m in mails)
        lost = sorted(expected - set(got))
        unknown_ids = sorted(set(got) - expected)
        redelivered = sum(n - 1 for n in got.values())
        booked: dict[int, set[str]] = defaultdict(set)
        cancelled: dict[int, set[str]] = defaultdict(set)
        for m in mails:
            found = _APPT.search(m.body)
            if found is None:
                continue
            if "is booked" in m.body:
                booked[int(found.group(1))].add(m.event_id)
            elif "was cancelled" in m.body:
                cancelled[int(found.group(1))].add(m.event_id)
        no_mail = [a for a in self.ledger.appointments if len(booked.get(a, ())) != 1]
        no_cancel_mail = [
            a for a in self.ledger.appointments_cancelled if len(cancelled.get(a, ())) != 1
        ]
        ok = not (not_sent or lost or unknown_ids or no_mail or no_cancel_mail)
        return Result(
            "notifications: one mail per event and recipient at SMTP",
            ok,
            f"{len(got)} mails ({redelivered} redelivered with the same Message-ID and "
            f"recipient), {len(expected)} notification rows; not SENT {len(not_sent)}, "
            f"never at SMTP {_short(lost)}, unknown {_short(unknown_ids)}, appointments "
            f"without exactly one confirmation {_short(no_mail)}, without exactly one "
            f"cancellation mail {_short(no_cancel_mail)}",
        )

    # -- rentals --------------------------------------------------------------------------
    async def rentals_once(self) -> Result:
        rows = await self.db.fetch(
            "SELECT booking_id, provider_txn_id, type, amount FROM payment WHERE type = 'DEPOSIT'"
        )
        deposits = {r["provider_txn_id"]: r for r in rows}
        per_booking = Counter(r["booking_id"] for r in rows)
        missing = [t for t in self.ledger.payments if t not in deposits]
        doubled = [b for b, n in per_booking.items() if n > 1]
        statuses = {
            r["id"]: (r["status"], r["refund_amount"])
            for r in await self.db.fetch("SELECT id, status, refund_amount FROM booking")
        }
        not_held = [b for b in self.ledger.holds if b not in statuses]
        bad = [
            b
            for b, refund in self.ledger.rentals_cancelled.items()
            if statuses.get(b) != ("CANCELLED", refund)
        ]
        overlap = await self.db.fetchval(
            """SELECT count(*) FROM booking a JOIN booking b ON a.car_id = b.car_id
                 AND a.id < b.id AND a.period && b.period
                WHERE a.status IN ('HOLD','CONFIRMED','ON_TRIP')
                  AND b.status IN ('HOLD','CONFIRMED','ON_TRIP')"""
        )
        phantom = [b for b in statuses if b not in self.ledger.holds]
        ok = (
            not (missing or doubled or not_held or bad or overlap)
            and len(phantom) <= self.ledger.unknown["hold"]
        )
        return Result(
            "rentals: holds, payments, cancellations once",
            ok,
            f"{len(self.ledger.holds)} holds, {len(self.ledger.payments)} payments, "
            f"{len(self.ledger.rentals_cancelled)} cancelled; missing payments {_short(missing)}, "
            f"doubled {_short(doubled)}, missing holds {_short(not_held)}, wrong state "
            f"{_short(bad)}, overlaps {overlap}, not accepted {_short(phantom)}",
        )

    async def refunds_once(self) -> Result:
        rows = await self.db.fetch(
            "SELECT booking_id, provider_txn_id, amount FROM payment WHERE type = 'REFUND'"
        )
        recorded: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for r in rows:
            recorded[r["booking_id"]].append((r["provider_txn_id"], r["amount"]))
        calls = self.gateway.snapshot()
        keys_per_booking: dict[int, set[str]] = defaultdict(set)
        amount_of: dict[str, int] = {}
        for c in calls:
            keys_per_booking[int(c.body["bookingId"])].add(c.key)
            amount_of[c.key] = int(c.body["amount"])
        expected = {b: a for b, a in self.ledger.rentals_cancelled.items() if a > 0}
        wrong: list[str] = []
        for booking, amount in expected.items():
            keys = keys_per_booking.get(booking, set())
            rec = recorded.get(booking, [])
            if len(keys) != 1 or len(rec) != 1:
                wrong.append(f"{booking}: gateway keys {len(keys)}, rows {len(rec)}")
                continue
            (key,) = keys
            if rec[0] != (f"refund:{key}", amount) or amount_of[key] != amount:
                wrong.append(f"{booking}: {rec[0]} vs key {key} amount {amount}")
        unexpected = [b for b in keys_per_booking if b not in expected]
        redelivered = len(calls) - len({c.key for c in calls})
        return Result(
            "refunds: once per refund event at the gateway",
            not wrong and not unexpected,
            f"{len(expected)} refunds expected, {len({c.key for c in calls})} keys at the "
            f"gateway ({redelivered} retried calls with a known key); wrong {_short(wrong)}, "
            f"unexpected bookings {_short(unexpected)}",
        )

    # -- wallet and betting --------------------------------------------------------------
    async def money_conserved(self) -> Result:
        totals = await self.db.fetch(
            """SELECT currency, sum(balance) AS total,
                      sum(balance) FILTER (WHERE kind <> 'WORLD') AS held,
                      min(balance) FILTER (WHERE kind = 'CUSTOMER') AS lowest
                 FROM wallet_account GROUP BY currency"""
        )
        unbalanced = await self.db.fetchval(
            """SELECT count(*) FROM (SELECT t.id FROM wallet_transfer t
                 JOIN wallet_entry e ON e.transfer_id = t.id GROUP BY t.id
               HAVING count(*) <> 2 OR sum(e.amount) <> 0) x"""
        )
        deposited = sum(a for _, a in self.ledger.deposits.values())
        eur = next((r for r in totals if r["currency"] == "EUR"), None)
        # Each customer balance from what the clients were told, plus the payouts
        # the database says each settled bet earned (checked against bets below).
        expected: Counter[int] = Counter()
        for account, amount in self.ledger.deposits.values():
            expected[account] += amount
        for src, dst, amount in self.ledger.transfers.values():
            expected[src] -= amount
            expected[dst] += amount
        for account, stake in self.ledger.bets.values():
            expected[account] -= stake
        for r in await self.db.fetch(
            "SELECT account_id, payout FROM betting_bet WHERE payout IS NOT NULL"
        ):
            expected[r["account_id"]] += r["payout"]
        balances = {
            r["id"]: r["balance"]
            for r in await self.db.fetch(
                "SELECT id, balance FROM wallet_account WHERE kind = 'CUSTOMER'"
            )
        }
        off = [f"{a}: {b} != {expected[a]}" for a, b in balances.items() if b != expected[a]]
        unknown = sum(self.ledger.unknown[k] for k in ("deposit", "transfer", "bet"))
        ok = (
            eur is not None
            and eur["total"] == 0
            and eur["held"] == deposited
            and eur["lowest"] >= 0
            and not unbalanced
            and (not off or unknown > 0)
        )
        return Result(
            "money: conserved, no balance below 0",
            ok,
            f"EUR total {eur and eur['total']} (0), held {eur and eur['held']} = deposits "
            f"{deposited}, lowest customer {eur and eur['lowest']}, unbalanced transfers "
            f"{unbalanced}, customer balances off {_short(off)}",
        )

    async def transfers_once(self) -> Result:
        rows = await self.db.fetch(
            "SELECT id, kind, from_account_id, to_account_id, amount FROM wallet_transfer "
            "WHERE kind IN ('DEPOSIT', 'TRANSFER')"
        )
        db = {r["id"]: r for r in rows}
        bad = [
            t
            for t, (src, dst, amt) in self.ledger.transfers.items()
            if t not in db
            or (db[t]["from_account_id"], db[t]["to_account_id"], db[t]["amount"])
            != (src, dst, amt)
        ]
        bad += [
            t
            for t, (acct, amt) in self.ledger.deposits.items()
            if t not in db or (db[t]["to_account_id"], db[t]["amount"]) != (acct, amt)
        ]
        accepted = set(self.ledger.transfers) | set(self.ledger.deposits)
        phantom = [t for t in db if t not in accepted]
        unknown = self.ledger.unknown["transfer"] + self.ledger.unknown["deposit"]
        return Result(
            "wallet: deposits and transfers once",
            not bad and len(phantom) <= unknown,
            f"{len(self.ledger.deposits)} deposits, {len(self.ledger.transfers)} transfers; "
            f"missing or wrong {_short(bad)}, not accepted {_short(phantom)}",
        )

    async def bets_settled_once(self) -> Result:
        bets = {
            r["id"]: r
            for r in await self.db.fetch("SELECT id, stake, status, payout FROM betting_bet")
        }
        moves: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r in await self.db.fetch(
            "SELECT kind, reference, amount FROM wallet_transfer "
            "WHERE kind IN ('STAKE', 'PAYOUT', 'REFUND')"
        ):
            moves[(r["kind"], r["reference"])].append(r["amount"])
        wrong: list[str] = []
        for bet_id, (_, stake) in self.ledger.bets.items():
            b = bets.get(bet_id)
            ref = f"bet:{bet_id}"
            if b is None:
                wrong.append(f"{bet_id} missing")
            elif b["status"] == "PENDING":
                wrong.append(f"{bet_id} PENDING")
            elif moves.get(("STAKE", ref)) != [stake]:
                wrong.append(f"{bet_id} stake {moves.get(('STAKE', ref))}")
            elif b["payout"]:
                kind = "REFUND" if b["status"] == "VOID" else "PAYOUT"
                if moves.get((kind, ref)) != [b["payout"]]:
                    wrong.append(f"{bet_id} {kind} {moves.get((kind, ref))} != {b['payout']}")
        phantom = [b for b in bets if b not in self.ledger.bets]
        matches = await self.db.fetch(
            "SELECT id, settlement_status FROM betting_match WHERE result_status IS NOT NULL"
        )
        unsettled = [m["id"] for m in matches if m["settlement_status"] != "SETTLED"]
        no_result = [m for m in self.ledger.results if m not in {x["id"] for x in matches}]
        return Result(
            "bets: settled, stake and payout once",
            not wrong
            and not unsettled
            and not no_result
            and len(phantom) <= self.ledger.unknown["bet"],
            f"{len(self.ledger.bets)} bets, {len(self.ledger.results)} results; wrong "
            f"{_short(wrong)}, matches not SETTLED {_short(unsettled)}, results not applied "
            f"{_short(no_result)}, not accepted {_short(phantom)}",
        )

    # -- jobs -----------------------------------------------------------------------------
    async def jobs_once(self) -> Result:
        rows = await self.db.fetch(
            "SELECT id, status, attempts, last_error FROM scheduled_job WHERE category = 'http'"
        )
        db = {r["id"]: r for r in rows}
        keys = self.recorder.keys("/job/")
        not_done = [
            f"{j}:{db[j]['status'] if j in db else 'missing'}"
            for j in self.ledger.jobs
            if j not in db or db[j]["status"] != "DONE"
        ]
        never_called = [j for j in self.ledger.jobs if keys[str(j)] == 0]
        foreign = [k for k in keys if not k.isdigit() or int(k) not in db]
        repeated = sum(n - 1 for n in keys.values() if n > 1)
        phantom = [
            j for j in db if j not in self.ledger.jobs and j not in self.ledger.jobs_elsewhere
        ]
        return Result(
            "jobs: each accepted job ran, once per job id",
            not not_done
            and not never_called
            and not foreign
            and len(phantom) <= self.ledger.unknown["job"],
            f"{len(self.ledger.jobs)} jobs, {len(keys)} job ids at the recorder ({repeated} "
            f"repeated calls with a known key); not DONE {_short(not_done)}, never called "
            f"{_short(never_called)}, unknown keys {_short(foreign)}",
        )

    # -- the platform ---------------------------------------------------------------------
    async def nothing_dead(self) -> Result:
        row = await self.db.fetchrow(
            """SELECT
                 (SELECT count(*) FROM outbox WHERE status = 'DEAD') AS dead_events,
                 (SELECT count(*) FROM outbox WHERE status = 'PENDING') AS pending_events,
                 (SELECT count(*) FROM webhook_events_fallback WHERE status <> 'RESENT')
                    AS fallback_open,
                 (SELECT count(*) FROM webhook_events_fallback WHERE status = 'FAILED')
                    AS fallback_failed,
                 (SELECT count(*) FROM dead_letter) AS dead_letters,
                 (SELECT count(*) FROM scheduled_job WHERE status = 'DEAD') AS dead_jobs,
                 (SELECT count(*) FROM notification WHERE status <> 'SENT') AS unsent"""
        )
        assert row is not None
        ok = all(v == 0 for v in row.values())
        return Result(
            "nothing DEAD, FAILED, parked or pending",
            ok,
            ", ".join(f"{k} {v}" for k, v in row.items()),
        )

    async def no_server_errors(self) -> Result:
        t = self.traffic
        ok = not t.server_errors and not t.bad_503 and not t.unresolved
        return Result(
            NO_SERVER_ERRORS,
            ok,
            f"statuses {dict(sorted(t.statuses.items()))}, refusals "
            f"{dict(t.refusals.most_common())}, connection errors "
            f"{t.connection_errors}; 5xx {_short(t.server_errors, 3)}, odd 503 "
            f"{_short(t.bad_503, 3)}, unanswered {_short(t.unresolved, 3)}",
        )
