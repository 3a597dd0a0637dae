"""The result webhook's intake: verified, checked, then held by Kafka or, when
Kafka does not acknowledge, by the PostgreSQL fallback table."""

from __future__ import annotations

import uuid
from datetime import datetime

import orjson
import structlog
from pydantic import ValidationError

from reservo.betting import domain, events, repo
from reservo.betting.publisher import Publisher
from reservo.betting.schemas import ResultIn
from reservo.core.aio.breaker import BreakerOpen, CircuitBreaker
from reservo.core.aio.retry import retry_async
from reservo.core.db.database import Database
from reservo.core.http.auth import verify_webhook
from reservo.core.http.json_intake import check_json
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError, model_issues, validation_error
from reservo.core.messaging.transport.base import Event

log = structlog.get_logger(__name__)


class ResultIntake:
    """POST /api/webhooks/match-results. The provider never resends, so 202 is
    answered only once Kafka acknowledged the result or PostgreSQL stored it."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        secret: str,
        *,
        tolerance_s: int = 300,
        publisher: Publisher | None = None,
        breaker: CircuitBreaker | None = None,
        attempts: int = 3,
        backoff_s: float = 0.05,
    ) -> None:
        self.db, self.clock, self.secret, self.tolerance_s = db, clock, secret, tolerance_s
        self.publisher = publisher
        self.breaker = breaker or CircuitBreaker("results_kafka", failure_threshold=3)
        self.attempts, self.backoff_s = attempts, backoff_s

    async def receive(self, raw: bytes, signature: str | None) -> str:
        """Returns where the result is held: ``kafka`` or ``fallback``."""
        now = self.clock.now()
        verify_webhook(self.secret, signature, raw, now, self.tolerance_s)
        try:
            # The JSON rules of every body (a key twice is 422 duplicate_key),
            # whatever Content-Type the provider sent: the model's own reader
            # would take a repeated key's last value.
            check_json(raw)
        except DomainError as refused:
            await self._reject(raw, refused, now)
            raise
        try:
            result = ResultIn.model_validate_json(raw)
        except ValidationError as exc:
            await self._reject(raw, exc, now)
            errors = model_issues(exc.errors(include_url=False), "body")
            raise validation_error("the result payload is not valid", errors) from None
        return await self._take(result, now)

    async def post_by_hand(self, result: ResultIn, admin: int) -> str:
        """A result an admin posted from the console for a match whose provider
        failed: the webhook's path after its signature check (same refusals, same
        event id from ``providerEventId``, so a second post settles nothing)."""
        log.warning(
            "match_result_posted_by_hand",
            admin=admin,
            provider_event_id=result.provider_event_id,
            match_external_id=result.match_external_id,
            status=result.status,
            home_score=result.home_score,
            away_score=result.away_score,
        )
        return await self._take(result, self.clock.now())

    async def _take(self, result: ResultIn, now: datetime) -> str:
        await self._check_started(result, now)
        payload = result.wire()
        event = Event(
            events.result_event_id(result.provider_event_id),
            events.RESULT_TOPIC,
            events.match_key(result.match_external_id),
            payload,
            now,
        )
        if self.publisher is not None:
            publisher = self.publisher
            try:
                await retry_async(
                    lambda: self.breaker.call(publisher.publish, event),
                    name="results_publish",
                    attempts=self.attempts,
                    base_s=self.backoff_s,
                    max_s=1.0,
                )
                metrics.RESULTS_RECEIVED.labels("kafka").inc()
                return "kafka"
            except BreakerOpen:
                log.warning("results_breaker_open", provider_event_id=result.provider_event_id)
            except Exception as exc:
                log.warning("results_publish_failed", error=repr(exc))
        try:
            async with self.db.transaction() as conn:
                await repo.fallback_insert(
                    conn, uuid.uuid4(), result.provider_event_id, payload, now
                )
            metrics.RESULTS_RECEIVED.labels("fallback").inc()
            return "fallback"
        except Exception as exc:
            # Neither Kafka nor PostgreSQL holds it: the provider must learn (503)
            # and the payload must at least reach the logs.
            log.error(
                "match_result_not_durable", payload=orjson.dumps(payload).decode(), error=repr(exc)
            )
            raise DomainError("unavailable", "the result could not be stored; retry") from exc

    async def _check_started(self, result: ResultIn, now: datetime) -> None:
        """Refuse (409, nothing stored) a final result for a match that has not
        started by this server's clock. Decided here, at intake, against the match
        row. An unknown match passes: the consumer keeps the result until the
        match is created (betting.results). When PostgreSQL cannot answer, the
        result is not refused: the provider never resends, and Kafka may still
        hold it durably; the settlement consumer applies the same rule before it
        records anything."""
        try:
            async with self.db.connection() as conn:
                match = await repo.match_by_external_id(conn, result.match_external_id)
        except DomainError as exc:
            if exc.status != 503:
                raise
            log.warning("match_result_unchecked", provider_event_id=result.provider_event_id)
            return
        if match is None:
            return
        try:
            domain.check_result(result.status, match["starts_at"], now)
        except domain.BetRefused as exc:
            log.warning(
                "match_result_refused",
                code=exc.code,
                provider_event_id=result.provider_event_id,
                match_external_id=result.match_external_id,
            )
            raise DomainError(exc.code, exc.detail) from None

    async def _reject(self, raw: bytes, exc: Exception, now: datetime) -> None:
        try:
            async with self.db.connection() as conn:
                await repo.record_rejected(
                    conn, "match-results", raw.decode(errors="replace"), str(exc)[:4000], now
                )
        except Exception as err:  # recording is for investigation; the 422 stands
            log.error(
                "webhook_reject_not_recorded", body=raw.decode(errors="replace"), error=repr(err)
            )
