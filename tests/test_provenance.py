"""Where each value came from: the recording selector, the matching of an item's raw values to
the selector calls of its callback, and a crawl of the demo shop counting them in
``field_sources`` for ``scrapy sources``."""

from __future__ import annotations

import asyncio
import time

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Request, TextResponse
from scrapy.utils.test import get_crawler
from support.crawls import crawl, crawl_env, run_scrapy

from scraper.items import ProductItem
from scraper.repair.middleware import ProvenanceMiddleware
from scraper.repair.provenance import (
    CONSTANT,
    URL,
    RecordingSelector,
    give_back,
    lend,
    records_of,
    sources,
    split_source,
)

PAGE = """<html><head><title>Widget</title></head><body>
<h1 class="title"> Widget </h1><span class="sku">SKU-1</span><span class="mpn">SKU-1</span>
<span class="price">224,98 €</span><img class="main" src="/img/1.jpg">
<div class="description"><p>Strong</p><p>and light</p></div>
<nav class="breadcrumb"><a href="/">Home</a><a href="/c/tools">Tools</a></nav>
<ul><li class="card"><b>A</b><i>1,00</i></li><li class="card"><b>B</b><i>2,00</i></li></ul>
<script>var stock = "InStock";</script>
</body></html>"""


def page(url: str = "http://shop.test/p/1.html", **meta: object) -> HtmlResponse:
    response = HtmlResponse(url, body=PAGE.encode(), encoding="utf-8", request=Request(url, meta=meta))
    lend(response)
    return response


def sources_of(response: HtmlResponse, **values: object) -> dict[str, str]:
    return sources(values, response)


def test_css_and_xpath_reads_are_recorded_with_their_query() -> None:
    r = page()
    assert r.css(".sku::text").get() == "SKU-1"
    assert r.xpath("//span[@class='price']/text()").get() == "224,98 €"
    assert r.css(".description ::text").getall() == ["Strong", "and light"]
    assert records_of(r) == [
        (".sku::text", "SKU-1"),
        ("xpath://span[@class='price']/text()", "224,98 €"),
        (".description ::text", "Strong"),
        (".description ::text", "and light"),
    ]


def test_chains_attrib_and_regex_name_the_whole_chain() -> None:
    r = page()
    assert r.css("nav.breadcrumb").css("a").xpath("@href").getall() == ["/", "/c/tools"]
    assert r.css("img.main").attrib["src"] == "/img/1.jpg"
    assert r.css(".price::text").re_first(r"\d+,\d+") == "224,98"
    chains = {chain for chain, _ in records_of(r)}
    assert "nav.breadcrumb >> a >> xpath:@href" in chains
    assert "img.main >> @src" in chains and "img.main >> @class" in chains
    assert ".price::text >> re:\\d+,\\d+" in chains


def test_fields_of_a_parse_product_callback() -> None:
    r = page()
    found = sources_of(
        r,
        sku=r.css(".sku::text").get(),
        title=r.css("h1.title::text").get(),
        price=r.css(".price::text").get(),
        url=r.css("link[rel=canonical]::attr(href)").get() or r.url,
        image=r.urljoin(r.css("img.main::attr(src)").get() or ""),
        description=r.css(".description ::text").getall(),
        category=r.css(".breadcrumb a::text").getall()[-1:] or None,
        brand=r.css(".brand::text").get(),
        currency="EUR",
    )
    assert found == {
        "sku": ".sku::text",
        "title": "h1.title::text",
        "price": ".price::text",
        "url": URL,
        "image": "img.main::attr(src) (derived)",
        "description": ".description ::text",
        "category": ".breadcrumb a::text",
        "currency": CONSTANT,
    }
    # brand: the selector matched nothing, no value, no source.
    assert split_source(found["image"]) == ("img.main::attr(src)", True)


def test_value_two_selectors_give_goes_to_the_read_in_field_order() -> None:
    r = page()
    # Both spans say SKU-1: each field keeps the selector it was read with, in either order.
    assert sources_of(r, sku=r.css(".sku::text").get(), mpn=r.css(".mpn::text").get()) == {
        "sku": ".sku::text",
        "mpn": ".mpn::text",
    }
    r = page()
    assert sources_of(r, mpn=r.css(".mpn::text").get(), sku=r.css(".sku::text").get()) == {
        "mpn": ".mpn::text",
        "sku": ".sku::text",
    }
    # "Tools" read twice by the breadcrumb's selector, then by the field's own: the field's own.
    r = page()
    crumbs = r.css(".breadcrumb a::text").getall()
    category = r.css("nav.breadcrumb a:last-child::text").get()
    assert crumbs[-1] == category
    assert sources_of(r, crumbs=crumbs, category=category)["category"] == "nav.breadcrumb a:last-child::text"


def test_values_no_selector_gave() -> None:
    r = page(category="Tools from the listing")
    found = sources_of(
        r,
        stock=r.css("script::text").re_first(r'"(\w+)"'),
        by_hand="Widget",  # in the page's text, read without a selector (a regex, say): unknown
        source="demo",
        listing=r.meta["category"],
        count=12345,
    )
    assert found["stock"] == 'script::text >> re:"(\\w+)"'
    assert found["by_hand"] == "unknown"
    assert found["source"] == CONSTANT
    assert found["listing"] == "request"
    assert found["count"] == CONSTANT


