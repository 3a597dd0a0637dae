"""The request metrics label each request with the route template it matched."""

from __future__ import annotations

import httpx

from reservo.core.kernel import metrics
from tests.helpers.auth import auth, new_id


def _count(method: str, route: str, status: str) -> float:
    value = metrics.HTTP_REQUESTS.labels(method, route, status)._value.get()
    return float(value)


async def test_routes_of_included_routers_are_labelled_by_template(
    client: httpx.AsyncClient,
) -> None:
    # Routes come from an included APIRouter; they used to be counted as "unmatched".
    route = "/api/doctors/{doctorId}/slots"
    before = {s: _count("GET", route, s) for s in ("200", "401", "422")}
    unmatched = _count("GET", "unmatched", "404")
    headers = auth("patient", new_id())
    doctor = (
        await client.post(
            "/api/doctors",
            json={"name": "Dr Metrics", "timezone": "UTC"},
            headers=auth("admin", 1),
        )
    ).json()["id"]

    ok = await client.get(f"/api/doctors/{doctor}/slots?date=2030-01-01", headers=headers)
    anonymous = await client.get(f"/api/doctors/{doctor}/slots?date=2030-01-01")
    invalid = await client.get(f"/api/doctors/{doctor}/slots?date=nope", headers=headers)
    missing = await client.get("/no/such/path")

    assert (ok.status_code, anonymous.status_code, invalid.status_code) == (200, 401, 422)
    assert missing.status_code == 404
    for status in ("200", "401", "422"):
        assert _count("GET", route, status) == before[status] + 1
    assert _count("GET", "unmatched", "404") == unmatched + 1
