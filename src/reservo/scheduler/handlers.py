"""Built-in job handlers."""

from __future__ import annotations

from typing import Any

import httpx

from reservo.scheduler.domain import Job


class HttpError(Exception):
    """A non-2xx answer: the job is retried with backoff."""


class HttpHandler:
    """Category ``http``: payload ``{url, method?, headers?, body?}``. Sends
    ``Idempotency-Key: <jobId>`` so the receiver can drop a repeated delivery."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.client = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)

    async def __call__(self, job: Job) -> None:
        p: dict[str, Any] = job.payload
        headers = {str(k): str(v) for k, v in (p.get("headers") or {}).items()}
        headers["Idempotency-Key"] = str(job.id)
        body = p.get("body")
        response = await self.client.request(
            str(p.get("method") or "POST").upper(),
            str(p["url"]),
            headers=headers,
            json=body if body is not None else None,
        )
        if not 200 <= response.status_code < 300:
            raise HttpError(f"{p['url']} answered {response.status_code}")

    async def aclose(self) -> None:
        await self.client.aclose()
