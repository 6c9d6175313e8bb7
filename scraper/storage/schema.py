"""Create and migrate the tables that item types declare, idempotently and safely in parallel.

Every node runs this at start. An advisory lock serialises concurrent starts, and only missing
columns are added, so a running fleet is never blocked by a restarting node taking an
``ACCESS EXCLUSIVE`` lock it did not need.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from psycopg2 import sql

from ..items.base import StoredItem

logger = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x5C12A9E5  # any constant shared by every node of this project
BOOKKEEPING_COLUMNS = {
    "content_hash": "text NOT NULL",
    "first_seen": "timestamptz NOT NULL DEFAULT now()",
    "last_seen": "timestamptz NOT NULL DEFAULT now()",
    "updated_at": "timestamptz NOT NULL DEFAULT now()",
}
REJECTS_TABLE = "rejects"
REJECTS_DDL = """
CREATE TABLE IF NOT EXISTS rejects (
    id          text PRIMARY KEY,
    spider      text NOT NULL,
    item_type   text NOT NULL,
    url         text,
    reasons     text NOT NULL,
    item        jsonb NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    times_seen  integer NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS rejects_spider_idx ON rejects (spider, last_seen);
"""


def _existing_columns(cur: Any, table: str) -> set[str]:
    cur.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    )
    return {row[0] for row in cur.fetchall()}


def migrate(conn: Any, item_types: Iterable[type[StoredItem]]) -> list[str]:
    """Create missing tables and columns. Returns a description of each change made."""
    changes: list[str] = []
    with conn:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            if REJECTS_TABLE not in _tables(cur):
                changes.append(f"created table {REJECTS_TABLE}")
            cur.execute(REJECTS_DDL)
            for item_type in item_types:
                changes.extend(_migrate_one(cur, item_type))
    for change in changes:
        logger.info("Database migration: %s", change)
    return changes


def _tables(cur: Any) -> set[str]:
    cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {row[0] for row in cur.fetchall()}


def _migrate_one(cur: Any, item_type: type[StoredItem]) -> list[str]:
    table = item_type.table
    columns = {**item_type.columns(), **BOOKKEEPING_COLUMNS}
    key = item_type.key
    existing = _existing_columns(cur, table)
    if not existing:
        defs = [
            sql.SQL("{} {}").format(
                sql.Identifier(name), sql.SQL(ddl + (" NOT NULL" if name in key and "NOT NULL" not in ddl else ""))
            )
            for name, ddl in columns.items()
        ]
        defs.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(sql.Identifier(table), sql.SQL(", ").join(defs))
        )
        return [f"created table {table} (key: {', '.join(key)})"]
    changes = []
    for name, ddl in columns.items():
        if name in existing:
            continue
        # A column added to an existing table cannot be NOT NULL without a default.
        ddl = ddl.replace(" NOT NULL", "") if "DEFAULT" not in ddl else ddl
        cur.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                sql.Identifier(table), sql.Identifier(name), sql.SQL(ddl)
            )
        )
        changes.append(f"added column {table}.{name} {ddl}")
    return changes
