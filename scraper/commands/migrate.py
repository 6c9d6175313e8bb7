"""``scrapy migrate``: create or update the database tables of every item type, and the tables
a crawl or a command otherwise makes on first use (page states, runs, quality reports, archive
index, field sources, the change feed's positions and dead letters), then exit.

The item types are those of every module of ``scraper/items`` (:func:`~scraper.items.stored_item_types`);
a module there that cannot be imported stops it before any change, naming the module: its types
would otherwise silently get no table.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

import psycopg2
from scrapy.commands import ScrapyCommand

from ..archive import index as archive_index
from ..config import ConfigError, get_float
from ..feed import dead_letters as feed_dead_letters
from ..feed import position as feed_positions
from ..items import item_module_errors, stored_item_types
from ..quality import store as quality_store
from ..repair import field_sources
from ..repair import store as repairs
from ..revisit import store as page_states
from ..runs import record as run_record
from ..storage import retention, schema
from ..storage.owner import prune_history
from . import backends_or_report, report_error


def _in_transaction(ensure: Callable[[Any], None]) -> Callable[[Any], None]:
    def run(conn: Any) -> None:
        with conn, conn.cursor() as cur:
            ensure(cur)

    return run


# The tables every crawl or command otherwise makes on first use, each by its own owner's DDL:
# a migration made ahead of a deployment (and a database role without CREATE for the nodes)
# leaves none of them to a node's start.
_BOOKKEEPING: dict[str, Callable[[Any], None]] = {
    "pages": _in_transaction(page_states.migrate),
    "crawl_runs": run_record.ensure_table,
    "run_quality": quality_store.ensure_tables,
    "archive_index": archive_index.ensure,
    "field_sources": _in_transaction(field_sources.ensure),
    "repairs": _in_transaction(repairs.ensure),
    "change_feed_positions": _in_transaction(feed_positions.ensure),
    "change_feed_dead_letters": _in_transaction(feed_dead_letters.ensure),
}


def ensure_bookkeeping(conn: Any) -> list[str]:
    """Create the page states', runs', quality reports', archive index's and field sources' tables
    if missing; the changes made, as :func:`schema.migrate` reports them."""
    changes = []
    for table, ensure in _BOOKKEEPING.items():
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
            existed = cur.fetchone()[0]
        ensure(conn)
        if not existed:
            changes.append(f"created table {table}")
    return changes


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def short_desc(self) -> str:
        return "Create or update the Postgres tables of every item type"

    def add_options(self, parser: Any) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--partition-history",
            action="store_true",
            help="convert an item_changes made before monthly partitions, in place (needed by HISTORY_RETENTION_DAYS)",
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        found = backends_or_report(self, need_redis=False)  # tables only: no Redis to start
        if found is None:
            return
        broken = item_module_errors()
        if broken:
            for failure in broken:
                report_error(self, f"{failure}: its item types would get no table; nothing migrated")
            return
        types = stored_item_types()
        conn = psycopg2.connect(found.database_url)
        try:
            changes = schema.migrate(conn, types)
            changes += ensure_bookkeeping(conn)
            if opts.partition_history:
                with conn, conn.cursor() as cur:
                    if retention.convert(cur):
                        changes.append(
                            "converted item_changes to monthly partitions (the old rows: item_changes_before)"
                        )
            keep = get_float(self.settings, "HISTORY_RETENTION_DAYS", 0.0, minimum=0)
            if keep > 0:
                changes += prune_history(found.database_url, keep).lines()
        except ConfigError as exc:
            report_error(self, str(exc))
            return
        finally:
            conn.close()
        tables = ", ".join(t.table for t in types)
        print("\n".join(changes) if changes else f"schema up to date ({tables}, rejects, {', '.join(_BOOKKEEPING)})")
