"""`scrapy queue` and the progress line, on a real crawl in progress."""

from __future__ import annotations

import json
import re

from support.crawls import crawl_env, run_scrapy
from support.processes import start_crawl, wait_for

from scraper.demo_site import Catalog, DemoSite


def test_queue_command_and_progress_line_during_a_crawl(clean) -> None:
    with DemoSite(Catalog(products=120), delay_ms=100) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="2", CONCURRENT_REQUESTS_PER_DOMAIN="2")
        crawl = start_crawl(env, "-s", "LOGSTATS_INTERVAL=1")
        wait_for(lambda: site.stats()["total"] > 10)
        result = run_scrapy(env, "queue", "demo", "--json", "--interval", "2")
        _out, log = crawl.communicate(timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["spider"] == "demo" and row["nodes"] == 1
    assert row["depth"] > 0 and row["oldest_age"] > 0 and row["seen"] > row["depth"]
    assert row["pages_per_min"] > 0 and 0 <= row["inflight"] <= 2 + 4  # downloads + prefetched
    progress = re.findall(
        r"Progress: (\d+) pages \((\d+)/min\), (\d+) items stored .* queue (\d+) \(oldest (\d+) s\)", log
    )
    assert len(progress) >= 2 and int(progress[-1][0]) > int(progress[0][0])


def test_queue_command_table_for_an_idle_spider(clean) -> None:
    result = run_scrapy(crawl_env(clean), "queue", "--interval", "0.1")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["spider", "queued", "oldest", "nodes"]
    assert {line.split()[0] for line in lines[1:]} == {"api_extract", "demo", "demo_js", "demo_sitemap", "schema_org"}


def test_queue_command_shows_the_rate_of_a_site_that_throttles(clean) -> None:
    with DemoSite(Catalog(products=200)) as site:
        site.limit_rate(10)
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="8")
        crawl = start_crawl(env)
        wait_for(lambda: site.stats()["throttled"] > 0)
        table = run_scrapy(env, "queue", "demo", "--interval", "1.5")
        as_json = run_scrapy(env, "queue", "demo", "--json", "--interval", "0.5")
        crawl.proc.terminate()  # a graceful stop: the rest of the crawl is not what is tested
        crawl.communicate(timeout=60)
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr[-2000:] + as_json.stderr[-2000:]
    found = re.search(r"^  127\.0\.0\.1 +([\d.]+) requests/s   last 429/503 (\d+)s ago$", table.stdout, re.M)
    assert found and 0.1 <= float(found.group(1)) <= 10 * 1.5, table.stdout
    rates = json.loads(as_json.stdout.strip().splitlines()[-1])["adaptive_rates"]
    assert 0.1 <= rates["127.0.0.1"]["rate"] <= 15, rates
