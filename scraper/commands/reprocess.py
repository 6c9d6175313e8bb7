"""``scrapy reprocess SPIDER [--run ID | --since DATE] [--url GLOB] [--follow]``.

Replays the latest archived version of each matching page through the callback its request had
and the whole item pipeline, fetching nothing: rows change only where today's code extracts
differently, and each change enters the history with the reason ``reprocess``. Links the
callbacks find are not fetched; ``--follow`` queues those the archive does not hold yet in the
spider's shared queue, for the next ``scrapy crawl``.
"""

from __future__ import annotations

import sys
import time
import uuid
from argparse import ArgumentParser, Namespace
from datetime import UTC, datetime

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..archive import index
from ..archive.config import read_config
from ..archive.replay import select_records
from ..archive.store import store_for
from ..backends.redis_client import get_redis
from ..config import ConfigError
from ..extensions.summary import summarize
from ..queue import keys
from ..queue.dupefilter import SharedDupeFilter, make_stores
from ..queue.queues import frontier
from ..runtime.secrets import redact
from . import backends_or_report

REPLAY_SETTINGS = {
    "ARCHIVE_REPLAY": True,
    # The item pipelines store (the point of a replay), so the process counts as one that
    # writes shared state; the scheduler and dupefilter below stay in memory all the same.
    "SHARED_STATE": True,
    # An in-memory scheduler: a replay takes nothing from, and adds nothing to, the shared queue.
    "SCHEDULER": "scrapy.core.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "REDIRECT_ENABLED": False,
    "METRICS_ENABLED": False,
    "CONCURRENT_REQUESTS": 64,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": False,
    "SCRAPING_API_KEY": "",
}
DOWNLOADER_OVERRIDES = {
    "scraper.archive.replay.ReplayDownloaderMiddleware": 0,
    "scraper.archive.middleware.ArchiveMiddleware": None,
    "scraper.scraping_api.middleware.ScrapingApiMiddleware": None,
    "scraper.politeness.middleware.PolitenessMiddleware": None,
    "scraper.middlewares.dead_letters.DeadLetterDownloaderMiddleware": None,
}
SPIDER_OVERRIDES = {
    "scraper.archive.replay.ReplaySpiderMiddleware": 1,
    # A callback that fails on an old page is logged, not a dead letter of the live crawl.
    "scraper.middlewares.dead_letters.DeadLetterSpiderMiddleware": None,
}
EXTENSION_OVERRIDES = {
    "scraper.archive.replay.ReplayProgress": 500,
    "scraper.extensions.idle_close.IdleClose": None,
    "scraper.extensions.progress.ProgressLog": None,
    "scraper.monitoring.exporter.MetricsExporter": None,
}


