"""Repair in real crawls of the demo shop: a redesign moves a field, the guard breaks it, the
repair is learnt from the run's pages and the stored values, and read from there — verified,
never guessed. Row by row in Postgres against what the shop serves.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from support.crawls import crawl_env, run_scrapy, run_scrapy_many

from scraper.demo_site import Catalog, DemoSite, layout

PRODUCTS = 200


def prices(query: Any) -> dict[str, Decimal]:
    return dict(query("SELECT sku, price FROM products"))


def served(site: DemoSite) -> dict[str, Decimal]:
    return {p.sku: p.price for p in site._renderer.catalog.valid_products() if p.price is not None}


def crawl(env: dict[str, str], workers: int = 1) -> list[Any]:
    results = run_scrapy_many(env, *[("crawl", "demo")] * workers)
    for result in results:
        i = result.stderr.find("Traceback")
        assert i < 0, result.stderr[i - 500 : i + 3000]
    return results


def repairs(query: Any) -> list[tuple[Any, ...]]:
    return query(
        "SELECT id, status, item_type, field, rules, contradictions, old_selector, run_id FROM repairs ORDER BY id"
    )


def healthy(clean: Any, site: DemoSite, **extra: str) -> tuple[dict[str, str], dict[str, Decimal]]:
    env = crawl_env(
        clean,
        DEMO_SITE_URL=site.url,
        QUALITY_GUARD_POLL="0.2",
        REPAIR_POLL="0.5",
        QUALITY_FAIL_EXIT="1",
        CONCURRENT_REQUESTS="4",
        **extra,
    )
    for result in crawl(env) + crawl(env):
        assert result.returncode == 0, result.stderr[-3000:]
    good = prices(clean.query)
    assert good == served(site)
    # Nothing broke: nothing was repaired (the control).
    assert repairs(clean.query) == []
    return env, good


def test_a_moved_price_is_repaired_from_stable_values_and_the_next_run_captures_every_change(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env, good = healthy(clean, site)

        site.break_layout(1.0, parts=("price",))
        results = crawl(env, workers=2)
        assert [r.returncode for r in results] == [3, 3], [r.stderr[-3000:] for r in results]
        (repair,) = repairs(clean.query)
        rid, status, item_type, field, rules, contradictions, old, run_id = repair
        assert (status, item_type, field, contradictions, old, run_id) == (
            "active",
            "ProductItem",
            "price",
            0,
            ".price::text",
            3,
        )
        assert rules and all("amount" in r or r.startswith("jsonld:") for r in rules), rules
        # No wrong value: the rows the repair read are unchanged (the shop changed no price).
        assert prices(clean.query) == good
        # The run's report and the summary name it.
        # (the report pads its check names to the longest one's width)
        line = re.compile(rf"repair ProductItem\.price +expected verified, observed repair {rid} active")
        assert any(line.search(r.stderr) for r in results), [r.stderr[-3000:] for r in results]
        assert any("Repairs: 1 learnt" in r.stderr for r in results)
        applied = sum(_stat(r.stderr, "repair/applied/ProductItem.price") for r in results)
        assert applied > 0, "the pages after the repair were read through it"

        # The next run reads the field through the repair from its first page: every change.
        changed = site.reprice(10)
        (result,) = crawl(env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert prices(clean.query) == served(site)
        updated = clean.query("SELECT count(*) FROM item_changes WHERE run_id = 4 AND changes ? 'price'")[0][0]
        assert updated == len(changed)
        sources = dict(
            clean.query(
                "SELECT selector, items FROM field_sources WHERE run_id = 4 AND item_type = 'ProductItem'"
                " AND field = 'price'"
            )
        )
        assert sources == {f"repair:{rid}": len(good)}, sources


def _stat(stderr: str, name: str) -> int:
    from support.stats import stat

    return int(stat(stderr, name) or 0)


def test_the_held_run_is_repaired_from_the_archive_with_no_refetch(clean, tmp_path) -> None:
    catalog = Catalog(products=120, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env, good = healthy(clean, site, ARCHIVE_URL=str(tmp_path / "warc"))

        # The prices change and move in the same run; the repair comes only once most pages are in.
        changed = site.reprice(10)
        site.break_layout(1.0, parts=("price",))
        (broken,) = crawl({**env, "REPAIR_MIN_PAGES": "60"})
        assert broken.returncode == 3, broken.stderr[-3000:]
        assert prices(clean.query) == good, "nothing of the broken run was written"
        ((rid, status, *_),) = repairs(clean.query)
        assert status == "active"

        site.reset_stats()
        replay = run_scrapy(env, "reprocess", "demo", "--run", "3")
        assert replay.returncode == 0, replay.stderr[-3000:]
        assert site.stats()["total"] == 0, "a replay fetches nothing"
        assert prices(clean.query) == served(site)
        repaired = clean.query("SELECT count(*) FROM item_changes WHERE reason = 'repair' AND changes ? 'price'")[0][0]
        assert repaired == len(changed)


_JSONLD = re.compile(r'<script type="application/ld\+json">.*?</script>', re.S)
_BOX = re.compile(r'<p class="price-box">Price: <span class="price">(.*?)</span></p>\n')


def _amount_only(text: str, product: Any) -> str:
    # The amount stays, in an attribute; its currency (the mark, the JSON-LD) is nowhere.
    button = f'<button class="add-to-cart" data-price="{product.jsonld_price}">Add to cart</button>\n'
    return _BOX.sub(button, _JSONLD.sub("", text))


def test_an_amount_shown_without_its_currency_is_never_repaired_into_the_default_currency(clean) -> None:
    # A shop in several currencies: a rule that reads the bare amount would be right about every
    # amount and store the spider's default currency on every product priced in another.
    layout.define("test-amount-only", _amount_only)
    catalog = Catalog(products=120, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env, good = healthy(clean, site)
        currencies = dict(clean.query("SELECT sku, currency FROM products"))
        assert len(set(currencies.values())) > 1, "the test needs a shop in several currencies"

        site.break_layout(1.0, parts=("test-amount-only",))
        for _ in range(2):  # the break run, and the one after: still held, never stored
            (result,) = crawl(env)
            assert result.returncode == 3, result.stderr[-3000:]
        assert prices(clean.query) == good
        assert dict(clean.query("SELECT sku, currency FROM products")) == currencies
        statuses = [status for _id, status, *_ in repairs(clean.query)]
        assert statuses and set(statuses) == {"refused"}, statuses
