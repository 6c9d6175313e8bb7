"""Page states read by key, in batches, off the reactor thread.

One connection and one query in flight: the keys asked for while a query runs are read together
by the next one, so a busy crawl (many pages each looking up its links) makes few, larger
queries rather than a query per page, and the reactor never waits on the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg2
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from ..runtime.worker_threads import defer_to_thread
from . import store
from .schedule import PageState

CHUNK = 1000  # keys per statement: a query plan and a message of bounded size


class StateReader:
    def __init__(self, dsn: str, spider: str) -> None:
        self.dsn = dsn
        self.spider = spider
        self.queries = 0  # statements run (read by the stats)
        self._conn: Any = None
        self._running = False
        self._wanted: dict[bytes, None] = {}  # ordered, no duplicates
        self._waiting: list[Deferred] = []

    def read(self, keys: Iterable[bytes]) -> Deferred:
        """A Deferred firing with the known states among *keys* (and perhaps others: the keys
        asked for meanwhile are read by the same query), or failing with the database's error."""
        wanted = self._wanted
        for key in keys:
            wanted[key] = None
        waiter: Deferred = Deferred()
        self._waiting.append(waiter)
        if not self._running:
            self._next()
        return waiter

    def _next(self) -> None:
        keys, waiting = list(self._wanted), self._waiting
        self._wanted, self._waiting = {}, []
        self._running = True
        done = defer_to_thread(self._fetch, keys)
        done.addBoth(self._answer, waiting)

    def _answer(self, result: Any, waiting: list[Deferred]) -> None:
        self._running = False
        if self._waiting:
            self._next()
        for waiter in waiting:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    def _fetch(self, keys: list[bytes]) -> dict[bytes, PageState]:
        found: dict[bytes, PageState] = {}
        try:
            if self._conn is None:
                self._conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="revisit-reader")
                self._conn.autocommit = True  # reads only: no transaction held between them
            with self._conn.cursor() as cur:
                for start in range(0, len(keys), CHUNK):
                    found.update(store.fetch(cur, self.spider, keys[start : start + CHUNK]))
                    self.queries += 1
        except psycopg2.Error:
            self._close()
            raise
        return found

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg2.Error:
                pass

    def close(self) -> None:
        """Drop the connection (a query still running keeps it until it ends, then reconnects)."""
        if not self._running:
            self._close()
