"""What the lean-path tests compare: an answer with the ids of a scenario's own data masked."""

from __future__ import annotations

from typing import Any

import httpx

ID_FIELDS = ("id", "slotId", "doctorId", "patientId", "startAt", "endAt", "createdAt")
# A search scenario's own cars: their plates, city and host differ between runs.
ID_FIELDS += ("plate", "city", "hostId")


def shape(r: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    """Status, body with the ids of the scenario's own data masked, and headers."""
    body: Any = r.json() if r.content else None

    def mask(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ("<id>" if k in ID_FIELDS else mask(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [mask(x) for x in v]
        return v

    headers = dict(r.headers)
    # Ids of the two runs may differ in length: the length must be the body's.
    assert int(headers.pop("content-length")) == len(r.content)
    # Every answer echoes its request id (core/tracing.py), a new one per request.
    assert len(headers.pop("x-request-id")) == 32
    return r.status_code, mask(body), headers
