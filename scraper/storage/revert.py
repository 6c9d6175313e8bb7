"""Undo what a finished run changed, from the history (``scrapy runs SPIDER --revert RUN``).

Every insert, change, gone-mark and return a run wrote is in ``item_changes`` with its run id,
so it can be undone without fetching anything: a changed value goes back to the old one, a row
the run inserted is deleted, a row it marked gone is live again, a row it brought back is gone
again. Each undo is itself a history entry (reason ``revert``, the run's id), so the history
still tells what happened, and a run is reverted once.

A value a later run has changed since is newer than the run being reverted: it is left as it is
and counted as superseded, never overwritten with something older. A reverted row's content hash
is cleared, so the next crawl that sees the page writes it again if the page still differs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql

from ..items.base import StoredItem
from . import history, retention

logger = logging.getLogger(__name__)

# Written over a reverted row's content hash: no page's values hash to it.
UNHASHED = "reverted"


class AlreadyReverted(Exception):
    pass


@dataclass
class Reverted:
    values: int = 0
    deleted: int = 0
    revived: int = 0
    regone: int = 0
    superseded: int = 0

    def __str__(self) -> str:
        return (
            f"{self.values} value(s) set back, {self.deleted} inserted row(s) deleted, {self.revived} gone "
            f"row(s) live again, {self.regone} returned row(s) gone again, {self.superseded} change(s) left "
            "as a later run wrote them"
        )


def revert_run(
    conn: Any,
    spider: str,
    run_id: int,
    item_types: Iterable[type[StoredItem]],
    progress: Callable[[int, int], None] | None = None,
) -> Reverted:
    """Undo run *run_id* of *spider* in one transaction; raises AlreadyReverted."""
    done = Reverted()
    with conn, conn.cursor() as cur:
        history.ensure(cur)
        cur.execute(
            "SELECT 1 FROM item_changes WHERE spider = %s AND run_id = %s AND reason = 'revert' LIMIT 1",
            (spider, run_id),
        )
        if cur.fetchone():
            raise AlreadyReverted(f"run {run_id} of {spider} was reverted already")
        # A run older than the history kept has no rows left to undo: said, not "0 reverted".
        cur.execute("SELECT to_regclass('crawl_runs') IS NOT NULL")
        if cur.fetchone()[0]:
            cur.execute("SELECT min(started) FROM crawl_runs WHERE spider = %s AND run_id = %s", (spider, run_id))
            retention.refuse_before(cur, cur.fetchone()[0], f"run {run_id} of {spider}")
        for item_type in item_types:
            cur.execute(
                "SELECT id, key, kind, changes FROM item_changes WHERE item_table = %s AND spider = %s "
                "AND run_id = %s ORDER BY id DESC",
                (item_type.table, spider, run_id),
            )
            by_key: dict[str, list[tuple[int, list[Any], str, dict[str, Any]]]] = {}
            for entry_id, key, kind, changes in cur.fetchall():
                by_key.setdefault(json.dumps(key), []).append((entry_id, key, kind, changes))
            undone: list[history.Change] = []
            for n, entries in enumerate(by_key.values(), 1):
                change = _revert_key(cur, item_type, run_id, entries, done)
                if change is not None:
                    undone.append(change)
                if progress is not None and n % 1000 == 0:
                    progress(n, len(by_key))
            if undone:
                history.record(cur, item_type.table, undone, history.Context(spider, run_id, "revert"))
    return done


def _revert_key(
    cur: Any,
    item_type: type[StoredItem],
    run_id: int,
    entries: list[tuple[int, list[Any], str, dict[str, Any]]],
    done: Reverted,
) -> history.Change | None:
    """Undo one row's entries (newest first); the history entry of the undo, if any."""
    table, match = sql.Identifier(item_type.table), history.key_match(item_type, "t", "%(key)s::jsonb")
    key = entries[0][1]
    params = {"key": json.dumps(key)}
    cur.execute(sql.SQL("SELECT to_jsonb(t) FROM {} t WHERE {} FOR UPDATE").format(table, match), params)
    found = cur.fetchone()
    if found is None:
        done.superseded += len(entries)
        return None
    row = found[0]
    # Anything a later run wrote for this row makes an insert's deletion wrong.
    cur.execute(
        "SELECT 1 FROM item_changes WHERE item_table = %s AND key = %s::jsonb AND id > %s "
        "AND run_id IS DISTINCT FROM %s LIMIT 1",
        (item_type.table, params["key"], entries[0][0], run_id),
    )
    later = cur.fetchone() is not None
    values: dict[str, Any] = {}
    changed: dict[str, list[Any]] = {}
    gone: str | None = None
    for _, _, kind, changes in entries:
        if kind == "insert":
            if later:
                done.superseded += 1
                continue
            cur.execute(sql.SQL("DELETE FROM {} t WHERE {}").format(table, match), params)
            done.deleted += 1
            columns = item_type.columns()
            return history.Change(key, "delete", {c: [row.get(c), None] for c in columns if row.get(c) is not None})
        if kind == "gone":
            gone = "live"
            continue
        if kind == "back":
            gone = "gone"
        for field, (old, new) in changes.items():
            current = values.get(field, row.get(field))
            if current != new:
                done.superseded += 1
                continue
            values[field] = old
            changed[field] = [row.get(field), old]
    if values:
        columns = sql.SQL(", ").join(map(sql.Identifier, values))
        cur.execute(
            sql.SQL(
                "UPDATE {table} t SET ({cols}) = (SELECT {cols} FROM jsonb_populate_record(NULL::{table}, "
                "%(values)s::jsonb)), content_hash = %(unhashed)s WHERE {match}"
            ).format(table=table, cols=columns, match=match),
            {**params, "values": json.dumps(values, default=str), "unhashed": UNHASHED},
        )
        done.values += len(values)
    kind = "update"
    if gone == "live" and row.get("gone_at") is not None:
        cur.execute(sql.SQL("UPDATE {} t SET gone_at = NULL WHERE {}").format(table, match), params)
        done.revived += 1
        kind = "back"
    elif gone == "gone" and row.get("gone_at") is None:
        cur.execute(sql.SQL("UPDATE {} t SET gone_at = now() WHERE {}").format(table, match), params)
        done.regone += 1
        kind = "gone"
    if not changed and kind == "update":
        return None
    return history.Change(key, kind, changed)
