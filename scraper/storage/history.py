"""Change history: every insert, change, disappearance and return of a stored row.

One table for every item type (``item_changes``), not one per type: item types are declared in
code and come and go, the changed values differ in type from table to table (``jsonb`` holds
them all), and the questions asked of history cross types ("what changed in run 42?"). Rows
are found by ``(item_table, key)``; ``changes`` maps each changed column to ``[old, new]`` (for
an insert, ``[null, value]`` of every column with a value).

Unchanged rows never reach this module: the upsert skips them before anything is written, so a
re-crawl of unchanged pages costs no history and (nearly) no WAL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from . import retention

if TYPE_CHECKING:
    from ..items.base import StoredItem


TABLE = "item_changes"
# The writing transaction's id, for the change feed (scraper/feed): ``id`` is taken at insert,
# not at commit, so a reader of ``id > last`` would skip a row committed late; the relay reads by
# which transactions a snapshot sees instead. A column default: no statement of the writers
# changes, no round trip is added. A table made before it gets the column without rewriting
# its rows (they keep NULL: all committed before the column existed) and then the default.
XID_DDL = (
    "ALTER TABLE item_changes ADD COLUMN IF NOT EXISTS xid xid8",
    "ALTER TABLE item_changes ALTER COLUMN xid SET DEFAULT pg_current_xact_id()",
)
XID_INDEX = "CREATE INDEX IF NOT EXISTS item_changes_xid_idx ON item_changes (xid)"


@dataclass
class Change:
    key: list[Any]
    kind: str
    changes: dict[str, list[Any]]


@dataclass
class Context:
    """Who is writing: recorded with every entry."""

    spider: str | None = None
    run_id: int | None = None
    reason: str = "crawl"


def ensure(cur: Any) -> None:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
    if not cur.fetchone()[0]:
        cur.execute(retention.PARTITIONED_DDL)
    if retention.is_partitioned(cur):
        retention.ensure_ahead(cur)
    # A table from before the transaction id (or from before partitioning, which `scrapy migrate
    # --partition-history` converts). Checked first: ALTER TABLE takes an exclusive lock even
    # when there is nothing to do, and every node runs this at start.
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = 'item_changes' AND column_name = 'xid'), to_regclass('item_changes_xid_idx') IS NOT NULL"
    )
    has_column, has_index = cur.fetchone()
    if not has_column:
        for statement in XID_DDL:
            cur.execute(statement)
    if not has_index:
        cur.execute(XID_INDEX)


def diff(old: dict[str, Any], new: dict[str, Any], columns: Iterable[str]) -> dict[str, list[Any]]:
    """Columns whose values differ, as ``{column: [old, new]}`` (both as Postgres' jsonb gives them)."""
    return {c: [old.get(c), new.get(c)] for c in columns if old.get(c) != new.get(c)}


def record(cur: Any, table: str, changes: list[Change], context: Context) -> None:
    """Insert *changes* (not empty) of *table* inside the caller's transaction."""
    # One JSON document for the whole batch, unpacked by the server: formatting one VALUES
    # tuple per change in Python cost more than the rest of the batch's writing.
    cur.execute(
        "INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes) "
        "SELECT %s, r.key, r.kind, %s, %s, %s, r.changes "
        "FROM ROWS FROM (jsonb_to_recordset(%s::jsonb) AS (key jsonb, kind text, changes jsonb)) "
        "WITH ORDINALITY AS r(key, kind, changes, n) ORDER BY r.n",
        (
            table,
            context.reason,
            context.spider,
            context.run_id,
            json.dumps([{"key": c.key, "kind": c.kind, "changes": c.changes} for c in changes], default=str),
        ),
    )


def key_match(item_type: type[StoredItem], table_alias: str, key_json: str) -> sql.Composable:
    """``alias.k1 = (key_json->>0)::type AND ...``: a row of *item_type*'s table matched to a key
    kept as a JSON array (as ``item_changes`` and ``held_changes`` keep it)."""
    columns = item_type.columns()
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = ({}->>{})::{}").format(
            sql.Identifier(table_alias),
            sql.Identifier(k),
            sql.SQL(key_json),
            sql.Literal(i),
            sql.SQL(columns[k].split()[0]),
        )
        for i, k in enumerate(item_type.key)
    )
