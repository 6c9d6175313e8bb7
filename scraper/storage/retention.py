"""History in monthly partitions, and how long it is kept (``HISTORY_RETENTION_DAYS``).

``item_changes`` gets a row per change per item, every run. Kept forever by default; with a
retention, whole months go at once: each month is a partition of its own (range of ``at``, in
UTC), and dropping one is a catalog change, as fast at a billion rows as at a thousand, where a
``DELETE`` would rewrite and vacuum the table. Partitions are made three months ahead by every
node's start and by ``scrapy migrate``; a default partition takes any row no month covers yet,
so a write never fails for want of one.

A month goes only when it is wholly past the retention, and only once every change-feed sink
has published all of it (a sink behind keeps it, and says so). What was dropped is recorded
(``item_changes_pruned``): reverts and the history command refuse the time before it by name
instead of finding nothing, and ``scrapy feed verify`` counts the dropped events as delivered.

A table made before partitioning is converted by ``scrapy migrate --partition-history``: it
becomes, in place (no copy), the partition of everything up to the end of its newest row's
month, and goes as one piece once that month is past the retention.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg2 import errors, sql

# Monthly partitions of ``at`` (see retention.py: a month of history is dropped in O(1)). The
# primary key of a partitioned table holds its partition key. The id's sequence is made apart
# so that a table converted from before partitioning keeps counting from its own.
PARTITIONED_DDL = """
CREATE SEQUENCE IF NOT EXISTS item_changes_id_seq;
CREATE TABLE IF NOT EXISTS item_changes (
    id          bigint NOT NULL DEFAULT nextval('item_changes_id_seq'),
    item_table  text NOT NULL,
    key         jsonb NOT NULL,
    kind        text NOT NULL,   -- insert | update | gone | back
    reason      text NOT NULL,   -- crawl | reprocess
    spider      text,
    run_id      bigint,
    at          timestamptz NOT NULL DEFAULT now(),
    changes     jsonb NOT NULL DEFAULT '{}'::jsonb,
    xid         xid8 DEFAULT pg_current_xact_id(),
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
ALTER SEQUENCE item_changes_id_seq OWNED BY item_changes.id;
CREATE INDEX IF NOT EXISTS item_changes_key_idx ON item_changes (item_table, key, at);
CREATE INDEX IF NOT EXISTS item_changes_at_idx ON item_changes (at);
CREATE INDEX IF NOT EXISTS item_changes_xid_idx ON item_changes (xid);
"""
PARENT = "item_changes"
DEFAULT = "item_changes_default"
LEGACY = "item_changes_before"
MONTHS_AHEAD = 3
PRUNED_DDL = """
CREATE TABLE IF NOT EXISTS item_changes_pruned (
    partition   text PRIMARY KEY,
    range_from  timestamptz,
    range_to    timestamptz NOT NULL,
    rows        bigint NOT NULL,
    dropped_at  timestamptz NOT NULL DEFAULT now()
)
"""
_TO = re.compile(r"TO \('([^']+)'\)")
_FROM = re.compile(r"FROM \('([^']+)'\)")


class RetentionError(Exception):
    """History that was dropped was asked for (the message names the setting and the date)."""


@dataclass
class Partition:
    name: str
    start: datetime | None  # None: from the beginning (the converted table)
    end: datetime | None  # None: the default partition


@dataclass
class PruneReport:
    dropped: list[tuple[str, int]] = field(default_factory=list)
    kept_for_feed: list[tuple[str, str]] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    drop_seconds: float = 0.0  # the DROPs alone, under their lock

    def lines(self) -> list[str]:
        out = [f"history: dropped {name} ({rows:,} changes)" for name, rows in self.dropped]
        out += [
            f"history: kept {name}: sink {sink} has not published all of it yet" for name, sink in self.kept_for_feed
        ]
        out += [f"history: {name} is in use (locked); it goes at the next start" for name in self.busy]
        return out


def month_start(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def next_month(start: datetime) -> datetime:
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def partition_name(start: datetime) -> str:
    return f"item_changes_p{start:%Y%m}"


def is_partitioned(cur: Any) -> bool:
    cur.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", (PARENT,))
    row = cur.fetchone()
    return bool(row and row[0])


def partitions(cur: Any) -> list[Partition]:
    cur.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
        (PARENT,),
    )
    out = []
    for name, bound in cur.fetchall():
        # Bounds as Postgres prints them in the session's zone: '2026-12-01 01:00:00+01'.
        start = _FROM.search(bound or "")
        end = _TO.search(bound or "")
        out.append(
            Partition(
                name,
                datetime.fromisoformat(start.group(1)) if start else None,
                datetime.fromisoformat(end.group(1)) if end else None,
            )
        )
    return out


def _default_holds(cur: Any, existing: set[str], start: datetime) -> bool:
    """Whether rows of the month from *start* sit in the default partition already (no node
    started for months): the month then stays there, which loses nothing, since a partition of
    it cannot be made while the default one holds its rows."""
    if DEFAULT not in existing:
        return False
    cur.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE at >= %s AND at < %s)").format(sql.Identifier(DEFAULT)),
        (start, next_month(start)),
    )
    return bool(cur.fetchone()[0])


def ensure_ahead(cur: Any, now: datetime | None = None, months: int = MONTHS_AHEAD) -> list[str]:
    """The months from *now*'s to *months* ahead, and the default partition, made if missing."""
    start = month_start(now or datetime.now(UTC))
    made = []
    existing = {p.name for p in partitions(cur)}
    for _ in range(months + 1):
        name = partition_name(start)
        if name not in existing and not _default_holds(cur, existing, start):
            cur.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM (%s) TO (%s)").format(
                    sql.Identifier(name), sql.Identifier(PARENT)
                ),
                (start, next_month(start)),
            )
            made.append(name)
        start = next_month(start)
    if DEFAULT not in existing:
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} DEFAULT").format(
                sql.Identifier(DEFAULT), sql.Identifier(PARENT)
            )
        )
    return made


