"""Structured logs: every line of the process one JSON object.

structlog's own loggers and every standard-library logger (uvicorn, aiokafka,
httpx, asyncpg, asyncio, warnings, ...) go through the same processors: the
request id and trace ids of the work in progress (core/kernel/tracing.py), the level,
the logger's name, an ISO timestamp, and an exception rendered into one field
(``exception``: the traceback as one string, never lines of its own). An
exception nobody caught (the main thread's, another thread's) is logged the same
way. A line-based log shipper reads every line as one record.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
from typing import Any

import structlog

from reservo.core.kernel.tracing import add_trace_ids


def _shared() -> list[structlog.types.Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def configure(level: str = "INFO", json: bool = True) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    # Tracebacks become one field in JSON; the console renderer draws its own.
    exc: list[structlog.types.Processor] = [structlog.processors.format_exc_info] if json else []
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[*_shared(), structlog.processors.StackInfoRenderer(), *exc, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared(), structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *exc,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Libraries that set up handlers of their own (uvicorn's, when it configures
    # its logging) would print lines of their own format beside ours: every
    # logger goes through the root's handler instead.
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            logger.handlers.clear()
            logger.propagate = True
    logging.captureWarnings(True)
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread


_crash = structlog.get_logger("reservo.crash")


def _uncaught(
    kind: type[BaseException], value: BaseException, tb: types.TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return
    _crash.critical("uncaught_exception", exc_info=(kind, value, tb))


def _uncaught_in_thread(args: Any) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    _crash.critical(
        "uncaught_exception_in_thread",
        thread=getattr(args.thread, "name", None),
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
