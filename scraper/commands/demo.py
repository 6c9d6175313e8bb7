"""``scrapy demo``: serve the bundled demo shop and crawl it through the whole pipeline.

This is what ``make demo`` runs. With no ``REDIS_URL``/``DATABASE_URL`` it uses the embedded
servers under ``.data/``; run it twice and the second run finds every row unchanged.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from argparse import ArgumentParser, Namespace
from typing import Any, ClassVar

import psycopg2
from scrapy.commands import ScrapyCommand

from .. import addon, backends
from ..config import ConfigError, mask_url
from ..extensions.summary import summarize


def quality_report(database_url: str, run_id: int | None) -> None:
    """End with the run's data-quality report, the point of ``--break-layout``."""
    from ..quality import report, store

    if not run_id:
        return
    conn = store.connect(database_url)
    try:
        found = store.report(conn, "demo", run_id)
    finally:
        conn.close()
    if found is not None:
        row, checks = found
        text = report.render("demo", run_id, row["outcome"], row["baseline"], checks)
        # A good run's report is one line; a degraded one's names every failed check.
        print("\ndemo: " + (text if row["outcome"] == "degraded" else text.splitlines()[0]))


class Command(ScrapyCommand):
    requires_project = True
    default_settings: ClassVar[dict[str, Any]] = {"SHARED_STATE": True}  # a real crawl, end to end

    def short_desc(self) -> str:
        return "Serve the demo shop locally and crawl it into Postgres"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--products", type=int, default=500, help="products in the demo shop (500)")
        parser.add_argument(
            "--port",
            type=int,
            default=8765,
            help="port of the demo shop (8765); product URLs include it, so keep it fixed between runs",
        )
        parser.add_argument("--reprice", type=int, default=0, help="change the price of N products")
        parser.add_argument(
            "--break-layout",
            type=float,
            nargs="?",
            const=0.5,
            default=0.0,
            metavar="SHARE",
            help="serve a share of product pages (0.5) in a layout the spider does not know: the data-quality drill",
        )
        parser.add_argument(
            "--api",
            action="store_true",
            help="fetch every page through the local scraping-API stand-in (AlterLab's wire contract)",
        )

        parser.add_argument(
            "--render",
            action="store_true",
            help="crawl the shop's JavaScript-only section (/js/) in a real browser: the demo_js spider",
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        # Development tools, not in the egg scrapyd runs: loaded only when the demo runs (Scrapy
        # imports every command module for every command, scrapyd's jobs included).
        from ..demo_site import Catalog, DemoSite
        from ..scraping_api.standin import StandIn

        assert self.crawler_process
        catalog = Catalog(products=opts.products, reprice=opts.reprice)
        try:
            site = DemoSite(catalog, port=opts.port, break_layout=opts.break_layout).start()
        except OSError as exc:
            site = DemoSite(catalog, port=0, break_layout=opts.break_layout).start()
            print(
                f"demo: port {opts.port} is busy ({exc.strerror}); serving on {site.port} instead. "
                "Product URLs include the port, so rows from earlier runs will count as updated.",
                file=sys.stderr,
            )
        api = None
        try:
            spider = "demo_js" if opts.render else "demo"
            crawler = self.crawler_process.create_crawler(spider)
            crawler.settings.set("DEMO_SITE_URL", site.url, priority="cmdline")
            if not crawler.settings.get("FETCH_ALLOW_NETWORKS"):
                # The demo shop (and the API stand-in) listen on this machine's loopback.
                crawler.settings.set("FETCH_ALLOW_NETWORKS", "127.0.0.0/8,::1/128", priority="cmdline")
            if opts.api:
                api = StandIn(secrets.token_urlsafe(16)).start()
                crawler.settings.set("SCRAPING_API_KEY", api.key, priority="cmdline")
                crawler.settings.set("SCRAPING_API_URL", api.url, priority="cmdline")
            if "POLITENESS_SLOW_START_RATE" not in os.environ:
                # The demo shop is ours and takes any rate: an unknown site's first seconds at a
                # few requests per second (politeness' slow start) would only slow the demo.
                crawler.settings.set("POLITENESS_SLOW_START_RATE", 0, priority="cmdline")
            if "SCHEDULER_IDLE_TIMEOUT" not in os.environ:
                # Nobody else works on this queue: no need to wait for other nodes.
                crawler.settings.set("SCHEDULER_IDLE_TIMEOUT", 1, priority="cmdline")
            try:
                addon.validate(crawler.settings)
                found = backends.apply(crawler.settings)
            except ConfigError as exc:
                print(f"error: {exc}", file=sys.stderr)
                self.exitcode = 2
                return
            print(
                f"demo: shop with {opts.products} products at {site.url}"
                f"{f', fetched through the scraping-API stand-in at {api.url}' if api else ''}; "
                f"Redis {'embedded' if found.embedded_redis else mask_url(found.redis_url)}, "
                f"Postgres {'embedded' if found.embedded_postgres else mask_url(found.database_url)}",
                flush=True,
            )
            started = time.monotonic()
            self.crawler_process.crawl(crawler)
            self.crawler_process.start()
            elapsed = time.monotonic() - started
        finally:
            site.stop()
            if api is not None:
                api.stop()
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            return
        stats = crawler.stats.get_stats()
        print(f"\ndemo: {summarize(stats, elapsed)}")
        if api is not None:
            print(
                f"demo: {stats.get('scraping_api/credits', 0):.0f} microcents spent through the scraping-API stand-in"
            )
        conn = psycopg2.connect(found.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM products WHERE source = %s", (spider,))
                products = cur.fetchone()[0]
                cur.execute("SELECT count(*) FROM rejects WHERE spider = %s", (spider,))
                rejects = cur.fetchone()[0]
        finally:
            conn.close()
        if opts.render:
            print(
                f"demo: Postgres holds {products} products of the JavaScript-only section (it has "
                f"{len(site.js.products)}), rendered in {stats.get('render/pages', 0)} browser pages"
            )
        else:
            expected = len(catalog.valid_products())
            print(
                f"demo: Postgres holds {products} demo products (the shop has {expected} valid ones) "
                f"and {rejects} rejects (the shop has {len(catalog.broken_products())} broken pages)"
            )
        # Commands that still work once this process (and the embedded servers with it) is gone.
        print('demo: look inside with: .venv/bin/scrapy dbshell -c "SELECT sku, title, price FROM products LIMIT 5"')
        print("demo: export with: .venv/bin/scrapy export products -o products.csv (or .jsonl, .json; --since 1h)")
        quality_report(found.database_url, stats.get("run/id"))