def _unpublished_by(cur: Any, name: str) -> str | None:
    """A sink of the change feed that has not published every row of partition *name*."""
    from ..feed import position  # the feed reads history; history asks the feed only this

    cur.execute("SELECT to_regclass('change_feed_positions') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    # The month's newest transaction, from its index: a sink whose published snapshot (lo) has
    # every transaction before that one done saw every row of the month, without reading it.
    cur.execute(sql.SQL("SELECT max(xid) FROM {}").format(sql.Identifier(name)))
    newest = cur.fetchone()[0]
    for pos, _updated in position.all_positions(cur):
        if pos.lo is not None:
            if newest is None:
                continue
            cur.execute("SELECT %s::xid8 < pg_snapshot_xmin(%s::pg_snapshot)", (newest, pos.lo))
            if cur.fetchone()[0]:
                continue
        condition, params = position.behind_condition(pos)
        cur.execute(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE NOT {})").format(sql.Identifier(name), sql.SQL(condition)),
            params,
        )
        if cur.fetchone()[0]:
            return pos.sink
    return None


def prune(conn: Any, keep_days: float, now: datetime | None = None, lock_timeout: str = "2s") -> PruneReport:
    """Drop every month of history wholly older than *keep_days*, each in its own transaction."""
    report = PruneReport()
    if keep_days <= 0:
        return report
    horizon = (now or datetime.now(UTC)) - timedelta(days=keep_days)
    with conn, conn.cursor() as cur:
        if not is_partitioned(cur):
            return report
        cur.execute(PRUNED_DDL)
        old = [p for p in partitions(cur) if p.end is not None and p.end <= horizon]
    for part in old:
        with conn, conn.cursor() as cur:
            sink = _unpublished_by(cur, part.name)
            if sink is not None:
                report.kept_for_feed.append((part.name, sink))
                continue
            # A DROP waits for every reader of the parent; a long report must not make every
            # writer queue behind the DROP: give up quickly and try at the next start.
            # Counted for the record (the feed's check counts dropped events as delivered): one
            # read of an old month, which no writer waits for; the drop alone takes the lock.
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(part.name)))
            rows = cur.fetchone()[0]
            cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(lock_timeout)))
            try:
                cur.execute("SAVEPOINT drop_month")
                started = time.perf_counter()
                cur.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(part.name)))
                report.drop_seconds += time.perf_counter() - started
                cur.execute(
                    "INSERT INTO item_changes_pruned (partition, range_from, range_to, rows) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (partition) DO UPDATE SET rows = item_changes_pruned.rows + EXCLUDED.rows,"
                    " dropped_at = now()",
                    (part.name, part.start, part.end, rows),
                )
                report.dropped.append((part.name, rows))
            except errors.LockNotAvailable:
                cur.execute("ROLLBACK TO SAVEPOINT drop_month")
                report.busy.append(part.name)
    return report


