"""Scrapy's developer commands work on our spiders and never touch the fleet's shared state.

One stopped crawl leaves what a live one has in Redis and Postgres (a queue, a seen-set, dedupe
claims, rows); a node heartbeat and a metrics target file are added as a running node would
have them. Then shell, fetch, view, parse, check and runspider run against the demo site, and
everything is compared byte for byte.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
from pathlib import Path

from support.crawls import ROOT, crawl_env, run_scrapy, run_scrapy_many
from support.queue import queue_depth

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import StandIn

ADHOC_SPIDER = """
import scrapy


class AdhocSpider(scrapy.Spider):
    name = "adhoc"

    def __init__(self, url, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield response.follow("/p/1.html", callback=self.parse)
"""


def redis_snapshot(client) -> dict[bytes, bytes]:
    # DUMP is the exact serialized value (TTL aside): any write to a key changes it.
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


def tables_snapshot(services) -> dict[str, list[str]]:
    tables = [
        t for (t,) in services.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
    ]
    return {t: [r for (r,) in services.query(f'SELECT t::text FROM "{t}" t ORDER BY 1')] for t in tables}


def folder_snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_developer_commands_work_and_leave_shared_state_untouched(clean, tmp_path) -> None:
    targets = tmp_path / "targets"
    catalog = Catalog(products=60)
    with DemoSite(catalog) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, METRICS_FILE_SD_DIR=str(targets))
        stopped = run_scrapy(env, "crawl", "demo", "-s", "CLOSESPIDER_PAGECOUNT=12", "-s", "CONCURRENT_REQUESTS=2")
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        server = clean.redis()
        server.hset("{demo}:nodes", "other-host:4242:abcdef", time.time())
        (targets / "other-host-4242-9411.json").write_text('[{"targets": ["other-host:9411"]}]')
        assert (
            queue_depth(server, "{demo}:requests") > 0 and server.exists("{demo}:dupefilter", "{demo}:items:seen") == 2
        )
        before = redis_snapshot(server), folder_snapshot(targets), tables_snapshot(clean)
        assert before[2]["products"], "the stopped crawl stored some rows"
        hits_before = site.stats()["total"]

        spider_file = tmp_path / "adhoc.py"
        spider_file.write_text(ADHOC_SPIDER)
        # Independent of each other, so run side by side (several developers at once, too).
        shell, fetch, headers, view, parse, check, runspider = run_scrapy_many(
            {**env, "BROWSER": "true"},
            ("shell", f"{site.url}p/1.html", "-c", "(response.status, response.css('.sku::text').get())"),
            ("fetch", "--nolog", f"{site.url}p/1.html"),
            # Nothing to connect to: a developer command needs neither Redis nor Postgres.
            (
                "fetch",
                "--nolog",
                "--headers",
                "-s",
                f"REDIS_URL=redis://127.0.0.1:{closed_port()}/0",
                "-s",
                f"DATABASE_URL=postgresql://nobody@127.0.0.1:{closed_port()}/none",
                site.url,
            ),
            ("view", "--nolog", site.url),
            (
                "parse",
                "--nocolour",
                "--spider",
                "demo",
                "-c",
                "parse_product",
                "--pipelines",
                f"{site.url}p/{catalog.ids_by_kind('no_price')[0]}.html",
            ),
            ("check", "demo"),
            ("runspider", str(spider_file), "-a", f"url={site.url}", "-O", str(tmp_path / "out.jsonl")),
        )
        # The crawl's middlewares, the scraping API included: the page as the crawl would get it.
        with StandIn("dev-key-4242") as api:
            links, through_api = run_scrapy_many(
                env,
                ("parse", "--nocolour", "--spider", "demo", site.url),
                (
                    "fetch",
                    "-s",
                    f"SCRAPING_API_KEY={api.key}",
                    "-s",
                    f"SCRAPING_API_URL={api.url}",
                    f"{site.url}p/1.html",
                ),
            )
            api_scrapes = api.stats()["scrapes"]
        served = site.stats()["total"] - hits_before
        url = site.url

    after = redis_snapshot(server), folder_snapshot(targets), tables_snapshot(clean)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert after[2] == before[2]

    for result in (shell, fetch, headers, view, parse, links, check, runspider, through_api):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "(200, 'DS-000001')" in shell.stdout
    assert '<span class="sku">DS-000001</span>' in fetch.stdout
    assert "< Content-Type: text/html; charset=utf-8" in headers.stdout and "> User-Agent:" in headers.stdout
    assert "DS-000001" in through_api.stdout and api_scrapes >= 1
    assert "dev-key-4242" not in through_api.stderr

    # parse: the item as yielded, then cleaned with its verdict from the validation schema.
    yielded, piped = parse.stdout.split("# Item pipelines (nothing stored)")
    assert "'sku': 'DS-" in yielded and "'source'" not in yielded
    assert "'source': 'demo'" in piped and "Rejected (price: missing" in piped
    assert links.stdout.count("<GET ") >= 8 and "/c/" in links.stdout

    assert re.search(r"Ran ([1-9]\d*) contracts", check.stderr), check.stderr
    assert check.stderr.rstrip().endswith("OK")

    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["url"] for r in rows) == sorted([url, f"{url}p/1.html"])
    # shell, fetch x3, view, parse x2, check (2 pages), runspider (2), each with its robots.txt.
    assert served >= 12


def test_check_fails_when_a_contract_is_broken(services, tmp_path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scraper", project / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "scrapy.cfg", project)
    demo = project / "scraper" / "spiders" / "demo.py"
    source = demo.read_text()
    assert "h1.title::text" in source
    demo.write_text(source.replace("h1.title::text", "h1.renamed::text"))
    with DemoSite(Catalog(products=20)) as site:
        env = crawl_env(services, DEMO_SITE_URL=site.url, PYTHONPATH=str(project))
        result = run_scrapy(env, "check", "demo", cwd=project)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "FAILED (failures=1)" in result.stderr
    assert "Missing fields: title" in result.stderr


def test_genspider_from_host_port_crawls_the_site(clean, tmp_path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scraper", project / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "scrapy.cfg", project)
    catalog = Catalog(products=30)
    with DemoSite(catalog) as site:
        host_port = site.url.split("://", 1)[1].rstrip("/")
        env = crawl_env(clean, PYTHONPATH=str(project))
        made = run_scrapy(env, "genspider", "-t", "product", "shop", host_port, cwd=project)
        assert made.returncode == 0, made.stderr
        source = (project / "scraper" / "spiders" / "shop.py").read_text()
        assert 'allowed_domains = ["127.0.0.1"]' in source
        assert f'start_urls = ["http://{host_port}"]' in source
        crawled = run_scrapy(env, "crawl", "shop", cwd=project)
        check = run_scrapy(env, "check", "shop", cwd=project)
    assert crawled.returncode == 0, crawled.stderr[-3000:]
    stored = {sku for (sku,) in clean.query("SELECT sku FROM products WHERE source = 'shop'")}
    assert stored and stored <= {p.sku for p in catalog.products}
    assert len(stored) >= len(catalog.valid_products()) - 3, crawled.stderr[-3000:]
    assert check.returncode == 0 and check.stderr.rstrip().endswith("OK"), check.stderr[-3000:]