def parse_since(value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"--since: {value!r} is not a date (YYYY-MM-DD or an ISO 8601 time)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "SPIDER [--run ID | --since DATE] [--url GLOB] [--follow]"

    def short_desc(self) -> str:
        return "Replay archived pages through today's code, fetching nothing"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--run", type=int, default=None, help="only the pages of this run")
        parser.add_argument("--since", default=None, help="only pages fetched since this date")
        parser.add_argument("--url", default=None, help="only URLs matching this glob")
        parser.add_argument("--follow", action="store_true", help="queue new links found for the next crawl")
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
        found = backends_or_report(self)
        if found is None:
            return
        try:
            config = read_config(self.settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        since = parse_since(opts.since) if opts.since else None
        store = store_for(config.url, str(self.settings.get("DATA_DIR") or ".data"), config.endpoint)
        try:
            held = set(store.names())
        except Exception as exc:
            print(
                f"error: cannot list the archive at ARCHIVE_URL={redact(config.url)}: {type(exc).__name__}: "
                f"{redact(str(exc))}",
                file=sys.stderr,
            )
            self.exitcode = 1
            return
        conn = psycopg2.connect(found.database_url)
        try:
            index.ensure(conn)
            records = select_records(conn, name, opts.run, since, opts.url)
            # The index is shared by every archive location this database was given (another
            # ARCHIVE_URL, another machine's folder): replay what this archive holds, and say once
            # what it does not, rather than fail on each of those pages.
            away = [r for r in records if r.file not in held or r.payload_file not in held]
            missing = {f for r in away for f in (r.file, r.payload_file) if f not in held}
            if away:
                records = select_records(conn, name, opts.run, since, opts.url, files=held)
        finally:
            conn.close()
        if missing:
            older = len({r.fingerprint for r in away} & {r.fingerprint for r in records})
            print(
                f"reprocess: {len(away)} page(s) of {name!r} have their latest archived version in "
                f"{len(missing)} file(s) the archive at ARCHIVE_URL={redact(config.url)} does not hold (e.g. "
                f"{min(missing)}): archived under another ARCHIVE_URL or on another machine, or removed. "
                f"{len(away) - older} of them are skipped, {older} replayed from an older version this "
                f"archive holds; run with ARCHIVE_URL set to the archive that holds them to replay their latest.",
                file=sys.stderr,
                flush=True,
            )
        if not records:
            print(
                f"reprocess: no archived pages of {name!r} match{' in this archive' if missing else ''}",
                file=sys.stderr,
            )
            self.exitcode = 1 if missing else 0
            return
        crawler = self.crawler_process.create_crawler(name)
        for key, value in REPLAY_SETTINGS.items():
            crawler.settings.set(key, value, priority="cmdline")
        for setting, overrides in (
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_OVERRIDES),
            ("SPIDER_MIDDLEWARES", SPIDER_OVERRIDES),
            ("EXTENSIONS", EXTENSION_OVERRIDES),
        ):
            crawler.settings.set(setting, {**crawler.settings.getdict(setting), **overrides}, priority="cmdline")
        items_key = keys.items_reprocess_key(name, uuid.uuid4().hex[:8])
        crawler.settings.set("ARCHIVE_REPLAY_ITEMS_KEY", items_key, priority="cmdline")
        crawler.settings.set("ARCHIVE_REPLAY_FOLLOW", opts.follow, priority="cmdline")
        crawler.replay_records = records
        crawler.replay_store = store
        spargs = dict(arg.split("=", 1) for arg in opts.spargs if "=" in arg)
        print(
            f"reprocess: {len(records)} archived pages of {name!r}, replayed with no network",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        self.crawler_process.crawl(crawler, **spargs)
        self.crawler_process.start()
        elapsed = time.monotonic() - started
        server = get_redis(found.redis_url)
        server.delete(items_key)
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            return
        stats = crawler.stats.get_stats()
        print(f"reprocess: {summarize(stats, elapsed)}", file=sys.stderr)
        unreadable = stats.get("reprocess/unreadable", 0)
        if unreadable:
            print(
                f"reprocess: {unreadable} archived page(s) could not be read and were not replayed "
                "(the warnings above name their files)",
                file=sys.stderr,
            )
            self.exitcode = 1
        if opts.follow:
            self._queue_new(crawler, name, found)

    def _queue_new(self, crawler: object, name: str, found: object) -> None:
        requests = getattr(crawler, "replay_found", {})
        conn = psycopg2.connect(found.database_url)  # type: ignore[attr-defined]
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT DISTINCT url FROM archive_index WHERE spider = %s AND url = ANY(%s)", (name, list(requests))
                )
                archived = {row[0] for row in cur.fetchall()}
        finally:
            conn.close()
        new = [r for url, r in requests.items() if url not in archived]
        server = get_redis(found.redis_url)  # type: ignore[attr-defined]
        queue = frontier(server, crawler.spider, self.settings)  # type: ignore[attr-defined]
        # Claimed in the crawl's seen-state as the crawl claims links: one already queued or
        # fetched in the current run is not queued twice.
        seen = SharedDupeFilter(
            server,
            keys.dupefilter_key(name),
            crawler.request_fingerprinter,  # type: ignore[attr-defined]
            stores=make_stores(server, name, self.settings, queue.shards),
            shards=queue.shards,
        )
        for request in new:
            queue.stage(request, seen, seen.request_fingerprint(request))
        queued, already = queue.flush_staged()
        print(
            f"reprocess: {queued} new link(s) queued for {name!r} ({len(requests) - len(new)} already archived, "
            f"{already} already seen by the crawl)",
            file=sys.stderr,
        )
