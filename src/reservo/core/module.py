"""The one face every module shows the composition root.

A module's ``setup.py`` builds its objects from the settings and the shared parts
and returns a ``Module``: the routes it serves, the events it consumes, the job
kinds it runs, the background roles it offers, the error codes and constraint
names it may answer with, and the notifications its events become. The root
(``reservo.bootstrap``) only lists the modules and wires what they declare; the
app includes the routers they declare. Nothing is patched into a module after
it was built."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from reservo.core.kernel.contract import EventSpec
from reservo.core.maintenance.retention import PruneRule
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import BatchHandler, Event, Handler

# A background role: runs until ``stop`` is set (``reservo worker --roles <name>``).
Role = Callable[[asyncio.Event], Awaitable[None]]
# Runs one delayed job (a ``reservo.scheduler.Job``); must be idempotent.
JobHandler = Callable[[Any], Awaitable[None]]
# Refuses a job payload at enqueue time through the API (raises DomainError).
JobCheck = Callable[[dict[str, Any]], None]
# Turns an event into the messages it sends (the notifications consumer): each
# (message id, recipient) once, message ids derived from the event's id.
Renderer = Callable[[Event], list[Notification]]
Closer = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Consumes:
    """One consumer (with Kafka: one consumer group) and the topics it handles."""

    consumer: str
    topics: Sequence[str]
    handler: Handler
    # Optional fast path: a whole fetched batch in one transaction (see DESIGN.md).
    batch: BatchHandler | None = None


@dataclass(frozen=True)
class JobKind:
    """A category of delayed job the module runs, with its optional enqueue check.

    ``payload`` is the model of the category's payload: the jobs API refuses a
    payload it does not accept (422) and the handler parses the payload with it,
    so a job that runs has a payload its handler reads. ``public``: services may
    create such jobs through the API (``http``); a module's own categories
    (expiring a hold, a reminder) act on other people's data and are created by
    the module itself, so through the API only an admin may create them."""

    category: str
    handler: JobHandler
    check: JobCheck | None = None
    payload: type[BaseModel] | None = None
    public: bool = False


@dataclass(frozen=True, kw_only=True)
class Module:
    name: str
    routers: Sequence[APIRouter] = ()
    # The endpoints of those routes' hottest ones, served on the fast path
    # (core/http/hotroute.py).
    hot: Sequence[Callable[..., Any]] = ()
    consumes: Sequence[Consumes] = ()
    jobs: Sequence[JobKind] = ()
    roles: Mapping[str, Role] = field(default_factory=dict)
    # Run in every process that hosts the graph (each API process and each
    # ``reservo worker``), whatever its roles, until it stops: per-process
    # duties such as sampling that process's counters (console/pulse.py).
    companions: Sequence[Role] = ()
    # code -> HTTP status of every DomainError code the module raises.
    errors: Mapping[str, int] = field(default_factory=dict)
    # constraint name -> (code, detail): a refused write becomes that DomainError.
    constraints: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # The events it emits (or takes in and republishes): name, topic, key and
    # payload schema (core/kernel/contract.py); the AsyncAPI document is made of these.
    events: Sequence[EventSpec] = ()
    # topic -> renderer: the notifications the module's events become.
    notifications: Mapping[str, Renderer] = field(default_factory=dict)
    # What its routes read from ``request.app.state`` (name -> object).
    state: Mapping[str, object] = field(default_factory=dict)
    closers: Sequence[Closer] = ()
    # What the retention pruner deletes of its tables and after how long (its
    # ``*_prune``/``*_prunable`` statements paired with its settings); the
    # maintenance role runs every module's rules.
    retention: Sequence[PruneRule] = ()
    # Periodic work of the module the maintenance role runs beside the retention
    # (the invariant checks, reservo/verify): each runs until ``stop`` is set.
    maintenance: Sequence[Role] = ()
    # Paths (templates such as "/api/matches/{matchId}/resettle") whose requests
    # the request deadline (core/http/deadline.py) leaves alone: one long
    # transaction with its own statement timeout, which a 503 at the deadline
    # would cancel every time, so that no retry could ever succeed.
    unbounded: Sequence[str] = ()
