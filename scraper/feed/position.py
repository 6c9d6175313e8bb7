"""Where each sink is in ``item_changes``, kept in Postgres, and the next events after it.

Why not ``id > last``: ``id`` is taken when a row is inserted, not when its transaction commits.
Transaction A takes id 7, B takes id 8 and commits first; a reader that saw 8 and moved its
position past it never sees 7. So each row carries the id of the transaction that wrote it
(``item_changes.xid``, a column default) and the relay reads by what Postgres snapshots see:

- ``lo``: a snapshot every transaction of which is published (all its rows);
- ``hi``: a later snapshot being published: the rows of the transactions it sees and ``lo``
  does not, in ``id`` order, ``after_id`` being the last of them published.

When ``hi`` has no more rows it becomes ``lo`` and a new snapshot is taken. Each transaction is
seen first by exactly one snapshot, so each row is published once per sink (again only if the
relay dies between a sink's confirm and the saving of the position: at-least-once, same id).

Per item key the order is the commit order: two transactions that change one item lock its row
in turn, so the later one commits later, is first seen by the same snapshot or a later one, and
took its ``id`` after the earlier one committed. (Advancing only past the snapshot's ``xmin``
instead would publish a transaction that committed late but started early ahead of one that
changed the same item before it: ``xid`` order is start order, not commit order.)

A long transaction does not hold the feed back: what committed after it started is published
once committed; only its own rows wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .events import COLUMNS, Event

TABLE = "change_feed_positions"
DDL = """
CREATE TABLE IF NOT EXISTS change_feed_positions (
    sink        text PRIMARY KEY,
    lo          pg_snapshot,          -- every transaction it sees is published; NULL: none yet
    hi          pg_snapshot,          -- being published: what it sees and lo does not
    after_id    bigint NOT NULL DEFAULT 0,  -- of hi's rows, those up to this id are published
    published   bigint NOT NULL DEFAULT 0,  -- rows advanced past, all time
    dead        bigint NOT NULL DEFAULT 0,  -- of them, dead letters (a webhook gave up)
    last_id     bigint,               -- the last event advanced past
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""

# Every relay of one sink takes this lock (with the sink's name): two relays of one sink would
# publish everything twice.
LOCK_NAMESPACE = 0x5C12FEED


@dataclass(frozen=True)
class Position:
    sink: str
    lo: str | None = None
    hi: str | None = None
    after_id: int = 0
    published: int = 0
    dead: int = 0
    last_id: int | None = None


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def load(cur: Any, sink: str) -> Position:
    """*sink*'s saved position; a sink never run starts before the first row."""
    cur.execute(
        "SELECT lo::text, hi::text, after_id, published, dead, last_id FROM change_feed_positions WHERE sink = %s",
        (sink,),
    )
    row = cur.fetchone()
    return Position(sink) if row is None else Position(sink, *row)


def save(cur: Any, position: Position) -> None:
    cur.execute(
        "INSERT INTO change_feed_positions AS p (sink, lo, hi, after_id, published, dead, last_id)"
        " VALUES (%s, %s::pg_snapshot, %s::pg_snapshot, %s, %s, %s, %s)"
        " ON CONFLICT (sink) DO UPDATE SET lo = EXCLUDED.lo, hi = EXCLUDED.hi, after_id = EXCLUDED.after_id,"
        " published = EXCLUDED.published, dead = EXCLUDED.dead, last_id = EXCLUDED.last_id, updated_at = now()",
        (
            position.sink,
            position.lo,
            position.hi,
            position.after_id,
            position.published,
            position.dead,
            position.last_id,
        ),
    )


def all_positions(cur: Any) -> list[tuple[Position, Any]]:
    """Every sink's position and when it was last saved."""
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
    if not cur.fetchone()[0]:
        return []
    cur.execute(
        "SELECT sink, lo::text, hi::text, after_id, published, dead, last_id, updated_at"
        " FROM change_feed_positions ORDER BY sink"
    )
    return [(Position(*row[:7]), row[7]) for row in cur.fetchall()]


def current_snapshot(cur: Any) -> str:
    cur.execute("SELECT pg_current_snapshot()::text")
    return cur.fetchone()[0]


def fetch(cur: Any, position: Position, limit: int) -> list[Event]:
    """The next (at most *limit*) events of *position*'s ``hi`` after ``after_id``, in id order."""
    assert position.hi is not None
    if position.lo is None:
        # Rows without a transaction id were all committed before the column existed.
        where = "(xid IS NULL OR pg_visible_in_snapshot(xid, %(hi)s::pg_snapshot))"
    else:
        where = (
            "xid >= pg_snapshot_xmin(%(lo)s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %(lo)s::pg_snapshot)"
            " AND pg_visible_in_snapshot(xid, %(hi)s::pg_snapshot)"
        )
    cur.execute(
        f"SELECT {COLUMNS} FROM item_changes WHERE {where} AND id > %(after)s ORDER BY id LIMIT %(limit)s",
        {"lo": position.lo, "hi": position.hi, "after": position.after_id, "limit": limit},
    )
    return [Event.from_row(row) for row in cur.fetchall()]


def behind_condition(position: Position) -> tuple[str, dict[str, Any]]:
    """A WHERE condition on ``item_changes`` true of the rows *position* is past, and its
    parameters (for ``scrapy feed verify`` and ``status``)."""
    params = {"lo": position.lo, "hi": position.hi, "after": position.after_id}
    parts = []
    if position.lo is not None:
        # Rows without a transaction id went out with the first snapshot.
        parts += ["xid IS NULL", "pg_visible_in_snapshot(xid, %(lo)s::pg_snapshot)"]
        if position.hi is not None:
            parts.append("(pg_visible_in_snapshot(xid, %(hi)s::pg_snapshot) AND id <= %(after)s)")
    elif position.hi is not None:
        parts.append("((xid IS NULL OR pg_visible_in_snapshot(xid, %(hi)s::pg_snapshot)) AND id <= %(after)s)")
    return "(" + " OR ".join(parts or ["false"]) + ")", params


class Reader:
    """Reads *sink*'s next events and moves its position, on one connection (autocommit)."""

    def __init__(self, conn: Any, sink: str) -> None:
        self.conn = conn
        with conn.cursor() as cur:
            self.position = load(cur, sink)

    def read(self, limit: int) -> list[Event]:
        """The next events (none: everything committed so far is published)."""
        with self.conn.cursor() as cur:
            for _ in range(2):
                position = self.position
                if position.hi is None:
                    self.position = position = replace(position, hi=current_snapshot(cur))
                events = fetch(cur, position, limit)
                if events:
                    return events
                # Everything hi sees is published: it is the new lo, and a fresh snapshot may
                # see more (committed since hi was taken).
                self.position = replace(position, lo=position.hi, hi=None, after_id=0)
        return []

    def advance(self, events: list[Event], dead: int = 0, cur: Any = None) -> None:
        """Past *events* (published, or *dead* of them dead-lettered): saved at once."""
        self.position = replace(
            self.position,
            after_id=events[-1].id,
            published=self.position.published + len(events),
            dead=self.position.dead + dead,
            last_id=events[-1].id,
        )
        self.save(cur)

    def save(self, cur: Any = None) -> None:
        if cur is not None:
            save(cur, self.position)
            return
        with self.conn.cursor() as own:
            save(own, self.position)
