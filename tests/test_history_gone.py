"""History and gone rows, end to end: real crawls of the demo site into real Postgres."""

from __future__ import annotations

from decimal import Decimal

from support.crawls import crawl, crawl_env, run_scrapy


def test_reprice_then_remove_products_history_and_gone(clean, site) -> None:
    crawl(clean, site)
    inserted = clean.query("SELECT count(*) FROM item_changes WHERE kind = 'insert'")[0][0]
    assert inserted == len(site.catalog.valid_products())

    old = {p.sku: p.price for p in site.catalog.valid_products()}
    changed = site.reprice(5)
    crawl(clean, site)
    updates = clean.query("SELECT key, changes, reason FROM item_changes WHERE kind = 'update'")
    assert len(updates) == 5
    by_sku = {key[1]: (changes, reason) for key, changes, reason in updates}
    for pid in changed:
        product = site.catalog.product(pid)
        changes, reason = by_sku[product.sku]
        assert reason == "crawl" and set(changes) == {"price"}
        assert [Decimal(str(v)) for v in changes["price"]] == [old[product.sku], product.price]

    timeline = run_scrapy(crawl_env(clean), "history", "demo", site.catalog.product(changed[0]).sku)
    assert timeline.returncode == 0, timeline.stderr[-2000:]
    lines = timeline.stdout.strip().splitlines()
    assert [line.split()[2] for line in lines] == ["insert", "update"]
    assert f"price: {old[site.catalog.product(changed[0]).sku]}" in lines[1]

    removed = site.remove(3)
    skus = {site.catalog.with_removed(()).product(pid).sku for pid in removed}
    # A run stopped early marks nothing gone...
    stopped = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url), "crawl", "demo", "-s", "CLOSESPIDER_PAGECOUNT=10")
    assert "Crawl summary (closespider_pagecount" in stopped.stderr, stopped.stderr[-2000:]
    assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0] == 0
    assert clean.query("SELECT count(*) FROM item_changes WHERE kind = 'gone'")[0][0] == 0
    # ...the run it resumes into, once finished, marks exactly the three.
    result = crawl(clean, site)
    gone = clean.query("SELECT sku FROM products WHERE gone_at IS NOT NULL")
    assert {sku for (sku,) in gone} == skus
    assert {key[1] for (key,) in clean.query("SELECT key FROM item_changes WHERE kind = 'gone'")} == skus
    assert "3 gone" in result.stderr and "'items/gone': 3" in result.stderr

    # Seen again: cleared, with a "back" entry; unchanged rows gain no history.
    site.remove(0)
    before = clean.query("SELECT count(*) FROM item_changes")[0][0]
    result = crawl(clean, site)
    assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0] == 0
    assert clean.query("SELECT count(*) FROM item_changes")[0][0] == before + 3
    assert {key[1] for (key,) in clean.query("SELECT key FROM item_changes WHERE kind = 'back'")} == skus
    assert "0 gone" in result.stderr
