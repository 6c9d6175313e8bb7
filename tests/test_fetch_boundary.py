"""The fetch boundary, the line behind the signatures: entries for internal services, cloud
metadata, local files or other sites are not fetched even when they carry the fleet's signature
(a leaked secret, a compromised node). Each becomes a dead letter with its reason; the crawl
itself goes on and stores everything, and nothing planted reaches the tables.

The "internal service" is a second local site on 127.0.0.2, outside FETCH_ALLOW_NETWORKS (which
lets the crawl reach its own shop on 127.0.0.1 alone); its hit counter must stay at 0.
"""

from __future__ import annotations

import scrapy
from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy
from support.queue import queue_put

from scraper.demo_site import Catalog, DemoSite
from scraper.queue import keys, signing
from scraper.queue.serializer import dumps


def plant(redis, *urls: str, dont_filter: bool = True) -> None:
    """Push queue entries as someone holding Redis access and the fleet secret could."""
    for url in urls:
        entry = scrapy.Request(url, dont_filter=dont_filter).to_dict()
        queue_put(redis, keys.queue_key("demo"), {signing.current().sign(dumps(entry)): -1e12})


def test_planted_entries_are_not_fetched_and_become_dead_letters(clean) -> None:
    catalog = Catalog(products=30)
    with DemoSite(catalog) as shop, DemoSite(Catalog(products=5), host="127.0.0.2") as internal:
        env = crawl_env(clean, DEMO_SITE_URL=shop.url, FETCH_ALLOW_NETWORKS="127.0.0.1/32")
        plant(
            clean.redis(),
            f"http://127.0.0.2:{internal.port}/latest/meta-data/iam/security-credentials/",
            f"http://127.0.0.2:{internal.port}/p/1.html",
            "http://169.254.169.254/latest/meta-data/",
            "file:///etc/passwd",
            f"http://localhost:{shop.port}/p/2.html",
        )
        # Bound to its own shop (the demo spider is not by default: `scrapy seed` gives it other sites).
        result = run_scrapy(env, "crawl", "demo", "-a", "allowed_domains=127.0.0.1")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert internal.stats()["total"] == 0  # not one request reached the internal service
        listed = run_scrapy(env, "dlq", "list", "demo")
        shop_url = shop.url
    reasons = listed.stdout
    assert reasons.count("forbidden_address") >= 3, reasons
    assert "forbidden_scheme" in reasons and "offsite" in reasons, reasons
    assert "root:" not in result.stderr + reasons  # no file was read
    # Nothing planted became a row or a reject; the shop itself was crawled whole.
    assert not clean.query("SELECT url FROM products WHERE url NOT LIKE %s", (shop_url + "%",))
    assert not clean.query("SELECT url FROM rejects WHERE url LIKE 'file:%%' OR url LIKE '%%127.0.0.2%%'")
    assert_each_product_stored_or_rejected_once(clean.query, catalog)


def test_placeholder_passwords_and_bad_networks_fail_at_start_by_name(services) -> None:
    from support.errors import check_one_line_error

    env = crawl_env(services, REDIS_URL="redis://:change-me@127.0.0.1:6379/0")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "REDIS_URL")
    assert "placeholder 'change-me'" in line and "change-me@" not in line
    env = crawl_env(services, FETCH_ALLOW_NETWORKS="127.0.0.0/8,intranet")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "FETCH_ALLOW_NETWORKS")


def test_a_developer_command_fetches_the_developers_loopback_site_and_refuses_the_rest(clean) -> None:
    """`scrapy parse`/`fetch`/`shell` take no queue entry: the developer named the URL, so the shop on
    loopback is fetched with FETCH_ALLOW_NETWORKS unset; a metadata address is refused cleanly, with
    no dead letter (a developer command keeps none) and no traceback."""
    with DemoSite(Catalog(products=5)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, FETCH_ALLOW_NETWORKS="")
        path = next(p for p in site.catalog.pages() if "/p/" in p)
        parsed = run_scrapy(env, "parse", "--spider", "demo", "-c", "parse_product", "--pipelines", site.origin + path)
        metadata = run_scrapy(env, "fetch", "--nolog", "http://169.254.169.254/latest/meta-data/")
        log = run_scrapy(env, "fetch", "http://169.254.169.254/latest/meta-data/")
    assert parsed.returncode == 0 and "Traceback" not in parsed.stderr, parsed.stderr[-3000:]
    assert "valid: a crawl would store it" in parsed.stdout + parsed.stderr, parsed.stdout[-2000:]
    assert "Traceback" not in metadata.stderr + log.stderr, log.stderr[-3000:]
    assert "169.254.169.254 is a non-public address" in log.stderr, log.stderr[-3000:]
    assert clean.redis().llen("{demo}:dead") == 0
