"""One page, one identity: trackers, session ids and fragments make no new page; a page's
canonical link teaches the fleet its aliases, and so do two URLs whose pages yield the same item
(a shop without canonical links), so a recrawl fetches each product once and stores the same URL
whatever path it came by, in whatever order the links were found."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.crawls import (
    assert_each_product_stored_or_rejected_once,
    crawl,
    crawl_env,
    run_scrapy,
    run_scrapy_many,
)
from support.processes import start_crawl, wait_for
from support.stats import stat

from scraper.demo_site import Catalog, DemoSite, RefLinks
from scraper.identity.aliases import Aliases
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
    assert "URL aliases learnt in earlier runs" in second.stderr
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


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(["https://s.test/", "http://bücher.example/", "https://s.test/c/a/", "http://S.test:8080/"]),
    path=st.one_of(
        st.text(alphabet="ab/?=&#% .", max_size=10),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
        st.sampled_from(["p/1.html?gclid=3", "p/1.html?utm_source=x&b=2&a=1#f", "p/%41%zz", "p/ä?q=é"]),
    ),
    same=st.booleans(),
    verbatim=st.booleans(),
    method=st.sampled_from(["GET", "POST"]),
)
def test_a_urls_fingerprint_is_that_of_a_get_request_for_it(
    base: str, path: str, same: bool, verbatim: bool, method: str
) -> None:
    from scrapy import Request

    from scraper.identity.fingerprint import IdentityFingerprinter

    ours = IdentityFingerprinter()
    ours.aliases.learn("https://s.test/c/a/p/1.html", "https://s.test/p/1.html")
    url = base + path
    # The page's own request, for the URL or another; fingerprinted first, as the dupefilter does.
    own = Request(url if same else base, method=method, meta={"verbatim_url": True} if verbatim else None)
    ours.fingerprint(own)
    if same and not verbatim:
        url = own.url  # the page's canonical link, as escaped as its request's URL
    expected = ours.fingerprint(Request(url))
    assert ours.url_fingerprint(url, own) == expected == ours.url_fingerprint(url)


def product_fetches(site: DemoSite) -> Counter[int]:
    """Product page fetches by product id, whatever URL reached the page."""
    ids: Counter[int] = Counter()
    for target, n in site.stats()["requests"].items():
        if m := re.match(r"/p/(\d+)\.html", target):
            ids[int(m[1])] += n
    return ids


def ref_urls(site: DemoSite, catalog: Catalog) -> dict[str, set[str]]:
    """Each valid product's SKU -> the URLs the ?ref= shop links it at."""
    return {
        p.sku: {f"{site.origin}/p/{p.id}.html?ref={slug}" for slug in p.categories} for p in catalog.valid_products()
    }


def stored_urls(services) -> dict[str, str]:
    return dict(services.query("SELECT sku, url FROM products"))


def assert_stored_once_under_a_url_of_its_own(services, site: DemoSite, catalog: Catalog) -> dict[str, str]:
    rows = services.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert all(n == 1 for _, n in rows) and {sku for sku, _ in rows} == {p.sku for p in catalog.valid_products()}
    urls, own = stored_urls(services), ref_urls(site, catalog)
    assert all(urls[sku] in own[sku] for sku in urls), [(sku, urls[sku]) for sku in urls if urls[sku] not in own[sku]]
    return urls


def last_run_changes(services) -> list[tuple[str, dict]]:
    return services.query(
        "SELECT kind, changes FROM item_changes WHERE run_id = (SELECT max(run_id) FROM crawl_runs) ORDER BY id"
    )


