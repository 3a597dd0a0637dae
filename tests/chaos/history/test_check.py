"""The history checker on hand-made histories: it passes a good one and catches
each kind of bad one (a lost write, a double apply, an over-capacity slot, ...).
Pure data, no service: milliseconds."""

from __future__ import annotations

from collections import Counter

from tests.chaos.history.check import (
    Anomaly,
    Appointment,
    AppointmentState,
    BankState,
    Job,
    JobState,
    Movement,
    check,
    check_appointments,
    check_bank,
    check_jobs,
)
from tests.chaos.history.record import History


def kinds(found: list[Anomaly]) -> Counter[str]:
    return Counter(a.kind for a in found)


def bank_history() -> tuple[History, BankState]:
    """Two accounts funded 100 each, then three transfers: acknowledged, refused,
    unknown (a timeout) and in fact applied."""
    h = History()
    for account, ref in ((1, "d1"), (2, "d2")):
        h.ok(h.invoke("deposit", account=account, amount=100, reference=ref), id=10 + account)
    h.ok(h.invoke("transfer", source=1, target=2, amount=7), id=20)
    h.fail(h.invoke("transfer", source=2, target=1, amount=500), "insufficient_funds")
    h.info(h.invoke("transfer", source=2, target=1, amount=3), "timeout")
    state = BankState(
        {1: 96, 2: 104},
        [
            Movement(11, "DEPOSIT", 0, 1, 100, "d1"),
            Movement(12, "DEPOSIT", 0, 2, 100, "d2"),
            Movement(20, "TRANSFER", 1, 2, 7),
            Movement(21, "TRANSFER", 2, 1, 3),
        ],
    )
    return h, state


def test_a_good_bank_history_passes() -> None:
    h, state = bank_history()
    assert check_bank(h, state) == []


def test_an_acknowledged_transfer_missing_is_a_lost_write() -> None:
    h, state = bank_history()
    state.movements = [m for m in state.movements if m.id != 20]
    state.balances = {1: 103, 2: 97}  # consistent with what is left: only the op tells
    assert kinds(check_bank(h, state)) == {"lost_write": 1}


def test_a_retried_transfer_applied_twice_is_a_double_apply() -> None:
    h, state = bank_history()
    state.movements.append(Movement(22, "TRANSFER", 2, 1, 3))  # the unknown one, again
    state.balances = {1: 99, 2: 101}
    assert kinds(check_bank(h, state)) == {"double_apply": 1}


def test_money_created_or_destroyed_is_caught() -> None:
    h, state = bank_history()
    state.balances[2] += 5
    found = kinds(check_bank(h, state))
    assert found == {"money_not_conserved": 2}  # the account, and the total


def test_a_refused_transfer_applied_and_a_phantom_are_caught() -> None:
    h, state = bank_history()
    state.movements += [Movement(23, "TRANSFER", 2, 1, 500), Movement(24, "TRANSFER", 1, 2, 1)]
    state.balances = {1: 595, 2: -395}
    assert kinds(check_bank(h, state)) == {
        "failed_write_applied": 1,
        "phantom": 1,
        "negative_balance": 1,
    }


def appointment_history() -> tuple[History, AppointmentState]:
    """Slot 1 (capacity 2): patient 101 booked and kept, 102 booked then cancelled,
    103 refused (full), 104 unknown and in fact booked."""
    h = History()
    for patient in (101, 102):
        h.ok(h.invoke("book", slot=1, patient=patient), id=patient)
    h.ok(h.invoke("cancel", appointment=102, patient=102))
    h.fail(h.invoke("book", slot=1, patient=103), "slot_full")
    h.info(h.invoke("book", slot=1, patient=104), "503 until the client gave up")
    state = AppointmentState(
        {1: 2},
        [
            Appointment(101, 1, 101, "BOOKED"),
            Appointment(102, 1, 102, "CANCELLED"),
            Appointment(104, 1, 104, "BOOKED"),
        ],
    )
    return h, state


def test_a_good_appointment_history_passes() -> None:
    h, state = appointment_history()
    assert check_appointments(h, state) == []


def test_a_slot_over_capacity_is_caught() -> None:
    h, state = appointment_history()
    state.capacity[1] = 1
    assert kinds(check_appointments(h, state)) == {"over_capacity": 1}


def test_an_acknowledged_booking_lost_or_booked_twice_is_caught() -> None:
    h, state = appointment_history()
    state.appointments[0].status = "CANCELLED"  # nobody cancelled 101
    assert kinds(check_appointments(h, state)) == {"lost_write": 1}
    h, state = appointment_history()
    state.appointments.append(Appointment(105, 1, 104, "CANCELLED"))
    assert kinds(check_appointments(h, state)) == {"double_apply": 1}
    h, state = appointment_history()
    state.appointments[1].status = "BOOKED"  # the acknowledged cancel lost: 3 in 2 places
    assert kinds(check_appointments(h, state)) == {"lost_write": 1, "over_capacity": 1}


def job_history() -> tuple[History, JobState]:
    h = History()
    h.ok(h.invoke("job", ref="j1"), id=1)
    h.info(h.invoke("job", ref="j2"), "timeout")
    h.fail(h.invoke("job", ref="j3"), "validation_error")
    state = JobState([Job(1, "j1", "DONE"), Job(2, "j2", "DONE")], Counter({1: 2, 2: 1}))
    return h, state


def test_jobs_run_once_per_submission() -> None:
    h, state = job_history()
    assert check_jobs(h, state) == []  # job 1 called twice: a redelivery of one job id
    state.jobs[0].status = "QUEUED"
    assert kinds(check_jobs(h, state)) == {"never_ran": 1}
    h, state = job_history()
    state.jobs.append(Job(3, "j2", "DONE"))  # the unknown submission made twice
    state.calls[3] = 1
    assert kinds(check_jobs(h, state)) == {"double_apply": 1}
    h, state = job_history()
    state.jobs = state.jobs[1:]
    del state.calls[1]
    assert kinds(check_jobs(h, state)) == {"lost_write": 1}


def test_check_runs_every_model() -> None:
    (hb, bank), (ha, appts), (hj, jobs) = bank_history(), appointment_history(), job_history()
    merged = History()
    merged.ops = [*hb.ops, *ha.ops, *hj.ops]
    assert check(merged, bank, appts, jobs) == []
    appts.capacity[1] = 1
    assert kinds(check(merged, bank, appts, jobs)) == {"over_capacity": 1}
