"""``scrapy feed run|status|verify``: the change feed's relay and its checks.

- ``scrapy feed run --sink KIND [--once] [--name NAME]``: publish ``item_changes`` to one sink
  (rabbitmq, nats, webhook) from its saved position; with ``--once``, until everything committed
  so far is published, else on and on (SIGTERM finishes the batch in hand). A progress line on
  stderr every ``--progress`` seconds, and a last one at the end.
- ``scrapy feed status``: each sink's position, what waits, dead letters, whether a relay runs.
- ``scrapy feed verify [--sink NAME] [--run SPIDER[:RUN_ID]]``: events delivered = rows of
  ``item_changes`` (of one run, or all), per sink; exit 1 with the reasons otherwise.
- ``scrapy feed compact [--min-files N] [--keep-days D]``: the lake's small files rewritten, its
  snapshots older than D days expired and the files only they used deleted.
- ``scrapy feed ddl --warehouse snowflake|bigquery [...]``: the statements that let a warehouse
  read the lake's tables (``--refresh``: point them at the latest commit).

Settings: ``CHANGEFEED_*`` (docs/reference/settings.md); see docs/guides/change-feed.md.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from argparse import ArgumentParser, Namespace

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..config import ConfigError
from ..feed import config as feed_config
from ..feed import sinks, verify
from ..feed.metrics import FeedMetrics
from ..feed.relay import Relay
from ..feed.sinks.base import SinkFatal
from ..runtime.secrets import redact
from . import backends_or_report, report_error

ACTIONS = ("run", "status", "verify", "compact", "ddl")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False

    def syntax(self) -> str:
        return "run|status|verify|compact|ddl [options]"

    def short_desc(self) -> str:
        return "Publish the change history to a broker or webhook, and check what left"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--sink", default=None, help="rabbitmq, nats, webhook or lake (run: required)")
        parser.add_argument("--name", default=None, help="the position's name (default: the sink's kind)")
        parser.add_argument("--once", action="store_true", help="run: stop once everything committed is published")
        parser.add_argument("--progress", type=float, default=10.0, help="run: seconds between progress lines")
        parser.add_argument("--run", default=None, help="verify: SPIDER or SPIDER:RUN_ID (default: all history)")
        parser.add_argument(
            "--min-files", type=int, default=8, help="compact: rewrite a partition holding this many files (8)"
        )
        parser.add_argument(
            "--keep-days", type=float, default=None, help="compact: days of snapshots kept (CHANGEFEED_LAKE_KEEP_DAYS)"
        )
        parser.add_argument("--warehouse", default=None, help="ddl: snowflake or bigquery")
        parser.add_argument("--volume", default="changefeed_lake", help="ddl: Snowflake's external volume")
        parser.add_argument("--integration", default="changefeed_lake", help="ddl: Snowflake's catalog integration")
        parser.add_argument("--dataset", default="changefeed", help="ddl: BigQuery's dataset")
        parser.add_argument(
            "--connection", default="PROJECT.REGION.CONNECTION", help="ddl: BigQuery's Cloud Storage connection"
        )
        parser.add_argument("--refresh", action="store_true", help="ddl: point the tables at the latest commit")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1 or args[0] not in ACTIONS:
            raise UsageError(f"give one of: {', '.join(ACTIONS)}")
        found = backends_or_report(self, need_redis=False)
        if found is None:
            return
        try:
            conf = feed_config.read(self.settings)
        except ConfigError as exc:
            report_error(self, str(exc))
            return
        getattr(self, f"_{args[0]}")(found.database_url, conf, opts)

    # --- run ----------------------------------------------------------------------------------
    def _run(self, dsn: str, conf: feed_config.FeedConfig, opts: Namespace) -> None:
        if not opts.sink:
            raise UsageError("feed run needs --sink (rabbitmq, nats, webhook or lake)")
        try:
            sink = sinks.make(opts.sink, conf, dsn)
        except ConfigError as exc:
            report_error(self, str(exc))
            return
        metrics = FeedMetrics(opts.name or opts.sink)
        if conf.metrics_port:
            bind = str(self.settings.get("METRICS_BIND") or "127.0.0.1")
            try:
                metrics.serve(bind, conf.metrics_port)
            except OSError as exc:
                report_error(
                    self, f"CHANGEFEED_METRICS_PORT: cannot listen on {bind}:{conf.metrics_port} ({exc.strerror})"
                )
                return
            _say(f"feed {opts.name or opts.sink}: metrics on http://{bind}:{conf.metrics_port}/metrics")
        relay = Relay(dsn, sink, conf, name=opts.name or None, say=_say, progress_every=opts.progress, metrics=metrics)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, relay.stop)
            await relay.run(follow=not opts.once)

        try:
            asyncio.run(main())
        except SinkFatal as exc:
            report_error(self, f"{relay.name}: {exc} (nothing was lost: the relay resumes from its position)", 1)
            return
        _say(relay.progress.line())

    # --- status -------------------------------------------------------------------------------
    def _status(self, dsn: str, conf: feed_config.FeedConfig, opts: Namespace) -> None:
        conn = psycopg2.connect(dsn)
        try:
            checks = verify.check(conn, [opts.sink] if opts.sink else None)
        finally:
            conn.close()
        if not checks:
            print("no sink has a position yet (scrapy feed run --sink KIND starts one)")
            return
        for c in checks:
            state = "relay running" if c.relay_running else "no relay running"
            print(
                f"{c.sink}: {c.delivered:,} delivered, {c.rows - c.behind:,} waiting, {c.dead:,} dead letters, "
                f"last event {c.last_id or '-'}, position saved {c.updated_at or 'never'}, {state}"
            )

    # --- verify -------------------------------------------------------------------------------
    def _verify(self, dsn: str, conf: feed_config.FeedConfig, opts: Namespace) -> None:
        spider = run_id = None
        if opts.run:
            spider, _, run = opts.run.partition(":")
            if run:
                if not run.isdigit():
                    raise UsageError(f"--run: SPIDER or SPIDER:RUN_ID with a number, got {opts.run!r}")
                run_id = int(run)
        conn = psycopg2.connect(dsn)
        try:
            checks = verify.check(conn, [opts.sink] if opts.sink else None, spider, run_id)
        finally:
            conn.close()
        scope = f"run {opts.run}" if opts.run else "all history"
        if not checks:
            report_error(self, "no sink has a position yet: nothing was published (scrapy feed run --sink KIND)", 1)
            return
        if conf.lake_folder and any(c.sink == "lake" for c in checks):
            self._check_lake(dsn, conf, checks)
        failed = False
        for c in checks:
            if c.problems:
                failed = True
                print(f"{c.sink}: {c.delivered:,} of {c.rows:,} events delivered ({scope}): {'; '.join(c.problems)}")
            else:
                print(f"{c.sink}: ok, {c.delivered:,} events delivered = {c.rows:,} rows of item_changes ({scope})")
        if failed:
            self.exitcode = 1

    def _check_lake(self, dsn: str, conf: feed_config.FeedConfig, checks: list[verify.SinkCheck]) -> None:
        """The lake's ``current`` table beside Postgres, row by row (content hashes)."""
        from ..feed.sinks.lake import compare_current

        check = next(c for c in checks if c.sink == "lake")
        found = compare_current(dsn, conf.lake_folder, conf.lake_namespace, conf.lake_endpoint, conf.lake_timeout)
        print(
            f"lake current: {found['lake']:,} rows, Postgres {found['postgres']:,}: {found['differ']:,} differ, "
            f"{found['missing']:,} missing from the lake, {found['extra']:,} only in the lake"
        )
        if found["differ"] or found["missing"] or found["extra"]:
            check.problems.append("the lake's current table differs from Postgres")

    # --- the lake's upkeep --------------------------------------------------------------------
    def _lake_tables(self, dsn: str, conf: feed_config.FeedConfig) -> dict | None:
        from pyiceberg.exceptions import NoSuchTableError

        from ..feed.sinks.lake import open_catalog

        if not conf.lake_folder:
            report_error(self, "CHANGEFEED_LAKE_FOLDER: not set, and the lake's tables live there")
            return None
        catalog = open_catalog(dsn, conf.lake_folder, conf.lake_endpoint or None, conf.lake_timeout)
        tables = {name: (catalog, f"{conf.lake_namespace}.{name}") for name in ("changes", "current")}
        try:
            for _catalog, ident in tables.values():
                catalog.load_table(ident)
            return tables
        except NoSuchTableError:
            report_error(self, f"no lake in namespace {conf.lake_namespace} yet (scrapy feed run --sink lake)", 1)
            return None

    def _compact(self, dsn: str, conf: feed_config.FeedConfig, opts: Namespace) -> None:
        from ..feed import lake_maintenance

        if opts.min_files < 2:
            raise UsageError(f"--min-files: at least 2, got {opts.min_files}")
        keep = conf.lake_keep if opts.keep_days is None else opts.keep_days
        if keep < 0:
            raise UsageError(f"--keep-days: 0 or more, got {opts.keep_days}")
        tables = self._lake_tables(dsn, conf)
        if tables is None:
            return
        for name, (catalog, ident) in tables.items():
            report = lake_maintenance.TableReport(name)

            def load(catalog=catalog, ident=ident):
                return catalog.load_table(ident)

            try:
                lake_maintenance.compact(load, name, opts.min_files, report)
                lake_maintenance.expire(load, keep, report)
            except Exception as exc:  # noqa: BLE001 - a bucket or a commit: said, nothing half-done counts
                report_error(self, f"lake {name}: {type(exc).__name__}: {redact(str(exc))[:300]}", 1)
                return
            print(report.line())

    def _ddl(self, dsn: str, conf: feed_config.FeedConfig, opts: Namespace) -> None:
        from ..feed import lake_ddl

        if opts.warehouse not in lake_ddl.WAREHOUSES:
            raise UsageError(f"--warehouse: one of {', '.join(lake_ddl.WAREHOUSES)}")
        for problem in lake_ddl.problems(conf.lake_folder, opts.warehouse):
            report_error(self, problem)
            return
        tables = self._lake_tables(dsn, conf)
        if tables is None:
            return
        loaded = {
            f"{conf.lake_namespace}_{name}": catalog.load_table(ident) for name, (catalog, ident) in tables.items()
        }
        if opts.warehouse == "snowflake":
            print(lake_ddl.snowflake(loaded, conf.lake_folder, opts.volume, opts.integration, opts.refresh))
        else:
            print(lake_ddl.bigquery(loaded, opts.dataset, opts.connection, opts.refresh))
