"""``scrapy process SPIDER``: run the callbacks and the item pipeline over fetched responses.

The other half of ``PROCESSING=decoupled`` (see docs/operations/decoupled.md): ``scrapy crawl`` nodes fetch and put
each response in the spider's stream; any number of ``scrapy process`` workers, on any machines,
take them from it as one consumer group (see :mod:`scraper.processing.scheduler`), store the
items, and send the links found to the shared queue. A processor fetches nothing. It waits while
the stream is empty and a fetcher is alive, and closes once neither has been the case for
``SCHEDULER_IDLE_TIMEOUT`` seconds.
"""

from __future__ import annotations

import sys
import time
from argparse import ArgumentParser, Namespace

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .. import addon, backends
from ..config import ConfigError
from ..extensions.summary import summarize
from ..processing.config import PROCESSOR_SETTING

PROCESSOR_SETTINGS = {
    "PROCESSING": "decoupled",
    PROCESSOR_SETTING: True,
    "SHARED_STATE": True,
    "SCHEDULER": "scraper.processing.scheduler.StreamScheduler",
    # The fetcher obeyed robots.txt, retried, followed redirects and decoded the body.
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "REDIRECT_ENABLED": False,
    "COMPRESSION_ENABLED": False,
    "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": False,
    "SCRAPING_API_KEY": "",
    "METRICS_ANNOUNCE": False,
}
DOWNLOADER_OVERRIDES = {
    "scraper.processing.answer.StreamAnswerMiddleware": 11,
    "scraper.archive.middleware.ArchiveMiddleware": None,
    "scraper.scraping_api.middleware.ScrapingApiMiddleware": None,
    "scraper.politeness.middleware.PolitenessMiddleware": None,
    "scraper.middlewares.dead_letters.DeadLetterDownloaderMiddleware": None,
}
SPIDER_OVERRIDES = {"scraper.processing.nostart.NoStartRequests": 1}
EXTENSION_OVERRIDES = {
    # A processor is no node of the run; its quality monitor counts the items it stores into
    # the run's figures (see QualityMonitor.report_processed), the fetchers check the run.
    "scraper.extensions.progress.ProgressLog": None,
    "scrapy.extensions.logstats.LogStats": 500,
}


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "SPIDER"

    def short_desc(self) -> str:
        return "Process the responses fetchers put in the stream (PROCESSING=decoupled)"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "-a",
            dest="spargs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="spider argument (may be repeated)",
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        assert self.crawler_process
        if len(args) != 1:
            raise UsageError("give one spider name")
        name = args[0]
        try:
            crawler = self.crawler_process.create_crawler(name)
        except KeyError:
            print(f"error: Spider not found: {name} (scrapy list shows the spiders)", file=sys.stderr)
            self.exitcode = 2
            return
        for key, value in PROCESSOR_SETTINGS.items():
            crawler.settings.set(key, value, priority="cmdline")
        for setting, overrides in (
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_OVERRIDES),
            ("SPIDER_MIDDLEWARES", SPIDER_OVERRIDES),
            ("EXTENSIONS", EXTENSION_OVERRIDES),
        ):
            crawler.settings.set(setting, {**crawler.settings.getdict(setting), **overrides}, priority="cmdline")
        try:
            addon.validate(crawler.settings)
            backends.apply(crawler.settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        spargs = dict(arg.split("=", 1) for arg in opts.spargs if "=" in arg)
        started = time.monotonic()
        self.crawler_process.crawl(crawler, **spargs)
        self.crawler_process.start()
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            return
        print(f"process: {summarize(crawler.stats.get_stats(), time.monotonic() - started)}", file=sys.stderr)
