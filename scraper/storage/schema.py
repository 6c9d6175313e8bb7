"""Create and migrate the tables that item types declare, idempotently and safely in parallel.

Every node runs this at start. An advisory lock serialises concurrent starts, and only missing
columns are added, so a running fleet is never blocked by a restarting node taking an
``ACCESS EXCLUSIVE`` lock it did not need.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from psycopg2 import sql

from ..items.base import StoredItem
from . import held, history

logger = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x5C12A9E5  # any constant shared by every node of this project
BOOKKEEPING_COLUMNS = {
    "content_hash": "text NOT NULL",
    "first_seen": "timestamptz NOT NULL DEFAULT now()",
    "last_seen": "timestamptz NOT NULL DEFAULT now()",
    "updated_at": "timestamptz NOT NULL DEFAULT now()",
    # Set when a finished run of the row's spider did not see it; cleared when seen again.
    "gone_at": "timestamptz",
    # The spider that last wrote the row: whose finished runs may mark it gone.
    "spider": "text",
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


def existing_columns(cur: Any, table: str) -> set[str]:
    return set(_numeric_columns(cur, table))


def _numeric_columns(cur: Any, table: str) -> dict[str, tuple[int | None, int | None]]:
    """Every column of *table* -> (precision, scale), both None unless it is a numeric."""
    cur.execute(
        "SELECT column_name, CASE WHEN data_type = 'numeric' THEN numeric_precision END,"
        " CASE WHEN data_type = 'numeric' THEN numeric_scale END FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    )
    return {row[0]: (row[1], row[2]) for row in cur.fetchall()}


_NUMERIC = re.compile(r"^numeric\((\d+),\s*(\d+)\)", re.IGNORECASE)


def _widen_numerics(cur: Any, table: str, columns: dict[str, str]) -> list[str]:
    """Widen numeric columns declared wider than they are (``numeric(14,2)`` -> ``(20,4)``).

    Only ever widening, so every stored value survives as it is. Postgres rewrites the table
    under an exclusive lock to change a scale, once; a table already as wide is not touched.
    """
    existing = _numeric_columns(cur, table)
    changes = []
    for name, ddl in columns.items():
        declared = _NUMERIC.match(ddl)
        precision, scale = existing.get(name, (None, None))
        if not declared or precision is None or scale is None:
            continue
        want_precision, want_scale = int(declared.group(1)), int(declared.group(2))
        widens = want_scale >= scale and want_precision - want_scale >= precision - scale
        if widens and (want_precision, want_scale) != (precision, scale):
            cur.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE numeric({}, {})").format(
                    sql.Identifier(table), sql.Identifier(name), sql.Literal(want_precision), sql.Literal(want_scale)
                )
            )
            changes.append(f"widened column {table}.{name} to numeric({want_precision},{want_scale})")
    return changes


def migrate(conn: Any, item_types: Iterable[type[StoredItem]]) -> list[str]:
    """Create missing tables and columns. Returns a description of each change made."""
    changes: list[str] = []
    with conn:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            if REJECTS_TABLE not in _tables(cur):
                changes.append(f"created table {REJECTS_TABLE}")
            cur.execute(REJECTS_DDL)
            history.ensure(cur)
            held.ensure(cur)
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
    existing = existing_columns(cur, table)
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
    return changes + _widen_numerics(cur, table, columns)