def kept_since(cur: Any) -> datetime | None:
    """The start of the history still kept (None: nothing was ever dropped)."""
    cur.execute("SELECT to_regclass('item_changes_pruned') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    cur.execute("SELECT max(range_to) FROM item_changes_pruned")
    return cur.fetchone()[0]


def dropped_rows(cur: Any) -> int:
    cur.execute("SELECT to_regclass('item_changes_pruned') IS NOT NULL")
    if not cur.fetchone()[0]:
        return 0
    cur.execute("SELECT coalesce(sum(rows), 0) FROM item_changes_pruned")
    return int(cur.fetchone()[0])


def refuse_before(cur: Any, when: datetime | None, what: str) -> None:
    """RetentionError when *what* (which happened at *when*) is older than the history kept."""
    since = kept_since(cur)
    if since is not None and when is not None and when < since:
        raise RetentionError(
            f"{what} is older than the history kept (since {since:%Y-%m-%d %H:%M} UTC; "
            "HISTORY_RETENTION_DAYS dropped the months before)"
        )


def convert(cur: Any, now: datetime | None = None) -> bool:
    """A plain ``item_changes`` turned into the partitioned table, in place: the old table is
    attached as the partition of everything up to the end of the month of its newest row (so
    that it goes, whole, once that month is past the retention). False when it is partitioned
    already."""
    if is_partitioned(cur):
        return False
    now = now or datetime.now(UTC)
    cur.execute("LOCK TABLE item_changes IN ACCESS EXCLUSIVE MODE")
    cur.execute("SELECT max(at) FROM item_changes")
    newest = cur.fetchone()[0]
    start = next_month(month_start(newest)) if newest is not None else month_start(now)
    # The partitioned table's key is (id, at): attaching builds that index on the old table,
    # whose own key on id alone would be a second primary key.
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'item_changes'::regclass AND contype = 'p'")
    for (name,) in cur.fetchall():
        cur.execute(sql.SQL("ALTER TABLE item_changes DROP CONSTRAINT {}").format(sql.Identifier(name)))
    cur.execute(f"ALTER TABLE item_changes RENAME TO {LEGACY}")
    for index in ("item_changes_key_idx", "item_changes_at_idx", "item_changes_xid_idx"):
        cur.execute(
            sql.SQL("ALTER INDEX IF EXISTS {} RENAME TO {}").format(
                sql.Identifier(index), sql.Identifier(index.replace("item_changes", LEGACY))
            )
        )
    cur.execute("ALTER SEQUENCE IF EXISTS item_changes_id_seq OWNED BY NONE")
    cur.execute(PARTITIONED_DDL)
    # Checked first, so that ATTACH does not scan the table again under its lock.
    cur.execute(
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT item_changes_before_range CHECK (at < {})").format(
            sql.Identifier(LEGACY), sql.Literal(start)
        )
    )
    cur.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN xid SET DEFAULT pg_current_xact_id()")
    cur.execute(
        sql.SQL("ALTER TABLE item_changes ATTACH PARTITION {} FOR VALUES FROM (MINVALUE) TO ({})").format(
            sql.Identifier(LEGACY), sql.Literal(start)
        )
    )
    # The months from there to now (empty) and ahead.
    months = (now.year - start.year) * 12 + now.month - start.month
    ensure_ahead(cur, start, months=max(months, 0) + MONTHS_AHEAD)
    return True
