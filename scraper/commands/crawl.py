"""``scrapy crawl``, with configuration errors reported as one line instead of a traceback.

Everything else is Scrapy's own command. The backends are resolved here, before the crawler
starts, so that an unreachable ``REDIS_URL`` or a malformed ``POSTGRES_BATCH_SIZE`` is reported
by name, with passwords masked, and the process exits with status 2.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from typing import Any, ClassVar

from scrapy.commands.crawl import Command as ScrapyCrawl

from .. import addon, backends
from ..config import ConfigError
from ..scraping_api.middleware import get_settings as api_settings


class Command(ScrapyCrawl):
    # The one command (with scrapyd's jobs, which run it) that joins the shared crawl.
    default_settings: ClassVar[dict[str, Any]] = {**ScrapyCrawl.default_settings, "SHARED_STATE": True}

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1:
            return super().run(args, opts)
        assert self.crawler_process
        try:
            crawler = self._create_crawler(args[0])
            addon.validate(crawler.settings)
            api_settings(crawler.settings)
            backends.apply(crawler.settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        except KeyError:
            print(f"error: Spider not found: {args[0]} (scrapy list shows the spiders)", file=sys.stderr)
            self.exitcode = 2
            return
        self.crawler_process.crawl(crawler, **opts.spargs)
        self.crawler_process.start()
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
