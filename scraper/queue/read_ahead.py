"""The next take from the shared queue, sent before it is needed and read when it is.

A take is a round trip to Redis that the reactor thread waited for: on the demo shop about
1,600 per 5,800 pages, 4-6 % of the crawl's time with the site, Redis and Postgres sharing two
cores. Once the engine has been handed the last request taken, the next take is written to a
connection of its own and left there; its reply is read when the engine asks again (a page later,
by when it has long arrived), or as soon as the scheduler must know what it brought (idle check,
close). No thread and no event-loop client: sending and reading stay the synchronous client's
own calls, split apart. (An asyncio client was measured too: its bookkeeping per call cost the
reactor thread more CPU than the wait it saved.)

Plain Redis only: a cluster client routes each command itself, and takes synchronously.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import redis


class ReadAhead:
    """At most one command in flight on a connection of its own."""

    def __init__(self, server: Any) -> None:
        self.pool = server.connection_pool
        self.conn: Any = None
        #: Requests the command in flight may bring (0: none in flight); they count against
        #: the lease cap until read.
        self.count = 0
        self._parse: Callable[[Any], list[Any]] | None = None
        self.sent_at = 0.0

    @staticmethod
    def usable(server: Any) -> bool:
        return isinstance(server, redis.Redis)

    def send(self, count: int, command: list[Any], parse: Callable[[Any], list[Any]]) -> bool:
        """Write *command* now; :meth:`collect` reads its reply, through *parse*."""
        if self.count or count <= 0:
            return False
        try:
            if self.conn is None:
                self.conn = self.pool.get_connection()
            self.conn.send_command(*command)
        except Exception:
            # The next synchronous take meets the outage, and reports it.
            self._drop()
            return False
        self.count, self._parse = count, parse
        self.sent_at = time.monotonic()
        return True

    def ready(self) -> bool:
        """Reading the reply of the command in flight would not wait: it has arrived, reading it
        fails at once, or it has been out for over a second (then the reader waits for it, up to
        the socket timeout, rather than ask forever)."""
        if getattr(self.conn, "_sock", None) is None or time.monotonic() - self.sent_at > 1.0:
            return True
        try:
            return bool(self.conn.can_read(0))
        except Exception:
            return True  # collect() raises it

    def collect(self) -> list[Any]:
        """What the command in flight brought ([] when none was sent). Raises what reading
        raised (Redis unreachable): whatever the command did, its leases run out and return."""
        if not self.count:
            return []
        parse, self.count, self._parse = self._parse, 0, None
        try:
            reply = self.conn.read_response()
        except BaseException:
            self._drop()
            raise
        return parse(reply)

    def _drop(self) -> None:
        self.count, self._parse = 0, None
        if self.conn is not None:
            self.conn.disconnect()  # reconnected by the next send

    def close(self) -> None:
        """Give the connection back (after :meth:`collect`: a reply left unread would be read
        by the next user of the connection as its own)."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            if self.count:
                self.count, self._parse = 0, None
                conn.disconnect()
            self.pool.release(conn)
