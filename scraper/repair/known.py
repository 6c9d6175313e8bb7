"""The values a repair may learn from: stored, stable over earlier runs, and never its own.

A row's value for a field is known when the row exists and holds one, and stable when the
history records no insert of the row and no change of the field in this run, in the
``REPAIR_STABLE_RUNS - 1`` runs before it, nor in any run since a repair of that field was
first in force: what a repair produced, or a value the page may have just changed, proves
nothing about where the field is.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg2 import sql

from ..items.base import StoredItem
from ..storage.history import key_match


def threshold(cur: Any, spider: str, item_type: str, field: str, run_id: int, stable_runs: int) -> int:
    """The first run whose changes make a value unstable."""
    first = run_id
    if stable_runs > 1:
        cur.execute(
            "SELECT run_id FROM crawl_runs WHERE spider = %s AND run_id < %s ORDER BY run_id DESC LIMIT %s",
            (spider, run_id, stable_runs - 1),
        )
        earlier = [int(r[0]) for r in cur.fetchall()]
        if earlier:
            first = min(earlier)
    cur.execute(
        "SELECT min(run_id) FROM repairs WHERE spider = %s AND item_type = %s AND field = %s"
        " AND status IN ('active', 'superseded', 'reverted')",
        (spider, item_type, field),
    )
    repaired = cur.fetchone()[0]
    if repaired is not None:
        first = min(first, int(repaired))
    return first


def stable_values(
    cur: Any, item_type: type[StoredItem], field: str, keys: list[list[Any]], since_run: int
) -> dict[str, Any]:
    """Key (as JSON) -> the stored, stable value of *field* for each of *keys* that has one."""
    if not keys:
        return {}
    query = sql.SQL(
        "SELECT r.key::text, t.{field} FROM jsonb_array_elements(%s::jsonb) AS r(key)"
        " JOIN {table} t ON {match}"
        " WHERE t.{field} IS NOT NULL AND NOT EXISTS ("
        "   SELECT 1 FROM item_changes c WHERE c.item_table = %s AND c.key = r.key"
        "   AND (c.kind = 'insert' OR c.changes ? %s) AND (c.run_id >= %s OR c.reason = 'repair'))"
    ).format(
        field=sql.Identifier(field),
        table=sql.Identifier(item_type.table),
        match=key_match(item_type, "t", "r.key"),
    )
    cur.execute(query, (json.dumps(keys, default=str), item_type.table, field, since_run))
    return {key_text(json.loads(k)): value for k, value in cur.fetchall()}


def key_text(key: list[Any]) -> str:
    return json.dumps(key, default=str, separators=(",", ":"))


def last_selector(cur: Any, spider: str, item_type: str, field: str, run_id: int) -> str | None:
    """The selector most items took *field* from in the spider's latest earlier run that counted
    sources (the one in use before the break, when this run's pages no longer read it)."""
    cur.execute("SELECT to_regclass('field_sources') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    cur.execute(
        "SELECT selector FROM field_sources WHERE spider = %s AND item_type = %s AND field = %s AND run_id ="
        " (SELECT max(run_id) FROM field_sources WHERE spider = %s AND run_id < %s)"
        " AND selector NOT IN ('missing', 'url', 'request', 'unknown', 'constant')"
        " AND selector NOT LIKE 'repair:%%' ORDER BY items DESC LIMIT 1",
        (spider, item_type, field, spider, run_id),
    )
    found = cur.fetchone()
    return found[0] if found else None
