"""Check a history against a final state. Pure functions over plain data: the
state comes from ``state.read`` (plain SQL) or, in the checker's own tests, by hand.

Every operation must be identifiable in the final state without the service's
help, by what the client chose: a deposit by its unique ``reference``, a transfer
by its (from, to, amount) with an amount no other transfer uses, a booking by its
patient (one patient per booking), a job by the ``ref`` in its payload. Then, per
operation, the rows bearing its identity number:

- exactly 1 if it was acknowledged (``ok``): 0 is a *lost write*, more a *double
  apply*;
- at most 1 if its outcome is unknown (``info``): more is a double apply (a retry
  with the same Idempotency-Key applied again);
- 0 if it was refused (``fail``): a refused write applied is a *failed write applied*;

and a row no operation can explain is a *phantom*.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from tests.chaos.history.record import History, Op


@dataclass(frozen=True)
class Anomaly:
    model: str  # bank | appointments | jobs
    kind: str  # lost_write, double_apply, over_capacity, ...
    detail: str


@dataclass
class Movement:
    """A wallet_transfer row of kind DEPOSIT or TRANSFER."""

    id: int
    kind: str
    source: int
    target: int
    amount: int
    reference: str | None = None


@dataclass
class BankState:
    balances: dict[int, int]  # every customer account under test -> balance
    movements: list[Movement]


@dataclass
class Appointment:
    id: int
    slot: int
    patient: int
    status: str  # BOOKED | CANCELLED


@dataclass
class AppointmentState:
    capacity: dict[int, int]  # slot -> capacity
    appointments: list[Appointment]


@dataclass
class Job:
    id: int
    ref: str  # the client's own reference, from the payload
    status: str


@dataclass
class JobState:
    jobs: list[Job]
    # Calls the receiver got per job id (the Idempotency-Key the scheduler sends).
    # The receiver applies a job id once: a repeated call is a redelivery, counted.
    calls: Counter[int] = field(default_factory=Counter)


def _once(
    model: str,
    ops: Iterable[Op],
    identity: Callable[[Op], Hashable],
    rows: Counter[Hashable],
) -> list[Anomaly]:
    """The per-operation rule of the module docstring, over rows counted by identity."""
    found: list[Anomaly] = []
    explained: set[Hashable] = set()
    for op in ops:
        key = identity(op)
        if key in explained:
            raise ValueError(f"{model}: two operations share the identity {key!r}")
        explained.add(key)
        n = rows.get(key, 0)
        what = f"op {op.index} {op.kind} {op.args} ({op.outcome}): {n} rows"
        if op.outcome == "ok" and n == 0:
            found.append(Anomaly(model, "lost_write", what))
        elif n > 1:
            found.append(Anomaly(model, "double_apply", what))
        elif op.outcome == "fail" and n:
            found.append(Anomaly(model, "failed_write_applied", what))
    for key in rows:
        if key not in explained:
            found.append(Anomaly(model, "phantom", f"{rows[key]} rows {key!r} no client asked"))
    return found


def check_bank(history: History, state: BankState) -> list[Anomaly]:
    """Money conserved: each balance is what its movements say, the balances add up
    to what was deposited, none is below 0; each deposit and transfer once."""
    found: list[Anomaly] = []
    expected: Counter[int] = Counter()
    for m in state.movements:
        expected[m.target] += m.amount
        if m.kind == "TRANSFER":
            expected[m.source] -= m.amount
    for account, balance in sorted(state.balances.items()):
        if balance != expected[account]:
            found.append(
                Anomaly("bank", "money_not_conserved",
                        f"account {account}: balance {balance}, movements say {expected[account]}")
            )  # fmt: skip
        if balance < 0:
            found.append(Anomaly("bank", "negative_balance", f"account {account}: {balance}"))
    deposited = sum(m.amount for m in state.movements if m.kind == "DEPOSIT")
    if sum(state.balances.values()) != deposited:
        found.append(
            Anomaly("bank", "money_not_conserved",
                    f"balances add up to {sum(state.balances.values())}, deposits to {deposited}")
        )  # fmt: skip
    deposits = Counter[Hashable](m.reference for m in state.movements if m.kind == "DEPOSIT")
    found += _once("bank", history.of("deposit"), lambda op: op.args["reference"], deposits)
    transfers = Counter[Hashable](
        (m.source, m.target, m.amount) for m in state.movements if m.kind == "TRANSFER"
    )
    found += _once(
        "bank",
        history.of("transfer"),
        lambda op: (op.args["source"], op.args["target"], op.args["amount"]),
        transfers,
    )
    return found


def check_appointments(history: History, state: AppointmentState) -> list[Anomaly]:
    """Per slot, the set of BOOKED patients: never more than its capacity; it holds
    every acknowledged booking not cancelled (by an ok or unknown cancel), and
    nothing that was not booked (ok or unknown) there. Each booking once."""
    found: list[Anomaly] = []
    booked: dict[int, set[int]] = defaultdict(set)
    for a in state.appointments:
        if a.status == "BOOKED":
            booked[a.slot].add(a.patient)
    for slot, patients in sorted(booked.items()):
        if len(patients) > state.capacity.get(slot, 0):
            found.append(
                Anomaly("appointments", "over_capacity",
                        f"slot {slot}: {len(patients)} booked, capacity {state.capacity.get(slot)}")
            )  # fmt: skip
    cancels: dict[int, set[str]] = defaultdict(set)
    for op in history.of("cancel"):
        cancels[op.args["patient"]].add(op.outcome or "info")
    must: dict[int, set[int]] = defaultdict(set)
    may: dict[int, set[int]] = defaultdict(set)
    for op in history.of("book"):
        slot, patient = op.args["slot"], op.args["patient"]
        if op.outcome in ("ok", "info"):
            may[slot].add(patient)
        if op.outcome == "ok" and not cancels[patient] & {"ok", "info"}:
            must[slot].add(patient)
        if op.outcome == "ok" and "ok" in cancels[patient]:
            row = [a for a in state.appointments if a.patient == patient]
            if row and row[0].status != "CANCELLED":
                found.append(Anomaly("appointments", "lost_write", f"cancel of {patient} lost"))
    for slot in sorted(set(booked) | set(must)):
        if lost := must[slot] - booked[slot]:
            found.append(Anomaly("appointments", "lost_write", f"slot {slot}: {sorted(lost)}"))
        if extra := booked[slot] - may[slot]:
            found.append(Anomaly("appointments", "phantom", f"slot {slot}: {sorted(extra)}"))
    rows = Counter[Hashable](a.patient for a in state.appointments)
    found += _once("appointments", history.of("book"), lambda op: op.args["patient"], rows)
    return found


def check_jobs(history: History, state: JobState) -> list[Anomaly]:
    """Every accepted job is DONE and reached the receiver; one job per submission
    (a retried submission never makes a second job, so nothing runs twice); the
    receiver saw no job id the database does not have."""
    found: list[Anomaly] = []
    by_id = {j.id: j for j in state.jobs}
    for op in history.of("job"):
        if op.outcome != "ok":
            continue
        job = by_id.get(op.value.get("id", -1))
        if job is None or job.ref != op.args["ref"]:
            continue  # a lost write: _once says so
        if job.status != "DONE" or not state.calls[job.id]:
            found.append(
                Anomaly("jobs", "never_ran",
                        f"job {job.id} ({job.ref}): {job.status}, {state.calls[job.id]} calls")
            )  # fmt: skip
    for job_id in sorted(set(state.calls) - set(by_id)):
        found.append(Anomaly("jobs", "phantom", f"the receiver ran job {job_id}, not in the db"))
    rows = Counter[Hashable](j.ref for j in state.jobs)
    found += _once("jobs", history.of("job"), lambda op: op.args["ref"], rows)
    return found


def check(
    history: History, bank: BankState, appointments: AppointmentState, jobs: JobState
) -> list[Anomaly]:
    return (
        check_bank(history, bank)
        + check_appointments(history, appointments)
        + check_jobs(history, jobs)
    )
