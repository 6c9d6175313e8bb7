"""Undo what a repair wrote (``scrapy repairs SPIDER --revert ID``).

The repair stops being applied, and each value of its field that a run since the repair changed
goes back to what it was before, from the history, as ``scrapy runs --revert`` undoes a run: one
history entry per row (reason ``revert``), a value changed again later is left as it is (counted
as superseded), and the row's content hash is cleared so the next crawl writes the page again.
Rows inserted since are kept: the rest of their values came from the spider's own selectors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql

from ..items.base import StoredItem
from ..storage import history
from ..storage.revert import UNHASHED


@dataclass
class Undone:
    values: int = 0
    superseded: int = 0


def revert_field(cur: Any, spider: str, item_type: type[StoredItem], field: str, since_run: int) -> Undone:
    """Set *field* back on every row a run of *spider* from *since_run* on changed it (in the
    caller's transaction)."""
    done = Undone()
    history.ensure(cur)
    cur.execute(
        "SELECT key, changes->%s FROM item_changes WHERE item_table = %s AND spider = %s AND run_id >= %s"
        " AND changes ? %s AND reason <> 'revert' ORDER BY id",
        (field, item_type.table, spider, since_run, field),
    )
    first: dict[str, list[Any]] = {}  # key -> [the value before the first change, the latest value written]
    for key, (old, new) in cur.fetchall():
        text = json.dumps(key)
        if text in first:
            first[text][1] = new
        else:
            first[text] = [old, new]
    table, match = sql.Identifier(item_type.table), history.key_match(item_type, "t", "%(key)s::jsonb")
    undone: list[history.Change] = []
    for text, (old, latest) in first.items():
        params = {"key": text}
        cur.execute(
            sql.SQL("SELECT to_jsonb(t)->{} FROM {} t WHERE {} FOR UPDATE").format(sql.Literal(field), table, match),
            params,
        )
        found = cur.fetchone()
        if found is None or found[0] != latest:
            done.superseded += 1
            continue
        cur.execute(
            sql.SQL(
                "UPDATE {table} t SET {col} = (SELECT {col} FROM jsonb_populate_record(NULL::{table}, %(values)s::jsonb)),"
                " content_hash = %(unhashed)s WHERE {match}"
            ).format(table=table, col=sql.Identifier(field), match=match),
            {**params, "values": json.dumps({field: old}, default=str), "unhashed": UNHASHED},
        )
        done.values += 1
        undone.append(history.Change(json.loads(text), "update", {field: [latest, old]}))
    if undone:
        history.record(cur, item_type.table, undone, history.Context(spider, None, "revert"))
    return done
