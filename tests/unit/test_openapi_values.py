"""The document takes the service's own values and says the limits it enforces
(what schemathesis found, issue 43): bounds written as the integers they are (the
largest id is 2**63-1, not the float 2**63), no example already refused, the
accepted range of dates and instants, the picks of each market and at least
one market, runAt or delayMs but not both; and a 422's issues always name
where they are and what kind they are."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from pydantic import TypeAdapter, ValidationError

from reservo.app import openapi_document
from reservo.betting.domain import MARKETS
from reservo.betting.schemas import MatchIn, MatchPatch, SelectionIn
from reservo.core.http.schemas import MAX_ID, Day, Instant
from reservo.core.kernel.errors import issue, model_issues, validation_error
from reservo.scheduler.schemas import JobIn

DOC = openapi_document()
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _schema(name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())


def _walk(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_integer_bounds_are_integers_and_ids_stop_at_the_bigint() -> None:
    schemas = _walk(DOC)
    whole_floats = [
        s for s in schemas if any(isinstance(s.get(b), float) and s[b].is_integer() for b in BOUNDS)
    ]
    assert whole_floats == []
    id_max = DOC["components"]["schemas"]["AppointmentIn"]["properties"]["slotId"]["maximum"]
    assert id_max == MAX_ID and type(id_max) is int


def test_no_example_of_an_instant_is_in_the_past() -> None:
    now = datetime.now(UTC)
    for schema in _walk(DOC):
        if schema.get("format") == "date-time":
            for example in schema.get("examples", []):
                assert datetime.fromisoformat(example) > now, schema


INSTANTS = [
    "2000-01-01T00:00:00Z",
    "2000-01-01T05:00:00-03:00",
    "2000-01-01T00:30:00+01:00",
    "1999-12-31T23:59:59Z",
    "2099-12-31T23:00:00+02:00",
    "2099-12-31T23:00:00-02:00",
    "2100-01-01T00:00:00Z",
    "2050-06-01t10:00:00.123z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
]


@pytest.mark.parametrize("text", INSTANTS)
def test_what_the_document_takes_as_an_instant_the_service_takes(text: str) -> None:
    documented = jsonschema.Draft202012Validator(
        DOC["components"]["schemas"]["BookingIn"]["properties"]["from"],
        format_checker=jsonschema.FormatChecker(),
    ).is_valid(text)
    try:
        TypeAdapter(Instant).validate_python(text)
        taken = True
    except ValidationError:
        taken = False
    assert not documented or taken  # the document never promises what is refused
    if text.startswith(("0001", "9999", "2100", "1999")):
        assert not documented


@pytest.mark.parametrize("text", ["2000-01-01", "2099-12-31", "1999-12-31", "2100-01-01"])
def test_what_the_document_takes_as_a_date_the_service_takes(text: str) -> None:
    path = DOC["paths"]["/api/doctors/{doctorId}/slots"]["get"]
    schema = next(p["schema"] for p in path["parameters"] if p["name"] == "date")
    try:
        TypeAdapter(Day).validate_python(text)
        taken = True
    except ValidationError:
        taken = False
    assert jsonschema.Draft202012Validator(schema).is_valid(text) == taken


def test_each_market_takes_its_own_picks_in_the_document_too() -> None:
    selection = _schema("SelectionIn")
    for market, picks in MARKETS.items():
        for pick in {p for ps in MARKETS.values() for p in ps}:
            body = {"matchId": 1, "market": market, "pick": pick, "odds": "1.85"}
            try:
                SelectionIn.model_validate(body)
                taken = True
            except ValidationError:
                taken = False
            assert taken == (pick in picks)
            assert selection.is_valid(body) == taken, body


@pytest.mark.parametrize(
    "odds",
    [
        {},
        {"1X2": {"HOME": "1.80", "DRAW": "3.40"}},
        {"BTTS": {"YES": "1.80", "NO": "2.00", "MAYBE": "3.00"}},
        {"BTTS": {"YES": "1.00", "NO": "2.00"}},
        {"BTTS": {"YES": "1000.01", "NO": "2.00"}},
        {"BTTS": {"YES": "0001.5", "NO": "1000"}},
        {"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}},
    ],
)
def test_odds_the_document_takes_are_the_ones_a_match_takes(odds: dict[str, Any]) -> None:
    body = {"externalId": "x", "home": "a", "away": "b", "startsAt": "2090-01-01T19:00:00Z"}
    try:
        MatchIn.model_validate({**body, "odds": odds})
        taken = True
    except ValidationError:
        taken = False
    assert _schema("MatchIn").is_valid({**body, "odds": odds}) == taken


@pytest.mark.parametrize(
    ("run_at", "delay_ms", "taken"),
    [("2090-01-01T00:00:00Z", 5, False), ("2090-01-01T00:00:00Z", None, True), (None, 5, True)],
)
def test_run_at_and_delay_ms_are_not_both_in_the_document(
    run_at: str | None, delay_ms: int | None, taken: bool
) -> None:
    body = {"category": "http", "runAt": run_at, "delayMs": delay_ms}
    assert _schema("JobIn").is_valid(body) == taken
    JobIn.model_validate(body)  # the API refuses both (scheduler/api.py), the model need not


def test_a_validation_error_always_names_where_and_what() -> None:
    problem = _schema("Problem")
    bare = validation_error("give runAt or delayMs, not both", at=("body", "delayMs"))
    assert bare.problem()["errors"] == [
        {
            "loc": ["body", "delayMs"],
            "msg": "give runAt or delayMs, not both",
            "type": "value_error",
        }
    ]
    assert problem.is_valid(bare.problem())
    assert validation_error("x").problem()["errors"][0]["loc"] == ["body"]
    with pytest.raises(ValueError, match="loc starts with"):
        issue(["payload", "appointmentId"], "missing")
    issues = model_issues([{"loc": ("appointmentId",), "msg": "m", "type": "missing"}], "body")
    assert issues == [{"loc": ["body", "appointmentId"], "msg": "m", "type": "missing"}]
    # The document refuses what the service no longer answers.
    assert not problem.is_valid({**bare.problem(), "errors": []})
    assert not problem.is_valid({**bare.problem(), "errors": [{"loc": ["after"], "msg": "m"}]})


@pytest.mark.parametrize(
    ("body", "taken"),
    [({}, False), ({"odds": None, "suspended": None}, False), ({"suspended": True}, True)],
)
def test_a_match_patch_names_something_in_the_document_too(
    body: dict[str, Any], taken: bool
) -> None:
    try:
        MatchPatch.model_validate(body)
        served = True
    except ValidationError:
        served = False
    assert served == taken
    assert _schema("MatchPatch").is_valid(body) == taken


# The operations on one resource by its own id that a caller other than its
# owner (or an admin) may not see: API.md's rule, 404 as if it did not exist.
HIDDEN = [
    ("get", "/api/appointments/{appointmentId}"),
    ("delete", "/api/appointments/{appointmentId}"),
    ("post", "/api/appointments/{appointmentId}/reschedule"),
    ("get", "/api/bookings/{bookingId}"),
    ("post", "/api/bookings/{bookingId}/cancel"),
    ("post", "/api/bookings/{bookingId}/extend-hold"),
    ("post", "/api/bookings/{bookingId}/pickup"),
    ("post", "/api/bookings/{bookingId}/return"),
    ("get", "/api/accounts/{accountId}"),
    ("get", "/api/accounts/{accountId}/statement"),
    ("get", "/api/accounts/{accountId}/statement.csv"),
    ("get", "/api/bets/{betId}"),
]


@pytest.mark.parametrize(("method", "path"), HIDDEN)
def test_an_operation_on_a_hidden_resource_says_why_it_is_404(method: str, path: str) -> None:
    op = DOC["paths"][path][method]
    assert "404" in op["responses"]
    words = " ".join(op["description"].split())
    assert "404" in words or "as if it did not exist" in words, words
