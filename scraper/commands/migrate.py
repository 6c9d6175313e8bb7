"""``scrapy migrate``: create or update the database tables of every item type, then exit."""

from __future__ import annotations

from argparse import Namespace

import psycopg2
from scrapy.commands import ScrapyCommand

from ..items import stored_item_types
from ..storage import schema
from . import backends_or_report


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def short_desc(self) -> str:
        return "Create or update the Postgres tables of every item type"

    def run(self, args: list[str], opts: Namespace) -> None:
        found = backends_or_report(self, need_redis=False)  # tables only: no Redis to start
        if found is None:
            return
        conn = psycopg2.connect(found.database_url)
        try:
            changes = schema.migrate(conn, stored_item_types())
        finally:
            conn.close()
        tables = ", ".join(t.table for t in stored_item_types())
        print("\n".join(changes) if changes else f"schema up to date ({tables}, rejects)")
