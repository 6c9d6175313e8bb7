"""The relay: reads ``item_changes`` after a sink's position and publishes to that sink.

One process per sink (``scrapy feed run --sink KIND``), apart from the crawl: the crawl's cost is
unchanged by the feed. A session advisory lock per sink keeps a second relay of the same sink
waiting (so ``docker compose up --scale`` cannot publish everything twice); it is released by
Postgres when the holder's connection ends, a killed relay's included.

The order of things makes the guarantee: read a batch after the saved position, send it,
wait for every confirm, then save the position past it (with its dead letters, in one
transaction). A relay killed anywhere sends at most the last unsaved batch again, with the
same ids. A sink that is down or refuses is waited for (the waits double up to
``CHANGEFEED_RETRY_MAX_GAP``), said once, and nothing moves until it takes the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg2

from ..runtime.secrets import redact
from . import dead_letters, position
from .config import FeedConfig
from .metrics import FeedMetrics
from .sinks.base import Sink, SinkError, SinkFatal

logger = logging.getLogger(__name__)

_DB_LOST = (psycopg2.OperationalError, psycopg2.InterfaceError)


@dataclass
class Progress:
    sink: str
    published: int = 0  # by this relay, this run
    dead: int = 0
    batches: int = 0
    retries: int = 0
    last_id: int | None = None
    lag: float | None = None  # seconds from the last event's transaction start to its confirm
    started: float = 0.0

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        lag = "" if self.lag is None else f", lag {self.lag:.1f} s"
        return (
            f"feed {self.sink}: {self.published:,} events published ({self.published / elapsed:,.0f}/s), "
            f"{self.dead:,} dead letters, {self.retries:,} retries, last event {self.last_id or '-'}{lag}"
        )


class Relay:
    def __init__(
        self,
        dsn: str,
        sink: Sink,
        conf: FeedConfig,
        name: str | None = None,
        say: Callable[[str], None] | None = None,
        progress_every: float = 10.0,
        metrics: FeedMetrics | None = None,
    ) -> None:
        self.dsn = dsn
        self.sink = sink
        self.conf = conf
        #: the position's name: the sink's kind unless told (two webhooks need two names)
        self.name = name or sink.kind
        self.say = say or (lambda text: logger.info("%s", text))
        self.progress_every = progress_every
        self.progress = Progress(self.name)
        self.metrics = metrics or FeedMetrics(self.name)
        self._conn: Any = None
        self._reader: position.Reader | None = None
        self._said: str | None = None
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Finish the batch in hand, save, and return (SIGTERM)."""
        self._stop.set()

    def _tell(self, text: str) -> None:
        """Say *text* once while the trouble lasts (not once per retry)."""
        if text != self._said:
            self._said = text
            self.say(redact(text))

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass

    def _gap(self, attempt: int) -> float:
        return min(0.2 * 2**attempt, self.conf.retry_max_gap)

    # --- Postgres -----------------------------------------------------------------------------
    async def _connect(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                conn = psycopg2.connect(self.dsn)
                # One transaction under a lock: two relays (one per sink) starting together would
                # otherwise race in CREATE TABLE IF NOT EXISTS, which Postgres does not serialise.
                with conn, conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", (position.LOCK_NAMESPACE,))
                    position.ensure(cur)
                    dead_letters.ensure(cur)
                conn.autocommit = True
                await self._lock(conn)
                self._conn = conn
                self._reader = position.Reader(conn, self.name)
                return
            except _DB_LOST as exc:
                self._tell(f"feed {self.name}: Postgres unreachable, waiting ({type(exc).__name__})")
                await self._pause(self._gap(attempt))
                attempt += 1

    async def _lock(self, conn: Any) -> None:
        while not self._stop.is_set():
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (position.LOCK_NAMESPACE, self.name))
                if cur.fetchone()[0]:
                    return
            self._tell(f"feed {self.name}: another relay publishes to this sink; waiting for it to stop")
            # Short: a killed relay's lock goes as soon as Postgres sees its connection closed.
            await self._pause(0.1)

    def _disconnect(self) -> None:
        conn, self._conn, self._reader = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except psycopg2.Error:
                pass

    # --- the loop -----------------------------------------------------------------------------
    async def run(self, follow: bool = True) -> Progress:
        """Publish until everything committed is published (*follow* False) or until stopped."""
        self.progress.started = time.monotonic()
        last_said = time.monotonic()
        last_saved = time.monotonic()
        await self._connect()
        try:
            await self._open_sink(follow)
            while not self._stop.is_set():
                try:
                    assert self._reader is not None
                    events = self._reader.read(self.conf.batch)
                    if not events:
                        if not follow:
                            self._reader.save()
                            break
                        if time.monotonic() - last_saved >= 5:  # an idle position kept fresh
                            self._reader.save()
                            last_saved = time.monotonic()
                        await self._pause(self.conf.poll_interval)
                        continue
                    delivery = await self._publish(events, follow)
                    if delivery is None:  # stopped while the sink was away
                        break
                    self._advance(events, delivery.dead)
                    last_saved = time.monotonic()
                except _DB_LOST as exc:
                    self._tell(f"feed {self.name}: lost Postgres ({type(exc).__name__}); reconnecting")
                    self._disconnect()
                    await self._pause(self._gap(0))
                    await self._connect()
                    continue
                if time.monotonic() - last_said >= self.progress_every:
                    last_said = time.monotonic()
                    self.say(self.progress.line())
        finally:
            await self.sink.close()
            self._disconnect()
        return self.progress

    def _give_up_by(self, follow: bool) -> float:
        """When a relay run ``--once`` stops waiting for a sink in trouble since now (a one-off
        job must end); a following relay waits as long as it takes."""
        return float("inf") if follow else time.monotonic() + self.conf.publish_timeout

    async def _open_sink(self, follow: bool) -> None:
        attempt = 0
        give_up_by = self._give_up_by(follow)
        while not self._stop.is_set():
            try:
                await self.sink.open()
                self._tell(f"feed {self.name}: publishing to {self.sink.describe()}")
                return
            except SinkFatal:
                raise
            except SinkError as exc:
                self.metrics.sink_up.set(0)
                if time.monotonic() >= give_up_by:
                    raise SinkFatal(f"{exc}; gave up waiting") from None
                self._tell(f"feed {self.name}: {exc}; waiting")
                await self._pause(self._gap(attempt))
                attempt += 1

    async def _publish(self, events: list, follow: bool) -> Any:
        attempt = 0
        give_up_by = self._give_up_by(follow)
        while True:
            try:
                delivery = await self.sink.publish(events)
                if attempt:
                    self._tell(f"feed {self.name}: {self.sink.kind} takes events again")
                return delivery
            except SinkFatal:
                raise
            except SinkError as exc:
                self.metrics.sink_up.set(0)
                self.metrics.retries.inc()
                if time.monotonic() >= give_up_by:
                    raise SinkFatal(f"{exc}; gave up waiting") from None
                self.progress.retries += 1
                self._tell(f"feed {self.name}: {exc}; the batch waits (nothing is lost)")
                if self._stop.is_set():
                    return None
                await self._pause(self._gap(attempt))
                if self._stop.is_set():
                    return None
                attempt += 1

    def _advance(self, events: list, dead: list) -> None:
        reader = self._reader
        assert reader is not None and self._conn is not None
        with self._conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                if dead:
                    dead_letters.record(cur, self.name, dead)
                reader.advance(events, dead=len(dead), cur=cur)
                cur.execute("COMMIT")
            except BaseException:
                if not self._conn.closed:
                    cur.execute("ROLLBACK")
                raise
        if dead:
            self.say(f"feed {self.name}: {len(dead)} events kept as dead letters ({dead[0][1]})")
        progress = self.progress
        progress.published += len(events) - len(dead)
        progress.dead += len(dead)
        progress.batches += 1
        progress.last_id = events[-1].id
        at = events[-1].at
        progress.lag = max(time.time() - at.timestamp(), 0.0) if at is not None else None
        self.metrics.delivered(len(events) - len(dead), len(dead), progress.lag)
