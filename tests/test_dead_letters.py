"""Dead letters: a poison page and an unreachable host end in the DLQ after their retries;
`scrapy dlq` lists, shows and requeues them."""

from __future__ import annotations

import json
import socket

import redis
import scrapy
from support.crawls import crawl_env, project_with_spider, run_scrapy
from support.queue import queue_depth

from scraper.demo_site import Catalog, DemoSite

POISON_SPIDER = """
from scraper.spiders.demo import DemoSpider


class PoisonSpider(DemoSpider):
    name = "poison"

    def parse_product(self, response):
        if response.url.endswith("/p/7.html"):
            raise ValueError("this page always breaks the parser")
        yield from super().parse_product(response)
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_poison_and_unreachable_requests_become_dead_letters(clean, tmp_path) -> None:
    project = project_with_spider(tmp_path, "poison", POISON_SPIDER)
    catalog = Catalog(products=40)
    poisoned = catalog.product(7)
    with DemoSite(catalog) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, PYTHONPATH=str(project), DLQ_CALLBACK_RETRIES="1")
        unreachable = f"http://127.0.0.1:{closed_port()}/gone"
        seeded = run_scrapy(env, "seed", "poison", unreachable, cwd=project)
        assert seeded.returncode == 0, seeded.stderr
        result = run_scrapy(env, "crawl", "poison", "-s", "RETRY_TIMES=1", cwd=project)
        poison_hits = sum(count for path, count in site.stats()["requests"].items() if path.endswith("/p/7.html"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Spider closed (finished)" in result.stderr
    # The poison page was tried twice per URL (first try + one callback retry), never more.
    assert poison_hits == 2 * len(poisoned.paths)

    listing = run_scrapy(env, "dlq", "list", "poison", cwd=project)
    assert listing.returncode == 0, listing.stderr
    lines = [l for l in listing.stdout.splitlines() if "attempts=" in l]
    callback = [l for l in lines if "callback ValueError: this page always breaks the parser" in l]
    download = [l for l in lines if "download DownloadConnectionRefusedError" in l and unreachable in l]
    assert len(callback) == len(poisoned.paths) and all("attempts=2" in l for l in callback)
    assert len(download) == 1 and "attempts=2" in download[0]
    assert len(lines) == len(callback) + len(download)

    shown = run_scrapy(env, "dlq", "show", "poison", download[0].split()[0], "--json", cwd=project)
    letter = json.loads(shown.stdout)
    assert letter["url"] == unreachable and json.loads(letter["request"])["url"] == unreachable

    requeued = run_scrapy(env, "dlq", "requeue", "poison", "--reason", "callback", cwd=project)
    assert f"requeued {len(callback)} dead letter(s) for 'poison'; 1 left" in requeued.stdout
    assert queue_depth(clean.redis(), "{poison}:requests") == len(callback)
    # The rest of the site was crawled and stored: one bad page does not stop a crawl.
    stored = {r[0] for r in clean.query("SELECT sku FROM products")}
    assert stored == {p.sku for p in catalog.valid_products()} - {poisoned.sku}


def test_a_dead_letter_redis_cannot_take_is_delivered_again(clean, tmp_path) -> None:
    """A request that should become a dead letter while Redis is down is not lost: its lease is
    abandoned (neither acknowledged nor renewed), runs out, and the request is queued again."""
    from scrapy.utils.test import get_crawler
    from support.processes import wait_for
    from support.servers import StoppableRedis

    from scraper.middlewares.dead_letters import bury
    from scraper.node.scheduler import SharedScheduler
    from scraper.spiders.demo import DemoSpider

    server = StoppableRedis(tmp_path)
    server.start()
    try:
        # Longer than the client's own retries while Redis is down (about 6 s).
        crawler = get_crawler(DemoSpider, {"REDIS_URL": server.url, "SCHEDULER_LEASE_TIMEOUT": "12"})
        spider = DemoSpider()
        crawler.spider = spider
        scheduler = SharedScheduler.from_crawler(crawler)
        scheduler.open(spider)
        assert scheduler.enqueue_request(scrapy.Request("http://shop.test/flaky"))
        scheduler.flush_staged()
        request = scheduler.next_request()
        assert request is not None and request.url == "http://shop.test/flaky"
        server.stop()
        bury(crawler, request, "http 503", 3)  # Redis is down: must neither raise nor lose it
        assert crawler.stats.get_value("scheduler/abandoned") == 1
        server.start()
        client = redis.Redis.from_url(server.url)
        scheduler.keeper.tend()  # not acknowledged: the lease is still there
        assert client.zcard("{demo}:lease_deadlines") == 1 and queue_depth(client, "{demo}:requests") == 0

        def reaped() -> bool:
            scheduler.keeper.tend()  # never renewed: it runs out and is reaped into the queue
            return queue_depth(client, "{demo}:requests") == 1

        wait_for(reaped, timeout=20, step=0.2)
        assert client.llen("{demo}:dead") == 0
        assert scheduler.next_request().url == "http://shop.test/flaky"
        scheduler.close("shutdown")
    finally:
        server.stop()
