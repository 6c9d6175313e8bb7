"""A crawl that did nothing says why, naming the setting or flag that changes it."""

from __future__ import annotations

import re
import socket

from support.crawls import crawl_env, project_with_spider, run_scrapy

from scraper.demo_site import Catalog, DemoSite

OFFSITE_SPIDER = """
from urllib.parse import urlsplit

from scraper.spiders.demo import DemoSpider


class PortedSpider(DemoSpider):
    name = "ported"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.allowed_domains = [urlsplit(spider.site_url()).netloc]  # host:port, as genspider once wrote
        return spider
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warning_of(result) -> str:
    lines = [
        l for l in result.stderr.splitlines() if "WARNING" in l and ("No page was fetched" in l or "start request" in l)
    ]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_crawl_that_fetched_nothing_says_why(clean, tmp_path) -> None:
    project = project_with_spider(tmp_path, "ported", OFFSITE_SPIDER)
    with DemoSite(Catalog(products=30)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, PYTHONPATH=str(project))
        offsite = run_scrapy(env, "crawl", "ported", cwd=project)
        # With an expiry the seen-set outlives the run: crawled again at once, nothing is fetched.
        first = run_scrapy(env, "crawl", "demo", "-s", "DUPEFILTER_EXPIRY=3600", cwd=project)
        assert first.returncode == 0, first.stderr[-3000:]
        assert "No page was fetched" not in first.stderr
        seen = run_scrapy(env, "crawl", "demo", "-s", "DUPEFILTER_EXPIRY=3600", cwd=project)
    unreachable = run_scrapy(
        {**env, "DEMO_SITE_URL": f"http://127.0.0.1:{closed_port()}/"},
        "crawl",
        "demo",
        "-s",
        "RETRY_TIMES=0",
        cwd=project,
    )

    line = warning_of(offsite)
    assert "No page was fetched for 'ported'" in line and "1 offsite" in line and "without scheme or port" in line
    assert re.search(r"Crawl summary \(finished, run \d+ of ported\): 0 pages", offsite.stderr), offsite.stderr[-2000:]
    line = warning_of(seen)
    assert "No page was fetched for 'demo'" in line and "already seen within DUPEFILTER_EXPIRY=3600s" in line
    assert "SCHEDULER_FLUSH_ON_START=true" in line
    line = warning_of(unreachable)
    assert "downloads failed, unreachable" in line and "ConnectionRefusedError" in line


def test_a_crawl_refused_by_the_fetch_boundary_names_it(clean) -> None:
    """A local test site crawled by a node on a shared Redis without FETCH_ALLOW_NETWORKS: every
    request is refused before it leaves, and the warning names the boundary and the setting
    instead of blaming the network."""
    with DemoSite(Catalog(products=5)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, FETCH_ALLOW_NETWORKS="")
        refused = run_scrapy(env, "crawl", "demo")
        hits = site.stats()["total"]
    assert refused.returncode == 0, refused.stderr[-3000:]
    assert hits == 0  # not one request reached the site
    line = warning_of(refused)
    assert "No page was fetched for 'demo': 1 requests refused by the fetch boundary" in line, line
    assert "loopback, private or link-local address" in line and "FETCH_ALLOW_NETWORKS=127.0.0.0/8" in line
    assert "unreachable" not in line and "DOWNLOAD_TIMEOUT" not in line, line


def test_requests_a_middleware_ignored_are_not_called_unreachable() -> None:
    from scraper.extensions.summary import causes

    ignored = "downloader/exception_type_count/scrapy.exceptions.IgnoreRequest"
    found = causes(
        {
            "downloader/exception_count": 5,
            ignored: 4,
            "downloader/exception_type_count/twisted.internet.error.DNSLookupError": 1,
            "fetch_boundary/forbidden_scheme": 1,
            "robotstxt/forbidden": 1,
        }
    )
    assert found == [
        "1 forbidden by robots.txt (-s ROBOTSTXT_OBEY=False to ignore it)",
        "1 requests refused by the fetch boundary (not http or https)",
        "1 downloads failed, unreachable (DNSLookupError; check the start URL, DOWNLOAD_TIMEOUT and RETRY_TIMES)",
        "2 requests ignored by a downloader middleware (its warning in the log says why)",
    ]
