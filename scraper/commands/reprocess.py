"""``scrapy reprocess SPIDER [--run ID | --since DATE] [--url GLOB] [--follow] [--workers N]``.

Replays the latest archived version of each matching page through the callback its request had
and the whole item pipeline, fetching nothing: rows change only where today's code extracts
differently, and each change enters the history with the reason ``reprocess``. Links the
callbacks find are not fetched; ``--follow`` queues those the archive does not hold yet in the
spider's shared queue, for the next ``scrapy crawl``.

The pages go straight from the archive to the engine's scraper (:mod:`scraper.archive.direct`),
in as many processes as the machine has CPUs once there are enough of them
(:mod:`scraper.archive.workers`); ``--engine`` replays through Scrapy's scheduler and downloader
instead, in one process, as the first replays did.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from argparse import ArgumentParser, Namespace
from datetime import UTC, datetime
from typing import Any

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..archive import index
from ..archive.config import read_config
from ..archive.replay import Record, Unreadable, records_by_id, select_records
from ..archive.store import store_for
from ..archive.workers import ReportedUnreadable, Reporter, Workers, json_stats, shares, worker_count
from ..backends.redis_client import get_redis
from ..config import ConfigError
from ..extensions.summary import ACTIVE_STAT, summarize
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
# A replay is short next to a crawl, and its last items wait for an age-based flush: at the
# crawl's 1 s, that wait was a fifth of a 2,000-page replay in two processes (measured: 0.2 s
# flushes the last items at once and costs no more CPU than 1 s; 0.05-0.1 s, more, smaller
# commits, did worse). A value given with -s stays.
REPLAY_FLUSH_INTERVAL = 0.2
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


def parse_share(value: str) -> tuple[int, int]:
    index, _, count = value.partition("/")
    return int(index), int(count)


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "SPIDER [--run ID | --since DATE] [--url GLOB] [--follow] [--workers N]"

    def short_desc(self) -> str:
        return "Replay archived pages through today's code, fetching nothing"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--run", type=int, default=None, help="only the pages of this run")
        parser.add_argument("--since", default=None, help="only pages fetched since this date")
        parser.add_argument("--url", default=None, help="only URLs matching this glob")
        parser.add_argument("--follow", action="store_true", help="queue new links found for the next crawl")
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="processes to replay in (default: one per CPU, with at least 1000 pages each)",
        )
        parser.add_argument(
            "--engine",
            action="store_true",
            help="replay through Scrapy's scheduler and downloader, in one process (slower; as replays first were)",
        )
        parser.add_argument(
            "-a",
            dest="spargs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="spider argument (may be repeated)",
        )
        # A worker of a replay split over processes: its share, its records, the replay's claims.
        parser.add_argument("--share", default=None, help=argparse.SUPPRESS)
        parser.add_argument("--records", default=None, help=argparse.SUPPRESS)
        parser.add_argument("--items-key", default=None, help=argparse.SUPPRESS)

    def run(self, args: list[str], opts: Namespace) -> None:
        assert self.crawler_process
        if len(args) != 1:
            raise UsageError("give one spider name")
        if opts.workers is not None and opts.workers < 1:
            raise UsageError("--workers: give 1 or more")
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
        store = store_for(config.url, str(self.settings.get("DATA_DIR") or ".data"), config.endpoint)
        if opts.share:
            self._replay(name, self._share_records(found.database_url, opts.records), store, found, opts)
            return
        since = parse_since(opts.since) if opts.since else None
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
        workers = 1 if opts.engine and opts.workers is None else worker_count(opts.workers, len(records))
        if workers > 1:
            self._replay_in_workers(name, records, workers, found, opts)
        else:
            self._replay(name, records, store, found, opts)

    def _share_records(self, database_url: str, path: str) -> list[Record]:
        with open(path) as f:
            ids = [int(line) for line in f if line.strip()]
        conn = psycopg2.connect(database_url)
        try:
            return records_by_id(conn, ids)
        finally:
            conn.close()

    def _replay(self, name: str, records: list[Record], store: Any, found: Any, opts: Namespace) -> None:
        """The replay in this process: all of *records*, or a worker's share of them."""
        assert self.crawler_process
        reporter = Reporter() if opts.share else None
        crawler = self.crawler_process.create_crawler(name)
        for key, value in REPLAY_SETTINGS.items():
            crawler.settings.set(key, value, priority="cmdline")
        for setting, overrides in (
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_OVERRIDES),
            ("SPIDER_MIDDLEWARES", SPIDER_OVERRIDES),
            ("EXTENSIONS", EXTENSION_OVERRIDES),
        ):
            crawler.settings.set(setting, {**crawler.settings.getdict(setting), **overrides}, priority="cmdline")
        if not any(arg.startswith("POSTGRES_FLUSH_INTERVAL=") for arg in opts.set):
            interval = min(crawler.settings.getfloat("POSTGRES_FLUSH_INTERVAL", 1.0), REPLAY_FLUSH_INTERVAL)
            crawler.settings.set("POSTGRES_FLUSH_INTERVAL", interval, priority="cmdline")
        items_key = opts.items_key or keys.items_reprocess_key(name, uuid.uuid4().hex[:8])
        crawler.settings.set("ARCHIVE_REPLAY_ITEMS_KEY", items_key, priority="cmdline")
        crawler.settings.set("ARCHIVE_REPLAY_FOLLOW", opts.follow, priority="cmdline")
        crawler.replay_records = records
        crawler.replay_store = store
        crawler.replay_direct = not opts.engine
        if reporter is not None:
            crawler.replay_report = reporter
            crawler.replay_unreadable = ReportedUnreadable(reporter)
        spargs = dict(arg.split("=", 1) for arg in opts.spargs if "=" in arg)
        if reporter is None:
            print(
                f"reprocess: {len(records)} archived pages of {name!r}, replayed with no network",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        self.crawler_process.crawl(crawler, **spargs)
        self.crawler_process.start()
        elapsed = time.monotonic() - started
        if not opts.items_key:  # a worker's claims are the whole replay's: the command drops them
            get_redis(found.redis_url).delete(items_key)
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            if reporter is not None:
                reporter.send(result={"failed": True})
            return
        stats = crawler.stats.get_stats()
        follow = self._queue_new(crawler, name, found) if opts.follow else None
        if reporter is not None:
            reporter.send(result={"stats": json_stats(stats), "follow": follow})
            self.exitcode = 1 if stats.get("reprocess/unreadable") else 0
            return
        self._conclude(name, stats, elapsed, follow)

    def _replay_in_workers(self, name: str, records: list[Record], count: int, found: Any, opts: Namespace) -> None:
        items_key = keys.items_reprocess_key(name, uuid.uuid4().hex[:8])
        print(
            f"reprocess: {len(records)} archived pages of {name!r}, replayed with no network in {count} processes",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="reprocess-") as folder:
            commands = []
            for i, ids in enumerate(shares([r.id for r in records], count)):
                path = os.path.join(folder, f"share-{i}")
                with open(path, "w") as f:
                    f.write("\n".join(map(str, ids)))
                commands.append(self._worker_command(name, opts, f"{i}/{count}", path, items_key))
            env = {**os.environ, "REDIS_URL": found.redis_url, "DATABASE_URL": found.database_url}
            unreadable = Unreadable()
            outcome = Workers(commands, len(records), unreadable, env).run()
        get_redis(found.redis_url).delete(items_key)
        elapsed = time.monotonic() - started
        stats = outcome.stats
        if outcome.opened is not None and outcome.closed is not None:
            # The whole replay's window, from the first worker's start to the last one's end.
            stats[ACTIVE_STAT] = round(outcome.closed - outcome.opened, 3)
        for index_, status in outcome.failed:
            print(
                f"reprocess: worker {index_ + 1} of {count} failed (exit status {status}); its log is above",
                file=sys.stderr,
            )
        follows = [r["follow"] for r in outcome.results if r.get("follow") is not None]
        follow = None
        if opts.follow:
            follow = {
                "found": sorted({u for f in follows for u in f["found"]}),
                "archived": sorted({u for f in follows for u in f["archived"]}),
                "queued": sum(f["queued"] for f in follows),
            }
        self._conclude(name, stats, elapsed, follow)
        if outcome.failed or any(r.get("failed") for r in outcome.results):
            self.exitcode = 1

    def _worker_command(self, name: str, opts: Namespace, share: str, path: str, items_key: str) -> list[str]:
        command = [sys.executable, "-m", "scrapy", "reprocess", name, "--share", share, "--records", path]
        command += ["--items-key", items_key]
        if opts.follow:
            command.append("--follow")
        if opts.engine:
            command.append("--engine")
        for arg in opts.spargs:
            command += ["-a", arg]
        for arg in opts.set:
            command += ["-s", arg]
        for flag, value in (("--loglevel", opts.loglevel), ("--logfile", opts.logfile)):
            if value:
                command += [flag, value]
        if opts.nolog:
            command.append("--nolog")
        return command

    def _conclude(self, name: str, stats: dict[str, Any], elapsed: float, follow: dict[str, Any] | None) -> None:
        print(f"reprocess: {summarize(stats, elapsed)}", file=sys.stderr)
        unreadable = stats.get("reprocess/unreadable", 0)
        if unreadable:
            print(
                f"reprocess: {unreadable} archived page(s) could not be read and were not replayed "
                "(the warnings above name their files)",
                file=sys.stderr,
            )
            self.exitcode = 1
        if follow is not None:
            new = len(set(follow["found"]) - set(follow["archived"]))
            print(
                f"reprocess: {follow['queued']} new link(s) queued for {name!r} "
                f"({len(follow['found']) - new} already archived, {new - follow['queued']} already seen by the crawl)",
                file=sys.stderr,
            )

    def _queue_new(self, crawler: Any, name: str, found: Any) -> dict[str, Any]:
        """Queue the links found that no page of the archive answers; what was found, what was
        archived already, and how many were queued."""
        requests = getattr(crawler, "replay_found", {})
        conn = psycopg2.connect(found.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT DISTINCT url FROM archive_index WHERE spider = %s AND url = ANY(%s)", (name, list(requests))
                )
                archived = {row[0] for row in cur.fetchall()}
        finally:
            conn.close()
        new = [r for url, r in requests.items() if url not in archived]
        server = get_redis(found.redis_url)
        queue = frontier(server, crawler.spider, self.settings)
        # Claimed in the crawl's seen-state as the crawl claims links: one already queued or
        # fetched in the current run (or by another worker of this replay) is not queued twice.
        seen = SharedDupeFilter(
            server,
            keys.dupefilter_key(name),
            crawler.request_fingerprinter,
            stores=make_stores(server, name, self.settings, queue.shards),
            shards=queue.shards,
        )
        for request in new:
            queue.stage(request, seen, seen.request_fingerprint(request))
        queued, _already = queue.flush_staged()
        return {"found": sorted(requests), "archived": sorted(archived), "queued": queued}
