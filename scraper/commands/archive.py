"""``scrapy archive prune``: apply ``ARCHIVE_RETENTION_DAYS`` to the index and the files.

``--now`` moves the clock (to see what a prune on that date would keep, and to test it).
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from datetime import UTC, datetime

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..archive import index
from ..archive.config import read_config
from ..archive.prune import prune
from ..archive.store import store_for
from ..config import ConfigError
from . import backends_or_report
from .reprocess import parse_since


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "prune [--now DATE]"

    def short_desc(self) -> str:
        return "Prune the raw archive to ARCHIVE_RETENTION_DAYS"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--now", default=None, help="prune as if it were this date")

    def run(self, args: list[str], opts: Namespace) -> None:
        if args != ["prune"]:
            raise UsageError("the one subcommand is: prune")
        found = backends_or_report(self)
        if found is None:
            return
        try:
            config = read_config(self.settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        now = parse_since(opts.now) if opts.now else datetime.now(UTC)
        store = store_for(config.url, str(self.settings.get("DATA_DIR") or ".data"), config.endpoint)
        conn = psycopg2.connect(found.database_url)
        try:
            index.ensure(conn)
            rows, files = prune(conn, store, config.retention_days, now)
        finally:
            conn.close()
        print(f"archive: pruned {rows} index row(s) and {files} file(s) older than {config.retention_days:g} days")