def test_each_card_of_a_listing_matches_its_own_reads() -> None:
    r = page()
    out, start = [], 0
    for card in r.css("li.card"):
        values = {"title": card.css("b::text").get(), "price": card.xpath("i/text()").get()}
        out.append(sources(values, r, start))
        start = len(records_of(r))
    assert out == [{"title": "li.card >> b::text", "price": "li.card >> xpath:i/text()"}] * 2


def test_a_long_listing_costs_the_same_per_item() -> None:
    """Each card's item is matched against the page's reads indexed once, not again per card."""
    cards = "".join(f'<li class="card"><b>P{i}</b><i>{i},00 €</i></li>' for i in range(3000))
    url = "http://shop.test/c/all"
    r = HtmlResponse(url, body=f"<ul>{cards}</ul>".encode(), encoding="utf-8", request=Request(url))
    crawler = get_crawler(settings_dict={"PROVENANCE_ENABLED": True})
    mw = ProvenanceMiddleware.from_crawler(crawler)

    def callback():
        for card in r.css("li.card"):
            yield ProductItem(
                title=card.css("b::text").get(), price=card.css("i::text").get(), currency="EUR", source="demo"
            )

    mw.process_spider_input(r)
    started = time.process_time()
    items = list(mw.process_spider_output(r, callback()))
    took = time.process_time() - started
    assert len(items) == 3000
    assert {tuple(sorted(i._sources.items())) for i in items} == {
        (("currency", CONSTANT), ("price", "li.card >> i::text"), ("source", CONSTANT), ("title", "li.card >> b::text"))
    }
    assert took < 3.0, f"{took:.1f} s for 3,000 cards"


def test_the_response_is_lent_lazily_and_given_back() -> None:
    r = HtmlResponse("http://shop.test/", body=PAGE.encode(), encoding="utf-8")
    lend(r)
    assert isinstance(r, HtmlResponse) and r._cached_selector is None  # nothing parsed yet
    assert isinstance(r.selector, RecordingSelector)
    give_back(r)
    assert type(r) is HtmlResponse
    # A selector made before the callback (by a middleware) is recorded from then on, not reparsed.
    plain = HtmlResponse("http://shop.test/", body=PAGE.encode(), encoding="utf-8")
    root = plain.selector.root
    lend(plain)
    assert plain.css(".sku::text").get() == "SKU-1" and plain.selector.root is root
    assert records_of(plain) == [(".sku::text", "SKU-1")]
    # A response that is not text has no selector to lend.
    binary = TextResponse("http://shop.test/a.txt", body=b"x", encoding="utf-8")
    lend(binary)
    give_back(binary)
    assert type(binary) is TextResponse


def _product(r: HtmlResponse) -> ProductItem:
    return ProductItem(sku=r.css(".sku::text").get(), price=r.css(".price::text").get(), url=r.url, brand=None)


def test_middleware_annotates_items_of_sync_and_async_callbacks() -> None:
    crawler = get_crawler(settings_dict={"PROVENANCE_ENABLED": True})
    mw = ProvenanceMiddleware.from_crawler(crawler)
    url = "http://shop.test/p/1.html"
    response = HtmlResponse(url, body=PAGE.encode(), encoding="utf-8", request=Request(url))

    def callback():
        yield _product(response)
        yield Request("http://shop.test/p/2.html")

    mw.process_spider_input(response)
    (item, request) = list(mw.process_spider_output(response, callback()))
    assert item._sources == {"sku": ".sku::text", "price": ".price::text", "url": URL}
    assert "_sources" not in item and type(response) is HtmlResponse

    async def async_callback():
        yield _product(response)

    async def run() -> list:
        mw.process_spider_input(response)
        return [obj async for obj in mw.process_spider_output_async(response, async_callback())]

    (item,) = asyncio.run(run())
    assert item._sources["price"] == ".price::text" and type(response) is HtmlResponse


def test_the_setting_turns_it_off() -> None:
    with pytest.raises(NotConfigured):
        ProvenanceMiddleware.from_crawler(get_crawler(settings_dict={"PROVENANCE_ENABLED": False}))


def test_a_crawl_of_the_demo_shop_counts_each_fields_selector(clean, site, catalog) -> None:
    crawl(clean, site)
    rows = clean.query(
        "SELECT field, selector, items, run_id FROM field_sources WHERE spider = 'demo' AND item_type = 'ProductItem'"
    )
    by_field: dict[str, dict[str, int]] = {}
    for field, selector, items, _ in rows:
        by_field.setdefault(field, {})[selector] = items
    assert {run for *_, run in rows} != {0}
    stored = clean.query("SELECT count(*) FROM products")[0][0]
    price = by_field["price"]
    assert price.get(".price::text", 0) >= 0.95 * sum(price.values()) and sum(price.values()) >= stored
    assert max(by_field["sku"], key=by_field["sku"].get) == ".sku::text"
    assert max(by_field["title"], key=by_field["title"].get) == "h1.title::text"
    assert max(by_field["url"], key=by_field["url"].get) == "link[rel=canonical]::attr(href)"
    assert max(by_field["description"], key=by_field["description"].get) == ".description ::text"

    shown = run_scrapy(crawl_env(clean), "sources", "demo")
    assert shown.returncode == 0, shown.stderr[-2000:]
    print(shown.stdout)
    lines = shown.stdout.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("ProductItem.price")))
    assert lines[at + 1].split()[2] == ".price::text" and lines[at + 1].split()[1].endswith("%")

    missing = run_scrapy(crawl_env(clean), "sources", "demo", "--run", "999999")
    assert missing.returncode == 1 and "no field sources" in missing.stderr
