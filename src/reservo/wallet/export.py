"""The statement as CSV, streamed: a server-side cursor read in chunks inside
one read-only transaction, each chunk written out before the next is fetched,
so a download of 1,000,000 entries holds one chunk in memory at a time.

The transaction stays open while the client reads, which holds a pool
connection and PostgreSQL's xmin horizon: hence the bounds (settings
wallet_statement_*): a whole download ends within ``max_s`` (cut short after),
each fetch is a statement under ``fetch_timeout_s``, and at most ``streams``
downloads per process run at once (503 statement_busy beyond)."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

import structlog
from starlette.responses import StreamingResponse
from starlette.types import Send

from reservo.core.db.database import Database
from reservo.core.kernel.errors import DomainError
from reservo.wallet import repo
from reservo.wallet.config import WalletSettings

log = structlog.get_logger(__name__)

HEADER = ("entry_id", "created_at", "kind", "amount", "balance_after", "transfer_id", "reference")
# A cell a spreadsheet would run as a formula starts with one of these: such a
# reference is written with a leading apostrophe (OWASP, CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _text(value: str | None) -> str:
    if value is None:
        return ""
    return "'" + value if value.startswith(_FORMULA_START) else value


def _instant(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def csv_chunk(rows: Sequence[Any], balance: int | None) -> tuple[bytes, int | None]:
    """CSV lines (RFC 4180: quoted where needed, CRLF) for ``rows`` in id order,
    and the balance after the last. ``balance_after`` is carried: the balance
    before the first row of the download (its stored balance_after minus its
    amount), plus each amount in turn, so the column always adds up."""
    out = io.StringIO()
    writer = csv.writer(out)
    for r in rows:
        if balance is None:
            balance = r["balance_after"] - r["amount"]
        balance += r["amount"]
        writer.writerow(
            (
                r["id"],
                _instant(r["created_at"]),
                _text(r["kind"]),
                r["amount"],
                balance,
                r["transfer_id"],
                _text(r["reference"]),
            )
        )
    return out.getvalue().encode(), balance


def header_line() -> bytes:
    out = io.StringIO()
    csv.writer(out).writerow(HEADER)
    return out.getvalue().encode()


class StatementExport:
    """Opens the downloads of one process, at most ``streams`` at a time."""

    def __init__(self, db: Database, config: WalletSettings) -> None:
        self.db, self.config = db, config
        self.running = 0

    def response(
        self, account_id: int, start: datetime, end: datetime, filename: str
    ) -> StreamingResponse:
        headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
        return BoundedStream(
            self.lines(account_id, start, end), self.config.statement_max_s, headers
        )

    async def lines(self, account_id: int, start: datetime, end: datetime) -> AsyncIterator[bytes]:
        """The header, then a chunk of lines per fetch. Taking the slot and the
        connection happen on the first step, before any byte is sent, so a
        refusal is still a problem answer (BoundedStream primes it)."""
        if self.running >= self.config.statement_streams:
            raise DomainError(
                "statement_busy",
                "too many statements are being downloaded; try again shortly",
                headers={"Retry-After": "5"},
            )
        self.running += 1
        try:
            async with self.db.connection() as conn, conn.transaction(readonly=True):
                await repo.statement_bounds(
                    conn,
                    int(self.config.statement_fetch_timeout_s * 1000),
                    int((self.config.statement_max_s + 60) * 1000),
                )
                cursor = repo.statement_cursor(
                    conn, account_id, start, end, self.config.statement_prefetch
                )
                yield header_line()
                balance: int | None = None
                rows: list[Any] = []
                async for row in cursor:
                    rows.append(row)
                    if len(rows) == self.config.statement_prefetch:
                        chunk, balance = csv_chunk(rows, balance)
                        rows = []
                        yield chunk
                if rows:
                    yield csv_chunk(rows, balance)[0]
        finally:
            self.running -= 1


class StatementCut(RuntimeError):
    """The download ran past its time: the response ends without its last
    chunk, so the client sees an incomplete body, never a short statement."""


class BoundedStream(StreamingResponse):
    """A StreamingResponse whose body is primed before the headers go out (an
    error on its first step is answered as a problem), always closed (its
    transaction ends when the client leaves), and cut after ``max_s``."""

    def __init__(self, body: AsyncIterator[bytes], max_s: float, headers: dict[str, str]) -> None:
        super().__init__(body, headers=headers, media_type="text/csv; charset=utf-8")
        self._body, self._max_s = body, max_s

    async def stream_response(self, send: Send) -> None:
        async with aclosing(self._body) as body:  # type: ignore[type-var]
            first = await anext(body)
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            try:
                async with asyncio.timeout(self._max_s):
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                    async for chunk in body:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except TimeoutError:
                log.warning("wallet_statement_cut", max_s=self._max_s)
                raise StatementCut(f"statement download ran past {self._max_s} s") from None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
