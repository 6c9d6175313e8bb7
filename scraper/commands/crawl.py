"""``scrapy crawl``, with configuration errors reported as one line instead of a traceback.

Everything else is Scrapy's own command. The backends are resolved here, before the crawler
starts, so that an unreachable ``REDIS_URL`` or a malformed ``POSTGRES_BATCH_SIZE`` is reported
by name, with passwords masked, and the process exits with status 2.

``--fresh`` discards the spider's stopped run (its queue, leases and seen-set) and starts the
next; without it a stopped run is resumed. A crawl process (and so a scrapyd job) is the one
kind of process that announces its metrics endpoint to Prometheus (``METRICS_ANNOUNCE``).
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from typing import Any, ClassVar

from scrapy.commands.crawl import Command as ScrapyCrawl

from .. import addon, backends
from ..config import ConfigError, get_bool
from ..rendering.spec import check_spider as check_rendering
from ..scraping_api.middleware import get_settings as api_settings


class Command(ScrapyCrawl):
    # The one command (with scrapyd's jobs, which run it) that joins the shared crawl.
    default_settings: ClassVar[dict[str, Any]] = {**ScrapyCrawl.default_settings, "SHARED_STATE": True}

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="discard the spider's stopped run (its queued requests) and start a new one",
        )
        parser.add_argument(
            "--due",
            action="store_true",
            help="a revisit run: only the known pages that are due (their history, the sitemap's lastmod) and new links",
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1:
            return super().run(args, opts)
        assert self.crawler_process
        try:
            crawler = self._create_crawler(args[0])
            addon.validate(crawler.settings)
            api_settings(crawler.settings)
            # A spider may say what it needs of the settings (api_extract: a scraping-API key).
            check = getattr(crawler.spidercls, "check_settings", None)
            if check is not None:
                check(crawler.settings)
            check_rendering(crawler.spidercls, crawler.settings)  # its `render` spec, and a browser for it
            found = backends.apply(crawler.settings)
            crawler.settings.set("METRICS_ANNOUNCE", True, priority="cmdline")
            if getattr(opts, "due", False):
                crawler.settings.set("REVISIT_DUE", True, priority="cmdline")
            if get_bool(crawler.settings, "REVISIT_DUE") and not get_bool(crawler.settings, "REVISIT_ENABLED"):
                raise ConfigError(
                    "REVISIT_DUE (scrapy crawl --due) needs REVISIT_ENABLED=true: a revisit run decides "
                    "what to fetch from the page states"
                )
            if getattr(opts, "fresh", False):
                crawler.settings.set("RUNS_FRESH", True, priority="cmdline")
                _refuse_fresh_while_running(found.redis_url, args[0], crawler.settings)
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
        elif crawler.stats.get_value("run/exit_status"):  # the run's shared state was lost (4)
            self.exitcode = int(crawler.stats.get_value("run/exit_status"))
        elif crawler.stats.get_value("quality/exit_status"):  # QUALITY_FAIL_EXIT and a degraded run
            self.exitcode = int(crawler.stats.get_value("quality/exit_status"))
        elif stopped_by_fault(crawler.stats.get_value("finish_reason")):
            self.exitcode = STOPPED_EXIT_STATUS


#: The crawl stopped before its end for a cause the operator must see (the scraping API refused
#: the key, credits or budget ran out, Postgres or the archive failed, the quality guard stopped
#: it): the run is not finished, and a scheduler or a script must not read it as done.
STOPPED_EXIT_STATUS = 5


def stopped_by_fault(reason: object) -> bool:
    """Any close but a finished crawl, an operator's stop (Ctrl-C, SIGTERM) or a CLOSESPIDER_ limit."""
    if not reason:
        return False
    reason = str(reason)
    return reason not in ("finished", "shutdown", "lost") and not reason.startswith("closespider_")


def _refuse_fresh_while_running(redis_url: str, spider: str, settings: object) -> None:
    from ..backends.redis_client import get_redis
    from ..config import get_float
    from ..queue import keys
    from ..runs.nodes import NodeRegistry

    server = get_redis(redis_url)
    keys.migrate_legacy(server, spider)
    live = NodeRegistry(
        server, keys.nodes_key(spider), ttl=get_float(settings, "RUNS_NODE_TTL", 60.0, minimum=1)
    ).live()
    if live:
        run_id = (server.hget(keys.run_key(spider), "id") or b"?").decode()
        raise ConfigError(
            f"--fresh: run {run_id} of {spider} has {len(live)} live node(s); stop them first, "
            "or start without --fresh to join it"
        )
