"""The batched Postgres writer shared by the validate and store pipelines of one crawl.

Items are buffered per table and written in batches (by size, by age, and on close) in a worker
thread, one batch at a time on one connection, so the crawl loop never waits on the database.
Each ``add`` returns a Deferred that fires with the row's outcome once its batch is committed:
a pipeline that awaits it knows the item is durable, and a slow or absent database naturally
slows the crawl down instead of filling memory.

Transient failures (deadlock, serialization failure, a dropped connection) are retried with
backoff; a row the database refuses (a value out of range, say) is isolated and reported as
failed without failing the rest of its batch.

While the database is away, rows wait here: ``over_limit()`` tells the backpressure middleware
(:mod:`scraper.middlewares.backpressure`) to hold new downloads once ``POSTGRES_MAX_PENDING``
rows wait, so memory stays bounded and the crawl pauses instead of piling up pages. After
``POSTGRES_RETRY_TIMEOUT`` seconds without a database the writer gives up: every waiting row
fails with :class:`DatabaseUnavailable` at once (the store pipeline dead-letters their pages),
and so does every later row, without another long wait.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2.extras import execute_values
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import defer, task

from ..items.base import StoredItem
from ..runtime.secrets import redact
from ..runtime.worker_threads import defer_to_thread
from . import held, history, schema
from .upsert import BatchResult, Row, TableUpserter, Watch

logger = logging.getLogger(__name__)

_RETRYABLE = (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure)
_CONNECTION_LOST = (psycopg2.OperationalError, psycopg2.InterfaceError)
_ROW_REFUSED = (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.ProgrammingError)


@dataclass
class Pending:
    row: Row
    deferred: defer.Deferred


class _Refused(Exception):
    """The database refused a row of *table*'s batch: the transaction is written again, that
    table's rows one by one."""

    def __init__(self, table: str) -> None:
        super().__init__(table)
        self.table = table


class WriteFailed(Exception):
    """The database refused a row, or stayed unreachable past the retry budget."""


class DatabaseUnavailable(WriteFailed):
    """The database stayed unreachable for longer than ``POSTGRES_RETRY_TIMEOUT``."""


