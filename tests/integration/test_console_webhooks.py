"""The console's webhooks page: endpoints, their recent deliveries, and the
redeliver button (CSRF-checked, admin session), the same use case as
POST /api/webhook-deliveries/{id}/redeliver."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from reservo.settings import Settings
from tests.helpers.console import signed_in
from tests.helpers.scheduler import Stack, api_stack
from tests.helpers.waiting import wait_until
from tests.integration.test_webhooks_out import (
    BOOKED,
    LOOPBACK,
    Subscriber,
    _status,
    publish,
    running,
    subscribe,
)


@pytest.fixture
async def stack(base_settings: Settings, own_database: str) -> AsyncIterator[Stack]:
    async with api_stack(base_settings, own_database, **LOOPBACK) as s:
        yield s


async def _jobs(stack: Stack, delivery_id: int) -> int:
    found: int = await stack.db.fetchval(
        "SELECT count(*) FROM scheduled_job WHERE category = 'webhooks.deliver'"
        " AND (payload->>'deliveryId')::bigint = $1",
        delivery_id,
    )
    return found


async def test_the_page_lists_endpoints_and_deliveries_and_redelivers_with_csrf(
    stack: Stack,
) -> None:
    c = stack.client
    async with Subscriber() as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        await publish(stack)
        async with running(stack):
            await wait_until(lambda: _status(stack, created["id"], "DELIVERED"), timeout_s=20)
            delivery_id = await stack.db.fetchval("SELECT id FROM webhook_delivery")
            csrf = await signed_in(c)
            page = await c.get("/console/webhooks")
            assert page.status_code == 200
            assert sub.url in page.text and f'href="/console/webhooks/{created["id"]}"' in page.text
            assert created["secret"] not in page.text
            page = await c.get(f"/console/webhooks/{created['id']}")
            assert page.status_code == 200
            assert f'id="delivery-{delivery_id}"' in page.text and "DELIVERED" in page.text
            action = f"/console/webhooks/{created['id']}/deliveries/{delivery_id}/redeliver"
            assert f'action="{action}"' in page.text
            # Without the session's CSRF token: refused, nothing queued.
            r = await c.post(action, data={})
            assert r.status_code == 403
            assert await _jobs(stack, delivery_id) == 1
            r = await c.post(action, data={"csrf": csrf})
            assert r.status_code == 303
            assert r.headers["location"] == f"/console/webhooks/{created['id']}"
            await wait_until(lambda: len(sub.received) >= 2, timeout_s=20)
        assert await _jobs(stack, delivery_id) == 2
        assert sub.received[1].headers["webhook-id"] == sub.received[0].headers["webhook-id"]
        # Unknown ones: the API's 404, shown on the page.
        r = await c.get("/console/webhooks/999999")
        assert r.status_code == 404
        r = await c.post(
            f"/console/webhooks/{created['id']}/deliveries/999999/redeliver", data={"csrf": csrf}
        )
        assert r.status_code == 404 and "no delivery 999999" in r.text


async def test_the_page_needs_a_signed_in_admin(stack: Stack) -> None:
    r = await stack.client.get("/console/webhooks")
    assert r.status_code in (303, 307)
    assert "/console/sign-in" in r.headers["location"]
