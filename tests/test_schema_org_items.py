"""schema.org in full: offers, variants, aggregate offers, keys and availability, read with extruct
from real markup and cleaned and validated as a crawl would."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import extruct
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scraper.pipelines.clean import CleanPipeline
from scraper.pipelines.validate import check
from scraper.spiders.schema_org import SchemaOrgSpider, products_in

D = Decimal


def _ld(data: dict[str, Any]) -> str:
    return f'<script type="application/ld+json">{json.dumps({"@context": "https://schema.org", **data})}</script>'


def _items(*blocks: str, body: str = "") -> list[tuple[dict[str, Any], list[str]]]:
    html = f"<html><head>{''.join(blocks)}</head><body>{body}</body></html>"
    response = HtmlResponse("http://shop.test/p/1", body=html.encode(), encoding="utf-8")
    crawler = get_crawler(SchemaOrgSpider)
    spider = crawler._create_spider()
    crawler.spider = spider
    pipeline = CleanPipeline(crawler)
    data = extruct.extract(response.text, base_url=response.url, syntaxes=["json-ld", "microdata"], uniform=True)
    found = []
    for product in products_in(data):
        for item in spider.product_items(product, response):
            item = pipeline.process_item(item)
            found.append(({k: v for k, v in dict(item).items() if v is not None}, check(item)))
    return sorted(found, key=lambda pair: str(pair[0].get("sku")))


def test_each_offer_with_its_own_sku_and_price_is_an_item() -> None:
    found = _items(
        _ld(
            {
                "@type": "Product",
                "name": "Tee",
                "sku": "T",
                "offers": [
                    {
                        "@type": "Offer",
                        "sku": "T-S",
                        "price": "10.00",
                        "priceCurrency": "EUR",
                        "availability": "https://schema.org/InStock",
                    },
                    {
                        "@type": "Offer",
                        "sku": "T-M",
                        "price": "12.00",
                        "priceCurrency": "EUR",
                        "availability": "http://schema.org/OutOfStock",
                    },
                ],
            }
        )
    )
    assert [(i["sku"], i["price"], i["availability"], r) for i, r in found] == [
        ("T-M", D("12.00"), "OutOfStock", []),
        ("T-S", D("10.00"), "InStock", []),
    ]


def test_each_variant_of_a_product_group_is_an_item() -> None:
    found = _items(
        _ld(
            {
                "@type": "ProductGroup",
                "name": "Tee",
                "productGroupID": "G",
                "brand": {"@type": "Brand", "name": "Acme"},
                "hasVariant": [
                    {
                        "@type": "Product",
                        "sku": "G-S",
                        "name": "Tee S",
                        "offers": {"@type": "Offer", "price": "1.299", "priceCurrency": "EUR"},
                    },
                    {
                        "@type": "Product",
                        "gtin13": "4006381333931",
                        "offers": {"@type": "Offer", "price": "2.5", "priceCurrency": "EUR"},
                    },
                    {
                        "@type": "Product",
                        "name": "No key",
                        "offers": {"@type": "Offer", "price": "3", "priceCurrency": "EUR"},
                    },
                ],
            }
        )
    )
    ok = [(i["sku"], i["title"], i["brand"], i["price"]) for i, r in found if not r]
    # schema.org's decimal mark is ".": 1.299 EUR is 1.30, not 1299.
    assert ok == [("4006381333931", "Tee", "Acme", D("2.50")), ("G-S", "Tee S", "Acme", D("1.30"))]
    # A variant that cannot be stored is rejected with its reason, not dropped.
    assert [r for _i, r in found if r] == [["sku: missing"]]


def test_is_variant_of_inherits_from_its_group() -> None:
    found = _items(
        _ld(
            {
                "@type": "Product",
                "mpn": "X-1",
                "isVariantOf": {"@type": "ProductGroup", "name": "Lamp", "brand": "Lumière"},
                "offers": {"@type": "Offer", "price": "40", "priceCurrency": "CHF"},
            }
        )
    )
    assert [(i["sku"], i["title"], i["brand"], i["price"], i["currency"], r) for i, r in found] == [
        ("X-1", "Lamp", "Lumière", D("40.00"), "CHF", [])
    ]


def test_aggregate_offer_keeps_low_and_high() -> None:
    found = _items(
        _ld(
            {
                "@type": "Product",
                "name": "Chair",
                "gtin": "0001",
                "offers": {
                    "@type": "AggregateOffer",
                    "lowPrice": "10",
                    "highPrice": "25.5",
                    "priceCurrency": "GBP",
                    "offerCount": 3,
                },
            }
        )
    )
    assert [(i["sku"], i["price"], i["price_high"], i["currency"], r) for i, r in found] == [
        ("0001", D("10.00"), D("25.50"), "GBP", [])
    ]


def test_microdata_lists_and_unusable_products() -> None:
    body = (
        '<div itemscope itemtype="https://schema.org/Product"><span itemprop="name">Mug</span>'
        '<meta itemprop="sku" content="MUG"><div itemprop="offers" itemscope itemtype="https://schema.org/Offer">'
        '<meta itemprop="price" content="5.00"><meta itemprop="priceCurrency" content="USD">'
        '<link itemprop="availability" href="https://schema.org/InStock"></div></div>'
    )
    found = _items(_ld({"@type": "Product", "name": "No offer", "sku": "NO"}), body=body)
    assert [(i["sku"], i.get("price"), i.get("availability"), r) for i, r in found] == [
        ("MUG", D("5.00"), "InStock", []),
        ("NO", None, None, ["price: missing", "currency: missing"]),
    ]