class PostgresWriter:
    def __init__(
        self,
        dsn: str,
        batch_size: int = 1000,
        flush_interval: float = 1.0,
        last_seen_resolution: float = 3600.0,
        retry_timeout: float = 600.0,
        max_pending: int = 10_000,
        stall_warn: float = 30.0,
        stats: Any = None,
        history_context: Callable[[], history.Context] | None = None,
    ) -> None:
        self.dsn = dsn
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.last_seen_resolution = last_seen_resolution
        self.retry_timeout = retry_timeout
        self.max_pending = max_pending
        self.stall_warn = stall_warn
        self._flush_started = 0.0
        self._flush_pid: int | None = None
        self._stall_said = 0.0
        self._asking = False
        self.stats = stats
        # Called per flush (the run id may be known only once the crawl runs); None: no history.
        self.history_context = history_context
        # Set once the database stayed away past retry_timeout: later rows fail at once.
        self.gave_up: str | None = None
        self._in_flight = 0
        self._room: list[defer.Deferred] = []
        self._conn: Any = None
        self._types: dict[str, type[StoredItem]] = {}
        self._upserters: dict[str, TableUpserter] = {}
        self._buffers: dict[str, list[Pending]] = defaultdict(list)
        self._rejects: list[tuple[dict[str, Any], defer.Deferred]] = []
        self._oldest: float | None = None
        self._flushing: defer.Deferred | None = None
        self._loop = task.LoopingCall(self._tick)
        self._closed = False
        # Item type -> the changes that wait for the run's judgement (see upsert.Watch); set by
        # the quality guard, which judges them.
        self._watch: Callable[[type[StoredItem]], Watch | None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self, item_types: list[type[StoredItem]]) -> None:
        """Connect and migrate, synchronously: a crawl must not start without its tables."""
        self._conn = self._connect()
        schema.migrate(self._conn, item_types)
        for item_type in item_types:
            self._register(item_type)
        self._loop.start(max(self.flush_interval / 4, 0.01), now=False)

    async def close(self) -> None:
        self._closed = True
        # The loop runs on while the last rows drain: a stall at the end is said too.
        while self.pending() or self._flushing is not None:
            await maybe_deferred_to_future(self._flushing if self._flushing is not None else self._flush())
        if self._loop.running:
            self._loop.stop()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def pending(self) -> int:
        return sum(len(b) for b in self._buffers.values()) + len(self._rejects)

    def over_limit(self) -> bool:
        """True while more rows wait (buffered or being written) than ``max_pending``."""
        return self.gave_up is None and self.pending() + self._in_flight >= self.max_pending

    def wait_for_room(self) -> defer.Deferred:
        """Fires once the rows waiting drop to half of ``max_pending`` (or the writer gives up);
        the hysteresis keeps a recovering database from being hit by one download at a time."""
        d: defer.Deferred = defer.Deferred()
        self._room.append(d)
        return d

    def _release_room(self) -> None:
        if self._room and (self.gave_up is not None or self.pending() + self._in_flight <= self.max_pending // 2):
            waiting, self._room = self._room, []
            for d in waiting:
                d.callback(None)

    # --- adding -------------------------------------------------------------------------------
    def add(self, item_type: type[StoredItem], row: Row) -> defer.Deferred:
        """Queue *row*; the Deferred fires with ``inserted``/``updated``/``unchanged`` after commit."""
        if self.gave_up is not None:
            return defer.fail(DatabaseUnavailable(self.gave_up))
        if item_type.table not in self._types:
            self._register(item_type, migrate=True)
        d: defer.Deferred = defer.Deferred()
        self._buffers[item_type.table].append(Pending(row, d))
        self._note_added()
        return d

    def add_reject(self, record: dict[str, Any]) -> defer.Deferred:
        if self.gave_up is not None:
            return defer.fail(DatabaseUnavailable(self.gave_up))
        d: defer.Deferred = defer.Deferred()
        self._rejects.append((record, d))
        self._note_added()
        return d

    def _note_added(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()
        if self.pending() >= self.batch_size and self._flushing is None:
            self._flush()

    def _tick(self) -> None:
        if self._flushing is not None and self.stall_warn and not self._asking:
            now = time.monotonic()
            if now - self._flush_started >= self.stall_warn and now - self._stall_said >= self.stall_warn:
                self._stall_said = now
                self._say_stall(now - self._flush_started)
        if self._flushing is None and self._oldest is not None:
            if time.monotonic() - self._oldest >= self.flush_interval or self.pending() >= self.batch_size:
                self._flush()

    def _register(self, item_type: type[StoredItem], migrate: bool = False) -> None:
        if migrate:
            # Not on self._conn: a flush may be using it in the worker thread right now.
            conn = self._connect()
            try:
                schema.migrate(conn, [item_type])
            finally:
                conn.close()
        self._types[item_type.table] = item_type
        spider = self.history_context().spider if self.history_context is not None else None
        columns = item_type.columns()
        self._upserters[item_type.table] = TableUpserter(
            item_type.table,
            list(columns),
            item_type.key,
            self.last_seen_resolution,
            spider=spider,
            track=self.history_context is not None,
            sql_history=all(_json_stable(columns[k]) for k in item_type.key),
            json_columns={c: _base_type(t) for c, t in columns.items() if _base_type(t) in ("json", "jsonb")},
        )
        if self._watch is not None:
            self._upserters[item_type.table].watch = self._watch(item_type)

    def set_watch(self, watch: Callable[[type[StoredItem]], Watch | None]) -> None:
        """Keep the changes *watch* names for an item type waiting for the run's judgement."""
        self._watch = watch
        for table, upserter in self._upserters.items():
            upserter.watch = watch(self._types[table])

    # --- flushing -----------------------------------------------------------------------------
    def _flush(self) -> defer.Deferred:
        batches = {table: buf[: self.batch_size] for table, buf in self._buffers.items() if buf}
        for table, taken in batches.items():
            del self._buffers[table][: len(taken)]
        rejects, self._rejects = self._rejects[: self.batch_size], self._rejects[self.batch_size :]
        self._oldest = time.monotonic() if self.pending() else None
        started = time.monotonic()
        self._flush_started, self._stall_said = started, started
        self._flush_pid = self._conn.get_backend_pid() if self._conn is not None and not self._conn.closed else None
        self._in_flight = sum(map(len, batches.values())) + len(rejects)
        d = defer_to_thread(self._write, batches, [r for r, _ in rejects])
        self._flushing = d

        def done(results: dict[str, BatchResult]) -> None:
            self._flushing = None
            self._in_flight = 0
            rows = 0
            for table, pendings in batches.items():
                for p, outcome in outcomes(pendings, results[table]):
                    rows += 1
                    if isinstance(outcome, WriteFailed):
                        p.deferred.errback(outcome)
                    else:
                        p.deferred.callback(outcome)
            for _, rd in rejects:
                rd.callback("rejected")
            if self.stats is not None:
                for table, result in results.items():
                    name = self._types[table].__name__
                    for _, waiting in result.awaiting.values():
                        for f in waiting:
                            self.stats.inc_value(f"values/waiting/{name}.{f}")
                    for f, (pairs, moved) in result.pairs.items():
                        self.stats.inc_value(f"values/pairs/{name}.{f}", pairs)
                        self.stats.inc_value(f"values/moved/{name}.{f}", moved)
                self.stats.inc_value("postgres/batches")
                self.stats.inc_value("postgres/rows_written", rows + len(rejects))
                self.stats.inc_value("postgres/flush_seconds_total", time.monotonic() - started)
            self._after_flush()

        def failed(failure: Any) -> None:
            self._flushing = None
            self._in_flight = 0
            message = redact(" ".join(str(failure.value).split()))
            waiting = list(batches.values())
            waiting_rejects = list(rejects)
            error: type[WriteFailed] = WriteFailed
            if failure.check(*_CONNECTION_LOST) and not failure.check(*_RETRYABLE):
                # Every row behind this batch would wait just as long again: fail them all now.
                self.gave_up = message = f"database unavailable for over {self.retry_timeout:g} s: {message}"
                error = DatabaseUnavailable
                waiting += list(self._buffers.values())
                waiting_rejects += self._rejects
                self._buffers.clear()
                self._rejects = []
                self._oldest = None
            rows = sum(map(len, waiting)) + len(waiting_rejects)
            logger.error("Giving up on %d rows: %s", rows, message)
            if self.stats is not None:
                self.stats.inc_value("postgres/write_failures")
                self.stats.inc_value("postgres/rows_failed", rows)
            for pendings in waiting:
                for p in pendings:
                    p.deferred.errback(error(message))
            for _, rd in waiting_rejects:
                rd.errback(error(message))
            self._after_flush()

        d.addCallbacks(done, failed)
        return d

    def _after_flush(self) -> None:
        self._release_room()
        # Keep draining while full batches wait, and always on close.
        if self.pending() and (self._closed or self.pending() >= self.batch_size):
            from twisted.internet import reactor

            reactor.callLater(0, self._flush_if_idle)

    def _flush_if_idle(self) -> None:
        if self._flushing is None and self.pending():
            self._flush()

    # --- the worker thread --------------------------------------------------------------------
    def _say_stall(self, waited: float) -> None:
        """Warns that no batch committed for *waited* s, with what Postgres reports of the
        writer's backend, asked on a connection of its own (the writer's is busy waiting)."""
        self._asking = True
        rows, pid = self.pending() + self._in_flight, self._flush_pid

        def ask() -> str:
            if pid is None:
                return "no connection yet"
            conn = psycopg2.connect(self.dsn, connect_timeout=5)
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SET statement_timeout = 5000")
                    cur.execute(
                        "SELECT state, wait_event_type, wait_event, pg_blocking_pids(pid)"
                        " FROM pg_stat_activity WHERE pid = %s",
                        (pid,),
                    )
                    found = cur.fetchone()
            finally:
                conn.close()
            if found is None:
                return f"backend {pid} not found"
            state, kind, event, blocking = found
            return (
                f"backend {pid} {state}, waiting on {kind or '-'}/{event or '-'}, blocked by pids "
                f"{', '.join(map(str, blocking)) or 'none'}"
            )

        def said(report: Any) -> None:
            self._asking = False
            if not isinstance(report, str):
                report = f"could not ask ({redact(' '.join(str(report.value).split()))})"
            logger.warning(
                "Database stalled: no batch committed for %.0f s, %d rows waiting; Postgres: %s", waited, rows, report
            )
            if self.stats is not None:
                self.stats.inc_value("postgres/stall_warnings")

        defer_to_thread(ask).addBoth(said)

    def _connect(self) -> Any:
        # Named like the Redis connections: pg_stat_activity tells which process holds what.
        name = f"scraper:{socket.gethostname()}:{os.getpid()}"[:63]
        conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name=name)
        conn.autocommit = False
        return conn

    def _write(self, batches: dict[str, list[Pending]], rejects: list[dict[str, Any]]) -> dict[str, BatchResult]:
        deadline = time.monotonic() + self.retry_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return self._write_once(batches, rejects)
            except _RETRYABLE as exc:
                self._rollback()
                if attempt >= 10:
                    raise
                logger.info("Retrying a batch after %s (attempt %d)", type(exc).__name__, attempt)
            except _CONNECTION_LOST as exc:
                self._drop_connection()
                if time.monotonic() >= deadline:
                    raise
                logger.warning(
                    "Database unavailable (%s); retrying the batch (attempt %d)",
                    redact(" ".join(str(exc).split())),
                    attempt,
                )
            time.sleep(min(5.0, 0.05 * 2**attempt) * (0.5 + random.random()))

    def _write_once(self, batches: dict[str, list[Pending]], rejects: list[dict[str, Any]]) -> dict[str, BatchResult]:
        # A batch is written without a savepoint (a subtransaction and a round trip more for
        # every batch, to serve the rare refused row): when the database refuses a row, the
        # whole transaction is rolled back and written again, that table's rows one by one.
        one_by_one: set[str] = set()
        while True:
            try:
                return self._write_transaction(batches, rejects, one_by_one)
            except _Refused as refused:
                one_by_one.add(refused.table)

    def _write_transaction(
        self, batches: dict[str, list[Pending]], rejects: list[dict[str, Any]], one_by_one: set[str]
    ) -> dict[str, BatchResult]:
        results: dict[str, BatchResult] = {}
        context = self.history_context() if self.history_context is not None else None
        with self._conn:  # one transaction for the whole flush
            with self._conn.cursor() as cur:
                for table in sorted(batches):
                    rows = _last_per_key(p.row for p in batches[table])
                    upserter = self._upserters[table]
                    if table in one_by_one:
                        results[table] = self._write_row_by_row(cur, upserter, rows, context)
                    else:
                        try:
                            results[table] = upserter.write(cur, rows, context=context)
                        except _ROW_REFUSED as exc:
                            raise _Refused(table) from exc
                    if context is not None and results[table].changes:
                        # Same transaction as the rows: a change is committed with its history or not at all.
                        history.record(cur, table, results[table].changes, context)
                    if context is not None and results[table].awaiting:
                        held.write(cur, self._awaiting(table, results[table], context))
                if rejects:
                    _write_rejects(cur, rejects)
        return results

    def _awaiting(self, table: str, result: BatchResult, context: history.Context) -> list[dict[str, Any]]:
        item_type = self._types[table]
        out = []
        for row, waiting in result.awaiting.values():
            reasons = "; ".join(
                f"{f}: {_shown(old)} -> empty, waits for the run's {item_type.__name__}.{f} coverage check"
                if new is None
                else f"{f}: {_shown(old)} -> {_shown(new)}, waits for the run's {item_type.__name__}.{f} checks "
                "(a move beyond the field's shift, a field on probation at the run's start, or broken in it)"
                for f, (old, new) in sorted(waiting.items())
            )
            out.append(
                held.awaiting_record(context.spider or "", context.run_id or 0, item_type, row, waiting, reasons)
            )
        return out

    def _write_row_by_row(
        self, cur: Any, upserter: TableUpserter, rows: list[Row], context: history.Context | None = None
    ) -> BatchResult:
        result = BatchResult()
        for row in rows:
            # Its own round trip: whatever fails next (preparing the statements included) is
            # inside the savepoint.
            cur.execute("SAVEPOINT one_row")
            try:
                one = upserter.write(cur, [row], context=context)
                cur.execute("RELEASE SAVEPOINT one_row")
                result.inserted |= one.inserted
                result.updated |= one.updated
                result.changes += one.changes
                result.awaiting.update(one.awaiting)
                for f, (pairs, moved) in one.pairs.items():
                    counted = result.pairs.setdefault(f, [0, 0])
                    counted[0] += pairs
                    counted[1] += moved
            except _ROW_REFUSED as exc:
                cur.execute("ROLLBACK TO SAVEPOINT one_row")
                result.failed[row.key] = "database refused the row: " + " ".join(str(exc).split())
        return result

    def _rollback(self) -> None:
        try:
            if self._conn is not None and not self._conn.closed:
                self._conn.rollback()
        except psycopg2.Error:
            self._drop_connection()

    def _drop_connection(self) -> None:
        try:
            if self._conn is not None:
                self._conn.close()
        except psycopg2.Error:
            pass
        self._conn = None


# Key column types whose values Postgres' jsonb and Python's json write alike (a history
# entry's key is compared as JSON, whichever of the two wrote it).
_JSON_STABLE = ("text", "varchar", "character varying", "integer", "bigint", "smallint", "int", "int4", "int8")


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _base_type(sql_type: str) -> str:
    return sql_type.strip().lower().split("(")[0].strip()


def _json_stable(sql_type: str) -> bool:
    return _base_type(sql_type) in _JSON_STABLE


def outcomes(pendings: list[Pending], result: BatchResult) -> list[tuple[Pending, str | WriteFailed]]:
    """Each pending item's outcome in its written batch: ``inserted``, ``updated``,
    ``unchanged``, or the failure of its row.

    A key that came twice in one batch is one row, written from the last of them (see
    :func:`_last_per_key`): that one carries the row's outcome, the earlier ones count as
    unchanged, so a run never counts more new rows than it stored (a response processed twice
    at once, by a processor that took back its own unrenewed stream entries, was counted so)."""
    last = {p.row.key: i for i, p in enumerate(pendings)}
    out: list[tuple[Pending, str | WriteFailed]] = []
    for i, p in enumerate(pendings):
        key = p.row.key
        if key in result.failed:
            out.append((p, WriteFailed(result.failed[key])))
        elif last[key] != i:
            out.append((p, "unchanged"))
        elif key in result.inserted:
            out.append((p, "inserted"))
        elif key in result.updated or key in result.awaiting:
            # A change waiting for the run's verdict is an update of the page, written once the
            # run is judged (or held with it).
            out.append((p, "updated"))
        else:
            out.append((p, "unchanged"))
    return out


def _last_per_key(rows: Any) -> list[Row]:
    # The same key twice in one INSERT … ON CONFLICT is an error (21000): the last one wins.
    unique: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        unique[row.key] = row
    return list(unique.values())


def _write_rejects(cur: Any, rejects: list[dict[str, Any]]) -> None:
    # The quality guard's held changes travel the rejects' path (same batching, same failure
    # handling) and are told apart here.
    held_records = [r for r in rejects if "held" in r]
    if held_records:
        held.write(cur, held_records)
        rejects = [r for r in rejects if "held" not in r]
        if not rejects:
            return
    unique = {r["id"]: r for r in rejects}
    execute_values(
        cur,
        """
        INSERT INTO rejects (id, spider, item_type, url, reasons, item) VALUES %s
        ON CONFLICT (id) DO UPDATE SET last_seen = now(), times_seen = rejects.times_seen + 1
        """,
        [
            (r["id"], r["spider"], r["item_type"], r.get("url"), r["reasons"], json.dumps(r["item"], default=str))
            for r in sorted(unique.values(), key=lambda r: r["id"])
        ],
    )
