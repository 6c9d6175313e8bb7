"""One page, one identity: trackers, session ids and fragments make no new page; a page's
canonical link teaches the fleet its aliases, so a recrawl fetches each product once and stores
the same URL whatever path it came by."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy
from support.stats import stat

from scraper.demo_site import Catalog, DemoSite
from scraper.identity.policy import UrlPolicy, policy_for


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://s.test/p/1.html?utm_source=a&utm_medium=b&gclid=9", "https://s.test/p/1.html"),
        ("https://s.test/p/1.html?color=red&fbclid=x&size=m#reviews", "https://s.test/p/1.html?color=red&size=m"),
        ("https://s.test/c/a/p/1.html;jsessionid=ABC?x=1", "https://s.test/c/a/p/1.html?x=1"),
        ("https://s.test/p?PHPSESSID=1&page=2", "https://s.test/p?page=2"),
        ("https://s.test/p?_hsenc=1&mc_cid=2&mc_eid=3&msclkid=4&_gl=5&pk_campaign=6", "https://s.test/p"),
        # Parameters that may select content stay: merging two pages would lose one of them.
        (
            "https://s.test/list?cid=3&source=shop&ref=home&page=2",
            "https://s.test/list?cid=3&source=shop&ref=home&page=2",
        ),
        ("https://s.test/p/1.html", "https://s.test/p/1.html"),
    ],
)
def test_the_policy_drops_trackers_session_ids_and_fragments_only(url: str, expected: str) -> None:
    assert UrlPolicy().apply(url) == expected


def test_a_spider_adds_and_keeps_parameters_of_its_own() -> None:
    class Spider:
        url_drop_params = ("ref",)
        url_keep_params = ("gclid",)

    policy = policy_for({"URL_DROP_PARAMS": "from,trk"}, Spider())
    assert policy.apply("https://s.test/p/1?ref=cat&from=a&trk=b&gclid=7&id=3") == "https://s.test/p/1?gclid=7&id=3"


def fetched(site: DemoSite) -> Counter[str]:
    """Product page fetches, by the page's path (its trackers and session id set aside)."""
    counts: Counter[str] = Counter()
    for target, n in site.stats()["requests"].items():
        path = re.split(r"[;?]", target, maxsplit=1)[0]
        if "/p/" in path:
            counts[path] += n
    return counts


def by_product(counts: Counter[str]) -> Counter[int]:
    ids: Counter[int] = Counter()
    for path, n in counts.items():
        ids[int(re.search(r"/p/(\d+)\.html$", path).group(1))] += n
    return ids


def test_tracked_links_and_aliases_fetch_each_product_once_and_store_one_url(clean) -> None:
    catalog = Catalog(products=60)
    with DemoSite(catalog, tracking=True) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url)
        first = run_scrapy(env, "crawl", "demo")
        assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr[-3000:]
        once = fetched(site)
        site.reset_stats()
        rows_first = clean.query("SELECT sku, url FROM products ORDER BY sku")
        second = run_scrapy(env, "crawl", "demo")
        assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
        again = fetched(site)
        origin = site.origin
        with_canonical = {
            path for path in catalog.pages() if "/p/" in path and b'rel="canonical"' in site.page(path).body
        }
    listed = {path for path in catalog.pages() if "/p/" in path}
    # Four links to each listed path (two per listing, trackers and a session id): one fetch each.
    assert set(once) == listed and set(once.values()) == {1}, once.most_common(3)
    # Each alias path (every listed path of a page with a canonical /p/ID.html) was learnt by the
    # first run...
    assert len(with_canonical) > 0.9 * len(listed)
    assert stat(first.stderr, "identity/aliases_learnt") == len(with_canonical), first.stderr[-2000:]
    assert clean.redis().hlen("{demo}:aliases") == len(with_canonical)
    # ...so the recrawl fetches each product once, however many categories list it.
    multi = [p.id for p in catalog.multi_category_products()]
    assert multi and all(by_product(once)[pid] > 1 for pid in multi)
    canonical_ids = by_product(Counter(with_canonical))
    assert all(n == 1 for pid, n in by_product(again).items() if pid in canonical_ids), by_product(again).most_common(3)
    assert "URL aliases learnt from canonical links in earlier runs" in second.stderr
    # One stored URL per product, the canonical one, the same in both runs; nothing updated.
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
    assert clean.query("SELECT sku, url FROM products ORDER BY sku") == rows_first
    assert all(re.fullmatch(re.escape(origin) + r"/p/\d+\.html", url) for _, url in rows_first), rows_first[:3]
    assert stat(second.stderr, "postgres/updated") == 0, second.stderr[-2000:]
    # The cost of each run's changes: every page of the first run paid for a new row; the
    # recrawl captured no change (nothing changed), so it has no cost per change.
    runs = run_scrapy(crawl_env(clean), "runs", "demo", "--json")
    latest, earlier = (json.loads(line) for line in runs.stdout.splitlines()[:2])
    assert earlier["changes"] == len(catalog.valid_products()) and latest["changes"] == 0, (earlier, latest)
    assert earlier["pages_per_change"] == round(earlier["pages"] / earlier["changes"], 2)
    assert latest["pages_per_change"] is None and latest["pages"] < earlier["pages"]
    table = run_scrapy(crawl_env(clean), "runs", "demo")
    assert "per chg" in table.stdout.splitlines()[0], table.stdout


def test_the_identity_fingerprint_is_scrapys_of_the_identity_url() -> None:
    from scrapy import Request
    from scrapy.utils.request import RequestFingerprinter

    from scraper.identity.fingerprint import IdentityFingerprinter

    ours, scrapys = IdentityFingerprinter(), RequestFingerprinter()
    ours.aliases.learn("https://s.test/c/a/p/1.html", "https://s.test/p/1.html")
    for url, identity in [
        ("https://s.test/p/2.html", "https://s.test/p/2.html"),
        ("https://s.test/p/2.html?utm_source=x&b=2&a=1#f", "https://s.test/p/2.html?a=1&b=2"),
        ("https://s.test/c/a/p/1.html?gclid=3", "https://s.test/p/1.html"),
    ]:
        for method, body in (("GET", b""), ("POST", b"q=1")):
            request = Request(url, method=method, body=body)
            expected = scrapys.fingerprint(Request(identity, method=method, body=body))
            assert ours.fingerprint(request) == expected == ours.fingerprint(request), (url, method)
