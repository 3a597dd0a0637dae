"""Which failures are retried until they succeed and which are parked at once."""

from __future__ import annotations

import asyncpg
import httpx
import pytest
from aiokafka.errors import KafkaConnectionError

from reservo.core.aio.breaker import BreakerOpen
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.failures import Rejected, is_transient
from reservo.core.messaging.transport.base import TransportUnavailable
from reservo.notifications.channels import NotificationError


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError("refused"),
        TimeoutError(),
        OSError("network unreachable"),
        httpx.ConnectError("refused"),
        KafkaConnectionError(),
        TransportUnavailable("broker away"),
        BreakerOpen("payments", 1.0),
        NotificationError("smtp answered 451"),
        DomainError("unavailable", "database away", status=503),
        DomainError("rate_limited", status=429),
        asyncpg.exceptions.SerializationError("retry"),
        asyncpg.exceptions.CannotConnectNowError("starting up"),
    ],
    ids=repr,
)
def test_a_dependency_away_is_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        Rejected("malformed"),
        KeyError("matchId"),
        ValueError("bad payload"),
        TypeError("None is not a dict"),
        DomainError("account_not_found", status=404),
        DomainError("validation_error", status=422),
        asyncpg.exceptions.UniqueViolationError("duplicate"),
        asyncpg.exceptions.NumericValueOutOfRangeError("too big"),
    ],
    ids=repr,
)
def test_a_rejected_event_is_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)
