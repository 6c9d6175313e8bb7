"""``scrapy history SPIDER KEY…``: one entity's timeline (inserted, each change, gone, back).

KEY is the natural key of the spider's item type without the leading ``source`` when the key
has one (``scrapy history demo SKU-0001``), or the whole key (``--table`` picks the item type).
"""

from __future__ import annotations

import json
from argparse import ArgumentParser, Namespace

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..items import stored_item_types
from ..storage import retention
from . import backends_or_report


def format_change(kind: str, changes: dict) -> str:
    if kind == "insert":
        return "first seen: " + ", ".join(f"{k}={v[1]}" for k, v in changes.items())
    parts = ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changes.items())
    return {"gone": "gone", "back": "back" + (f" ({parts})" if parts else "")}.get(kind, parts)


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "SPIDER KEY..."

    def short_desc(self) -> str:
        return "Print one stored entity's history: each insert, change, disappearance"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--table", default=None, help="the item type's table (default: the first declared)")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) < 2:
            raise UsageError("give a spider name and the entity's key")
        spider, values = args[0], args[1:]
        types = {t.table: t for t in stored_item_types()}
        table = opts.table or next(iter(types))
        if table not in types:
            raise UsageError(f"no item type stores into {table!r} (known: {', '.join(types)})")
        key = types[table].key
        if len(values) == len(key) - 1 and key[0] == "source":
            values = [spider, *values]
        if len(values) != len(key):
            raise UsageError(f"{table}'s key is ({', '.join(key)}): give {len(key)} value(s)")
        found = backends_or_report(self)
        if found is None:
            return
        conn = psycopg2.connect(found.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT at, kind, reason, run_id, changes FROM item_changes WHERE item_table = %s AND key = %s::jsonb"
                    " ORDER BY at, id",
                    (table, json.dumps(values)),
                )
                rows = cur.fetchall()
                since = retention.kept_since(cur)
        finally:
            conn.close()
        if since is not None:
            print(f"(history kept since {since:%Y-%m-%d} UTC: HISTORY_RETENTION_DAYS dropped the months before)")
        if not rows:
            print(f"no history for {table} {tuple(values)}")
            return
        for at, kind, reason, run_id, changes in rows:
            run = f" run {run_id}" if run_id is not None else ""
            print(f"{at:%Y-%m-%d %H:%M:%S%z}  {kind:<6} {reason}{run}  {format_change(kind, changes)}")
