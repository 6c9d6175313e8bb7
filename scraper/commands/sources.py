"""``scrapy sources SPIDER [--run N]``: where each field's values came from in a run.

Per item type and field, each source (a selector chain, or ``url``, ``constant``, ``missing``...:
see :mod:`scraper.repair.provenance`) with the items that took the field from it and their share
of the items that set the field. Without ``--run``, the spider's latest run with counts.
"""

from __future__ import annotations

from argparse import ArgumentParser, Namespace

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..repair import field_sources
from . import backends_or_report, report_error


def render(spider: str, run_id: int, sources: list[field_sources.Source]) -> list[str]:
    """The lines ``scrapy sources`` prints for one run."""
    lines = [f"{spider}, run {run_id}" if run_id else f"{spider} (no run tracked)"]
    for (item_type, field), found in field_sources.shares(sources).items():
        total = sum(s.items for s, _ in found)
        lines.append(f"{item_type}.{field}  ({total} items)")
        for source, share in found:
            lines.append(f"  {source.items:>8}  {share:7.1%}  {source.selector}")
    return lines


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "SPIDER [--run N]"

    def short_desc(self) -> str:
        return "Print which selector produced each field of a run's items, with counts and shares"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--run", type=int, default=None, help="the run (default: the latest with counts)")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1:
            raise UsageError("give one spider name")
        spider = args[0]
        found = backends_or_report(self, need_redis=False)
        if found is None:
            return
        conn = psycopg2.connect(found.database_url)
        try:
            with conn, conn.cursor() as cur:
                field_sources.ensure(cur)
                run_id = opts.run if opts.run is not None else field_sources.latest_run(cur, spider)
                sources = [] if run_id is None else field_sources.load(cur, spider, run_id)
        finally:
            conn.close()
        if not sources:
            which = f"run {opts.run}" if opts.run is not None else "any run"
            report_error(self, f"no field sources recorded for {spider} in {which}", status=1)
            return
        print("\n".join(render(spider, run_id or 0, sources)))