def test_a_shop_without_canonical_links_is_learnt_from_what_its_pages_yield(clean) -> None:
    # Products linked as /p/ID.html?ref=<category> from each category that lists them, and no
    # canonical link: a product in two categories is one page under two URLs, only its item says so.
    catalog = Catalog(products=160)
    multi = [p for p in catalog.multi_category_products() if p.is_valid]
    assert len(multi) >= 10
    with DemoSite(catalog, ref_links=RefLinks(), delay_ms=20) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="6",
            SCHEDULER_LEASE_TIMEOUT="2",
            SCHEDULER_IDLE_TIMEOUT="2",
            RUNS_NODE_TTL="3",
        )
        # The first crawl: two nodes, one SIGKILLed half way.
        workers = [start_crawl(env) for _ in range(2)]
        wait_for(lambda: sum(product_fetches(site).values()) > 60, timeout=60, step=0.05)
        workers[0].proc.send_signal(signal.SIGKILL)
        victim = f":{workers[0].proc.pid}:"
        held = sum(victim in owner.decode() for owner in clean.redis().hvals("{demo}:lease_owners"))
        survivor = workers[1].communicate(timeout=120)[1]
        workers[0].communicate(timeout=10)
        assert "Spider closed (finished)" in survivor and "Traceback" not in survivor, survivor[-3000:]
        first = product_fetches(site)
        urls = assert_stored_once_under_a_url_of_its_own(clean, site, catalog)
        # Each listed URL fetched once; the only fetches more are the pages the killed node held.
        listed = Counter(p.id for p in catalog.products for _ in p.categories)
        assert all(first[pid] >= n for pid, n in listed.items()) and first.keys() == listed.keys()
        assert sum(first.values()) - sum(listed.values()) <= held, ((first - listed).most_common(8), held)
        # Each product in two categories: its other URL learnt as an alias of the one recorded.
        assert stat(survivor, "identity/content_aliases_learnt") <= len(multi)
        aliases = {k.decode(): v.decode().partition(" ")[2] for k, v in clean.redis().hgetall("{demo}:aliases").items()}
        assert len(aliases) == len(multi), sorted(aliases.items())[:5]
        assert all(
            urls[p.sku] == aliases.get(next(iter(ref_urls(site, catalog)[p.sku] - {urls[p.sku]}))) for p in multi
        )

        # An unchanged recrawl, two nodes: each product fetched once, no row updated.
        site.reset_stats()
        results = run_scrapy_many(env, ("crawl", "demo"), ("crawl", "demo"))
        for result in results:
            assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        again = product_fetches(site)
        assert set(again.values()) == {1} and again.keys() == listed.keys(), again - Counter(again.keys())
        assert sum(stat(r.stderr, "postgres/updated") for r in results) == 0
        assert sum(stat(r.stderr, "identity/content_aliases_learnt") for r in results) == 0
        assert stored_urls(clean) == urls and not last_run_changes(clean)

        # Five prices change: five rows updated, their price alone.
        ids = site.reprice(5)
        site.reset_stats()
        third = crawl(clean, site, CONCURRENT_REQUESTS="6")
        assert set(product_fetches(site).values()) == {1}
        assert stat(third.stderr, "postgres/updated") == 5, third.stderr[-2000:]
        changes = last_run_changes(clean)
        assert [kind for kind, _ in changes] == ["update"] * 5 and all(set(c) == {"price"} for _, c in changes)
        assert stored_urls(clean) == urls
        assert {sku for (sku,) in clean.query("SELECT sku FROM products WHERE price <> 0")} >= {
            catalog.product(i).sku for i in ids
        }


def test_the_stored_url_does_not_flip_when_the_links_come_in_another_order(clean) -> None:
    catalog = Catalog(products=100)
    multi = {p.sku for p in catalog.multi_category_products() if p.is_valid}
    assert multi
    # Run 1: each product listed in its home category only (one URL each).
    with DemoSite(catalog, ref_links=RefLinks(home_only=True)) as site:
        first = crawl(clean, site)
        urls = assert_stored_once_under_a_url_of_its_own(clean, site, catalog)
        homes = {p.sku: f"{site.origin}/p/{p.id}.html?ref={p.home_category}" for p in catalog.valid_products()}
        assert urls == homes and stat(first.stderr, "identity/content_aliases_learnt") == 0
        # Run 2: the shop lists them in their second category too, and that link answers first:
        # the page was recorded under its home URL, so its item keeps it, and the new URL is
        # learnt as an alias of it.
        site.ref_links = RefLinks(first="other")
        site.reset_stats()
        second = crawl(clean, site)
        assert all(product_fetches(site)[catalog_id] == 2 for catalog_id in _ids(catalog, multi))
        assert stored_urls(clean) == urls and stat(second.stderr, "postgres/updated") == 0, second.stderr[-2000:]
        assert stat(second.stderr, "identity/content_aliases_learnt") == len(multi)
        assert stat(second.stderr, "identity/urls_kept") >= len(multi)
        # Runs 3 and 4: either link first, each product is fetched once and keeps its URL.
        for order in ("home", "other"):
            site.ref_links = RefLinks(first=order)
            site.reset_stats()
            result = crawl(clean, site)
            assert set(product_fetches(site).values()) == {1}, order
            assert stored_urls(clean) == urls and stat(result.stderr, "postgres/updated") == 0, order
    assert clean.query("SELECT count(*) FROM item_changes WHERE kind <> 'insert'")[0][0] == 0


def _ids(catalog: Catalog, skus: set[str]) -> list[int]:
    return [p.id for p in catalog.products if p.sku in skus]


def test_an_alias_of_an_alias_resolves_to_the_page_in_one_step(clean) -> None:
    server = clean.redis()
    # B was learnt from content as an alias of A; a later run found A's page naming C canonical.
    server.hset(
        "{demo}:aliases", mapping={"https://s.test/b": "1 https://s.test/a", "https://s.test/a": "2 https://s.test/c"}
    )
    aliases = Aliases()
    assert aliases.load(server, "{demo}:aliases", 3) == 2
    assert aliases.resolve("https://s.test/b") == aliases.resolve("https://s.test/a") == "https://s.test/c"
    # A loop (two runs that learnt it each way round) is not followed: one of the two is kept.
    server.hset(
        "{demo}:loop", mapping={"https://s.test/x": "1 https://s.test/y", "https://s.test/y": "2 https://s.test/x"}
    )
    looped = Aliases()
    assert looped.load(server, "{demo}:loop", 3) == 1 and len(looped) == 1
