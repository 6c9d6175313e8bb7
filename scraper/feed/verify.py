"""What left and what Postgres holds, per sink: ``scrapy feed verify`` and ``scrapy feed status``.

An event has left for a sink when the sink's saved position is past its row: the position is
saved only after the sink confirmed every event before it (or kept one as a dead letter). So
per sink: events delivered = rows behind the position less its dead letters, and the feed is
whole when that equals the rows of ``item_changes`` (of one run, or of all). The position's own
counter of rows advanced past is checked against the rows behind it too: a difference means
history rows were deleted or rewritten after they were published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import dead_letters, position


@dataclass
class SinkCheck:
    sink: str
    rows: int  # rows of item_changes in scope
    behind: int  # of them, rows the position is past
    dead: int  # of those, dead letters
    counter: int | None  # the position's own count (whole history only)
    relay_running: bool
    updated_at: Any
    last_id: int | None
    problems: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return self.behind - self.dead


def _scope(spider: str | None, run_id: int | None) -> tuple[str, list[Any]]:
    if spider is None:
        return "true", []
    if run_id is None:
        return "spider = %s", [spider]
    return "spider = %s AND run_id = %s", [spider, run_id]


def check(
    conn: Any, sinks: list[str] | None = None, spider: str | None = None, run_id: int | None = None
) -> list[SinkCheck]:
    """One check per sink that has a position (or per sink named in *sinks*)."""
    scope, scope_params = _scope(spider, run_id)
    out = []
    with conn.cursor() as cur:
        known = {p.sink: (p, updated) for p, updated in position.all_positions(cur)}
        cur.execute(
            "SELECT to_regclass('item_changes') IS NOT NULL, to_regclass(%s) IS NOT NULL", (dead_letters.TABLE,)
        )
        has_history, has_dead = cur.fetchone()
        cur.execute("SELECT to_regclass('item_changes_pruned') IS NOT NULL")
        dropped = 0
        if cur.fetchone()[0]:
            cur.execute("SELECT coalesce(sum(rows), 0) FROM item_changes_pruned")
            dropped = int(cur.fetchone()[0])
        for name in sinks if sinks is not None else sorted(known):
            pos, updated = known.get(name, (position.Position(name), None))
            rows = behind = dead = 0
            if has_history:
                condition, params = position.behind_condition(pos)
                cur.execute(
                    f"SELECT count(*), count(*) FILTER (WHERE {condition}) FROM item_changes WHERE {_positional(scope)}",
                    {**params, **{f"p{i}": v for i, v in enumerate(scope_params)}},
                )
                rows, behind = cur.fetchone()
            if has_dead:
                cur.execute(
                    f"SELECT count(*) FROM change_feed_dead_letters d JOIN item_changes ON item_changes.id = d.event_id"
                    f" WHERE d.sink = %(sink)s AND {_positional(scope)}",
                    {"sink": name, **{f"p{i}": v for i, v in enumerate(scope_params)}},
                )
                dead = cur.fetchone()[0]
            cur.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s::oid"
                " AND objid = (hashtext(%s)::bigint & 4294967295)::oid AND objsubid = 2)",
                (position.LOCK_NAMESPACE, name),
            )
            running = cur.fetchone()[0]
            result = SinkCheck(
                name, rows, behind, dead, pos.published if spider is None else None, running, updated, pos.last_id
            )
            if name not in known:
                result.problems.append("no relay has published to this sink yet")
            if rows > behind:
                result.problems.append(
                    f"{rows - behind:,} events not published yet"
                    + ("" if running else " (no relay of this sink is running: scrapy feed run --sink ...)")
                )
            if dead:
                result.problems.append(f"{dead:,} events are dead letters (change_feed_dead_letters)")
            # Months of history dropped by retention went out to every sink that had a position
            # then (retention keeps a month a sink has not published): they count as behind it.
            # A sink started after the drop never saw them.
            if result.counter is not None and result.counter not in (behind, behind + dropped):
                result.problems.append(
                    f"the position counts {result.counter:,} events advanced past, item_changes has {behind:,} "
                    + (f"(and {dropped:,} dropped by retention) " if dropped else "")
                    + "behind it (history rows deleted or rewritten after publishing?)"
                )
            out.append(result)
    return out


def _positional(scope: str) -> str:
    """*scope* with its ``%s`` as named parameters ``p0``, ``p1`` ... (one parameter style per
    statement)."""
    parts = scope.split("%s")
    return "".join(part + (f"%(p{i})s" if i < len(parts) - 1 else "") for i, part in enumerate(parts))
