"""The invariants `reservo verify` checks, and what a run makes of its findings:
pure rules and values, no I/O (runner.py reads the pages, queries.sql holds
the SQL of each check).

A check is one or more *parts*: a named query of queries.sql walked in keyset
pages from a start cursor. Each violation a page answers is a ``Finding``
naming its rows. A ``Report`` counts every finding of every check and keeps
the first ``sample`` of each (bounded memory however many rows are bad)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# What the page queries read besides their cursor and page size.
NOW, LEASE_CUTOFF, OUTBOX_CUTOFF = "now", "lease_cutoff", "outbox_cutoff"
# How long an outbox event may wait for a relay, and a lost job for the reaper
# past its timeout, before that is a violation: a relay polls every fraction
# of a second and a reaper every few, so minutes mean none is running.
DEFAULT_GRACE_S = 300.0


@dataclass(frozen=True)
class Part:
    """One paged query of a check: its name in queries.sql, the cursor the walk
    starts after, and the extra parameters it takes ($3, $4, ... in order)."""

    query: str
    start: Any = 0
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    name: str
    module: str
    promise: str  # the invariant, in one sentence
    remedy: str  # what an operator does when it fails (docs/OPERATIONS.md says more)
    parts: tuple[Part, ...]


CHECKS: tuple[Check, ...] = (
    Check(
        "slot_capacity",
        "appointments",
        "a slot's booked and overbooked counters equal its active (BOOKED, HELD) "
        "appointments and stay within capacity plus overbook limit",
        "compare the slot's appointments with its counters; a double booking is "
        "cancelled by hand and the patient told",
        (Part("slot_capacity"),),
    ),
    Check(
        "rental_overlap",
        "rentals",
        "no two active rentals (HOLD, CONFIRMED, ON_TRIP) of one car overlap",
        "check that ex_car_period exists; cancel one of the two bookings and refund it",
        (Part("rental_overlap"),),
    ),
    Check(
        "wallet_balance",
        "wallet",
        "an account's balance is the sum of its ledger entries",
        "stop writes to the account; rebuild the missing entry from the transfer "
        "(or the balance from the ledger) from the backup",
        (Part("wallet_balance"),),
    ),
    Check(
        "wallet_transfer_entries",
        "wallet",
        "a transfer is two entries, its amount out of its source and into its "
        "target (they sum to zero)",
        "restore the transfer's missing or altered entries from the backup",
        (Part("wallet_transfer_entries"),),
    ),
    Check(
        "wallet_available",
        "wallet",
        "pending debits are the sum of the PENDING transfers out; a customer's "
        "available money is below zero only after a REVERSAL took back a payout",
        "recompute pending_debits from wallet_pending_transfer under the account's lock",
        (Part("wallet_available"),),
    ),
    Check(
        "bet_payouts",
        "betting",
        "a settled bet is paid exactly once, as its last result says: credits "
        "less reversals over its settlement generations equal its payout "
        "(WON, VOID) or nothing (LOST, PENDING)",
        "pay the missing credit or reverse the extra one under the bet's reference",
        (Part("bet_payouts"),),
    ),
    Check(
        "outbox_relay",
        "outbox",
        "an event is published (DONE with its time), given up on with a reason "
        "(DEAD with last_error), or pending for a reason (young, leased, "
        "retrying after an error, or behind an earlier failed event of its key)",
        "check that a relay runs (`reservo worker --roles relay`) and its logs",
        (
            Part("outbox_pending", 0, (NOW, OUTBOX_CUTOFF)),
            Part("outbox_settled"),
        ),
    ),
    Check(
        "job_lease",
        "scheduler",
        "a RUNNING job has a live owner: a worker named and a heartbeat newer "
        "than the reaper's timeout",
        "check that a reaper runs (`reservo worker --roles scheduler`)",
        (Part("job_lease", 0, (LEASE_CUTOFF,)), Part("job_owner")),
    ),
    Check(
        "job_run_once",
        "scheduler",
        "a job runs to completion at most once (one DONE execution, and a job "
        "that completed stays DONE)",
        "look at the job's executions (GET /api/jobs/{id}); its handler's effect "
        "happened twice: undo the second by hand",
        (Part("job_run_once"),),
    ),
    Check(
        "idempotency_resource",
        "core",
        "a stored Idempotency-Key answer names a resource that exists",
        "the replayed answer names a lost resource: find why it is gone (a "
        "restore, a manual delete) and delete the key so a retry creates it again",
        (Part("idempotency_resource", ["", "", ""]),),
    ),
)
BY_NAME: Mapping[str, Check] = {c.name: c for c in CHECKS}


def select(names: Iterable[str] | None) -> list[Check]:
    """The checks named (all when ``names`` is empty); ValueError on an unknown one."""
    wanted = [n for n in (names or ()) if n]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [c for c in CHECKS if not wanted or c.name in wanted]


@dataclass(frozen=True)
class Limits:
    """How old a thing must be before its absence is a violation."""

    grace_s: float  # an outbox event may wait this long for a relay
    lease_s: float  # the reaper's timeout plus its period


def parameters(now: datetime, limits: Limits) -> dict[str, Any]:
    """The values a part's ``params`` name."""
    return {
        NOW: now,
        LEASE_CUTOFF: now - timedelta(seconds=limits.lease_s + limits.grace_s),
        OUTBOX_CUTOFF: now - timedelta(seconds=limits.grace_s),
    }


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str  # the row at fault, "table id"
    ids: tuple[int, ...]  # every row it involves (its own id first where it has one)
    facts: Mapping[str, Any]  # the values that break the invariant

    def as_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "ids": list(self.ids), "facts": dict(self.facts)}


def finding(check: str, subject: str, ids: Sequence[int | None] | None, facts: Any) -> Finding:
    """A finding from a violation row of a page query."""
    return Finding(check, subject, tuple(i for i in ids or () if i is not None), dict(facts or {}))


def describe(f: Finding) -> str:
    """The finding's facts in one line, as the table shows them."""
    return ", ".join(f"{k}={v}" for k, v in f.facts.items())


@dataclass
class Outcome:
    """One check's tally: rows looked at, violations, the first few findings."""

    check: Check
    rows: int = 0
    violations: int = 0
    findings: list[Finding] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.check.name,
            "module": self.check.module,
            "promise": self.check.promise,
            "rowsChecked": self.rows,
            "violations": self.violations,
            "findings": [f.as_json() for f in self.findings],
            "truncated": self.violations > len(self.findings),
        }


@dataclass
class Report:
    """Every check's outcome; findings past ``sample`` per check are counted only."""

    checks: Sequence[Check]
    sample: int = 100
    started_at: datetime | None = None
    duration_s: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcomes = {c.name: Outcome(c) for c in self.checks}

    def saw(self, check: str, rows: int) -> None:
        self.outcomes[check].rows += rows

    def add(self, f: Finding) -> None:
        o = self.outcomes[f.check]
        o.violations += 1
        if len(o.findings) < self.sample:
            o.findings.append(f)

    @property
    def ok(self) -> bool:
        return all(o.violations == 0 for o in self.outcomes.values())

    @property
    def exit_code(self) -> int:
        """0: every invariant holds; 1: at least one is broken."""
        return 0 if self.ok else 1

    def violations(self) -> dict[str, int]:
        """Violations per check (every check run, 0 included): the gauge's values."""
        return {name: o.violations for name, o in self.outcomes.items()}

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "startedAt": self.started_at.isoformat() if self.started_at else None,
            "durationS": round(self.duration_s, 3),
            "violations": sum(self.violations().values()),
            "checks": [o.as_json() for o in self.outcomes.values()],
        }
