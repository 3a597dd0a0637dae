"""A statement past its timeout is abandoned (its connection closed), never cancelled.

asyncpg answers a command_timeout (or a cancelled request) with a CancelRequest
to the server. A COMMIT waiting for a synchronous standby that is cancelled does
not roll back: PostgreSQL ends the wait with a WARNING ("the transaction has
already committed locally") and the commit becomes visible on that server,
replicated to no one. On a primary cut off by a partition, the next request of
the same Idempotency-Key reaching it would read that commit and answer 2xx for a
write the failover is about to discard (pg_rewind). Closing the connection
instead leaves the backend waiting, its commit invisible, until a standby
acknowledges it (then it stands, and a retry finds it) or the server stops
(then it is gone, and the retry on the new primary makes it). The same holds for
a server-side statement_timeout, which reservo therefore does not set.

The price: a statement abandoned this way runs on in its backend until it ends
or tries to answer (a cancel would have stopped it); a timeout is rare (the
database is then overloaded or unreachable) and the pool is renewed after it
(core/db/database.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from asyncpg.transaction import Transaction


class _AbandonedTransaction(Transaction):  # type: ignore[misc]
    """A transaction whose block failed on an abandoned statement: the server
    rolls it back when the connection closes, and the block's own exception
    (a CancelledError stays a cancel, a timeout a timeout) is what the caller
    sees, not "connection is closed" from a ROLLBACK that could not be sent."""

    __slots__ = ()

    async def __aexit__(self, extype: Any, ex: Any, tb: Any) -> None:
        try:
            await super().__aexit__(extype, ex, tb)
        except asyncpg.exceptions.InterfaceError:
            if extype is None or not self._connection.is_closed():
                raise


class AbandoningConnection(asyncpg.Connection):  # type: ignore[misc]
    """``create_pool(connection_class=...)``."""

    def transaction(
        self, *, isolation: str | None = None, readonly: bool = False, deferrable: bool = False
    ) -> Transaction:
        self._check_open()
        return _AbandonedTransaction(self, isolation, readonly, deferrable)

    def _cancel_current_command(
        self, waiter: asyncio.Future[Any], cancel_waiter: asyncio.Future[Any] | None = None
    ) -> None:
        # asyncpg's hook, called from inside its timeout callback before it sets
        # the TimeoutError: closing right there would fail the waiter twice, so
        # the connection is closed on the next turn of the loop (before the
        # caller resumes). Closing completes both waiters.
        self._loop.call_soon(self._abandon)

    def _abandon(self) -> None:
        if self._pool_holder is None:
            self.terminate()
            return
        # Pooled: only the socket is closed. The pool may already be returning
        # the connection (a block cancelled outside a transaction goes straight
        # back): a full terminate() here would free its holder under it ("called
        # on a free connection holder"); the pool's release sees the connection
        # closed and finishes the cleanup itself.
        if not self._aborted and self._protocol is not None:
            self._abort()
