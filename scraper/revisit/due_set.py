"""The pages a revisit run queues by itself: streamed from the ``(spider, next_due, page)`` index.

A page of rows at a time, each query short and on its own (keyset pagination, no cursor held open
across a run that may last hours), in a worker thread: what a node holds of the due set is one
page of rows, however many pages are due.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import psycopg2
from scrapy.utils.defer import maybe_deferred_to_future

from ..runtime.worker_threads import defer_to_thread
from . import store
from .schedule import PageState, Schedule

PAGE = 500  # rows per query


class DueSet:
    def __init__(self, dsn: str, spider: str, now: float, schedule: Schedule, page: int = PAGE) -> None:
        self.dsn = dsn
        self.spider = spider
        self.now = now
        self.schedule = schedule
        self.page = page
        self._conn: Any = None

    async def stream(self) -> AsyncIterator[tuple[bytes, PageState]]:
        """Each page due by its history at the run's start, in ``next_due`` order (the longest
        overdue first); a database error ends it (raised to the caller)."""
        after: tuple[datetime, bytes] | None = None
        try:
            while True:
                rows = await maybe_deferred_to_future(defer_to_thread(self._next, after))
                for key, state, _ in rows:
                    yield key, state
                if len(rows) < self.page:
                    return
                after = rows[-1][2]
        finally:
            # Quick, and no await: the stream may be closed by a spider that stops meanwhile.
            self._close()

    def _next(self, after: tuple[datetime, bytes] | None) -> list[tuple[bytes, PageState, tuple[datetime, bytes]]]:
        if self._conn is None:
            self._conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="revisit-due")
            self._conn.autocommit = True  # each page of rows its own statement: no snapshot held
        with self._conn.cursor() as cur:
            return store.due(
                cur,
                self.spider,
                self.now,
                after,
                self.page,
                trusted_after=self.now - self.schedule.maximum,
                hint_misses=self.schedule.hint_misses,
            )

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg2.Error:
                pass
