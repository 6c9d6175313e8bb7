"""Shops in another language and currency, crawled by real processes into real Postgres.

The German section writes ``1.234,56 €`` and ``9. März 2026``, the Kuwaiti one ``KWD 12.500``
and ``12.500 د.ك.``; no spider is told either: the pages declare their language, and every
product must be stored with its exact amount, currency and date.
"""

from __future__ import annotations

from support.crawls import crawl_env, run_scrapy

from scraper.demo_site import Catalog, DemoSite
from scraper.demo_site.sections import SECTIONS

# Shops whose values only their declared locale reads right: de-CH's ’ grouping, pt-BR's
# day-first dates, Czech "5. 6. 2019", Egyptian Arabic-Indic digits with the Arabic marks.
LOCALE_SHOPS = ("ch", "br", "cz", "eg")


def _crawl(services, spider: str, url: str) -> str:
    result = run_scrapy(crawl_env(services), "crawl", spider, "-a", f"url={url}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr


def test_german_and_kuwaiti_shops_are_stored_exactly(clean, site: DemoSite, catalog: Catalog) -> None:
    for prefix in ("de", "kw", *LOCALE_SHOPS):
        _crawl(clean, "demo", f"{site.origin}/{prefix}/")
    log = _crawl(clean, "schema_org", f"{site.origin}/kw/")
    rows = {
        (source, sku): (price, currency, released_at, title)
        for source, sku, price, currency, released_at, title in clean.query(
            "SELECT source, sku, price, currency, released_at, title FROM products"
        )
    }
    assert clean.query("SELECT reasons FROM rejects") == []
    expected = {}
    for prefix, source in (
        ("de", "demo"),
        ("kw", "demo"),
        ("kw", "127.0.0.1"),
        *((prefix, "demo") for prefix in LOCALE_SHOPS),
    ):
        for product in SECTIONS[prefix].products(catalog):
            expected[(source, product.sku)] = (product.price, product.currency, product.released, product.title)
    assert rows.keys() == expected.keys()
    for key, (price, currency, released, title) in expected.items():
        got_price, got_currency, got_released, got_title = rows[key]
        # Equal as numbers and to the last unit: 12.500 KWD must not be 12500 or 12.50.
        assert (got_price, got_currency, got_released, got_title) == (price, currency, released, title), key
        assert got_price.as_tuple().exponent <= -SECTIONS[key[1][:2].lower()].places
    # Both kinds of section dates were met: German month names and dotted numbers.
    displays = {p.released_display for p in SECTIONS["de"].products(catalog)}
    assert any("März" in d or "ber " in d or "uar " in d for d in displays)
    assert any(d.count(".") == 2 for d in displays)
    assert "clean/unparsed" not in log
    # The shapes that were stored wrong before the locale decided were all met.
    shown = {prefix: [p for p in SECTIONS[prefix].products(catalog)] for prefix in LOCALE_SHOPS}
    assert any("\u2019" in p.price_display and p.price >= 1000 for p in shown["ch"])
    assert any(p.released.day <= 12 and p.released.day != p.released.month for p in shown["br"])
    assert any(
        p.released.day <= 12 and p.released.day != p.released.month and ". " in p.released_display for p in shown["cz"]
    )
    assert any("\u066c" in p.price_display for p in shown["eg"])


def test_sections_leave_the_default_shop_alone(site: DemoSite, catalog: Catalog) -> None:
    home = site.page("/", "").body
    assert b"/de/" not in home and b"/kw/" not in home
    german = site.page("/de/", "")
    assert german.status == 200 and dict(german.headers)["Content-Language"] == "de"
    assert b'<html lang="de">' in german.body
    assert site.page("/de/p/99999.html", "").status == 404
    assert site.page("/xx/", "").status == 404
