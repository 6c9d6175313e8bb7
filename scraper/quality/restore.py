"""Put back what a broken run blanked before the guard saw the break.

The guard judges a field once ``QUALITY_MIN_ITEMS`` items are in; the items before that were
stored as they came, so a few rows may have had a stored value overwritten with nothing. The
history has each of those changes (``[old, null]``), so the last node out of a run that broke
writes the old values back, only where the row still holds the blank, and records each
restoration in the history (reason ``guard``). The row's content hash is cleared: it was the
blank's, and a later write of the same blank must be seen as the change it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg2 import sql

from ..items.base import StoredItem
from ..storage.history import key_match
from ..storage.revert import UNHASHED


def restore_blanks(
    conn: Any, spider: str, run_id: int, item_types: Iterable[type[StoredItem]], broken: Iterable[str]
) -> int:
    """Restore the fields named in *broken* ("Type.field") that run *run_id* blanked; how many."""
    wanted: dict[str, list[str]] = {}
    for name in broken:
        type_name, field = name.split(".", 1)
        wanted.setdefault(type_name, []).append(field)
    total = 0
    ident = sql.Identifier
    with conn, conn.cursor() as cur:
        for item_type in item_types:
            columns = item_type.columns()
            for field in wanted.get(item_type.__name__, ()):
                if field not in columns or field in item_type.key:
                    continue
                match = key_match(item_type, "t", "b.key")
                cur.execute(
                    sql.SQL(
                        """
                    WITH blanked AS (
                        SELECT DISTINCT ON (c.key) c.key, c.changes->%(f)s->0 AS old
                        FROM item_changes c
                        WHERE c.item_table = %(table)s AND c.spider = %(spider)s AND c.run_id = %(run)s
                            AND c.kind = 'update' AND c.changes ? %(f)s
                            AND c.changes->%(f)s->1 = 'null'::jsonb AND c.changes->%(f)s->0 <> 'null'::jsonb
                        ORDER BY c.key, c.id
                    ), restored AS (
                        UPDATE {table} t SET {field} = (b.old #>> '{{}}')::{type}, content_hash = %(unhashed)s
                        FROM blanked b WHERE {match} AND t.spider = %(spider)s AND t.{field} IS NULL
                        RETURNING b.key, b.old
                    )
                    INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes)
                    SELECT %(table)s, r.key, 'update', 'guard', %(spider)s, %(run)s,
                        jsonb_build_object(%(f)s, jsonb_build_array(NULL, r.old))
                    FROM restored r
                    """
                    ).format(
                        table=ident(item_type.table), field=ident(field), type=sql.SQL(columns[field]), match=match
                    ),
                    {"f": field, "table": item_type.table, "spider": spider, "run": run_id, "unhashed": UNHASHED},
                )
                total += cur.rowcount
    return total
