"""The whole pipeline, end to end: the demo site crawled by real processes into real Postgres."""

from __future__ import annotations

import re
import subprocess

from support.crawls import ROOT, crawl, crawl_env, scrapy_cmd

from scraper.demo_site import Catalog, DemoSite

EXPECTED_REASONS = {
    "no_price": "price: missing",
    "garbage_price": "price: not a price",
    "missing_title": "title: missing",
    "empty": "sku: missing",
}


def products(services) -> dict[str, tuple]:
    rows = services.query(
        "SELECT sku, title, price, currency, released_at, url, brand, description, updated_at, first_seen"
        " FROM products WHERE source = 'demo'"
    )
    return {row[0]: row for row in rows}


def test_crawl_stores_exactly_the_valid_products_cleaned(clean, site: DemoSite, catalog: Catalog) -> None:
    result = crawl(clean, site)
    stored = products(clean)
    valid = catalog.valid_products()
    assert sorted(stored) == sorted(p.sku for p in valid)
    for product in valid:
        sku, title, price, currency, released_at, url, brand, description, *_ = stored[product.sku]
        assert (title, price, currency) == (product.title, product.price, product.currency), product
        assert released_at == product.released, (product.released_display, released_at)
        assert url == f"{site.origin}{product.canonical_path}"
        assert brand == product.brand
        if product.kind != "truncated":  # its description is cut off with the page
            assert description == product.description
    # One row per product, however many category pages list it.
    assert len(catalog.multi_category_products()) > 0
    assert "Crawl summary (finished" in result.stderr


def test_broken_products_are_rejected_with_their_reason(clean, site: DemoSite, catalog: Catalog) -> None:
    crawl(clean, site)
    rejects = {url: reasons for url, reasons in clean.query("SELECT url, reasons FROM rejects WHERE spider='demo'")}
    broken = catalog.broken_products()
    assert len(rejects) == len(broken)
    for product in broken:
        matching = [r for url, r in rejects.items() if url.endswith(f"/{product.id}.html")]
        assert len(matching) == 1, (product.kind, rejects)
        assert EXPECTED_REASONS[product.kind] in matching[0], (product.kind, matching[0])
    # The raw item is kept with the reject, as scraped.
    [(raw,)] = clean.query("SELECT item FROM rejects WHERE reasons LIKE 'price: not a price%' LIMIT 1")
    assert raw["price"] in {"call for price", "N/A", "Price on request", "TBA"}


def test_recrawl_unchanged_updates_nothing_then_reprice_updates_exactly_n(clean, site: DemoSite) -> None:
    crawl(clean, site)
    before = products(clean)
    crawl(clean, site)
    after = products(clean)
    assert {k: v[8] for k, v in after.items()} == {k: v[8] for k, v in before.items()}  # updated_at
    assert clean.query("SELECT count(*) FROM rejects")[0][0] == len(site.catalog.broken_products())

    changed = site.reprice(7)
    assert len(changed) == 7
    result = crawl(clean, site)
    third = products(clean)
    updated = {k for k in third if third[k][8] != after[k][8]}
    expected = {site.catalog.product(pid).sku for pid in changed}
    assert updated == expected
    for sku in expected:
        assert third[sku][2] != after[sku][2]  # the price moved
        assert third[sku][9] == after[sku][9]  # first_seen kept
    assert "7 updated" in result.stderr


def test_two_processes_share_one_queue(clean, catalog: Catalog) -> None:
    # Slow pages and low concurrency, so that the crawl outlasts the start of both processes.
    site = DemoSite(catalog, delay_ms=100).start()
    env = crawl_env(clean, DEMO_SITE_URL=site.url, SCHEDULER_IDLE_TIMEOUT="3", CONCURRENT_REQUESTS_PER_DOMAIN="4")
    procs = [
        subprocess.Popen(
            scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        site.stop()
    for proc, (_out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    # Both did real work, and no page was fetched twice across the two.
    for _out, err in outputs:
        fetched = re.search(r"'response_received_count': (\d+)", err)
        assert fetched and int(fetched.group(1)) > 10, "one process did not share the work"
    counts = site.stats()["requests"]
    pages = [p for p in counts if p != "/robots.txt"]
    assert sorted(pages) == sorted(catalog.pages())
    assert all(counts[p] == 1 for p in pages), {p: c for p, c in counts.items() if c > 1}
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert len(rows) == len(catalog.valid_products()) and all(n == 1 for _, n in rows)
    # Each product went through the store once across the two nodes: a product listed in two
    # categories and met by both nodes was dropped as a duplicate by one of them.
    stored = sum(int(re.search(r"'item_scraped_count': (\d+)", err).group(1)) for _out, err in outputs)
    assert stored == len(catalog.valid_products())
