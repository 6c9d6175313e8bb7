"""A break a node hears of before its first page of the broken type (a node that joins a broken
run late: the fleet's break is read at its first look) is matched to the type when its pages come:
the node learns the repair like the others, not never."""

from __future__ import annotations

from scrapy import Field
from scrapy.http import HtmlResponse, Request
from scrapy.utils.test import get_crawler

from scraper.items import ProductItem
from scraper.items.base import StoredItem
from scraper.repair.live import RepairMiddleware


class Posting(StoredItem):
    table = "postings_repair_test"
    key = ("ref",)
    ref = Field(sql="text")


def _page(i: int) -> tuple[HtmlResponse, ProductItem]:
    url = f"http://shop.test/p/{i}.html"
    body = f'<h1>P{i}</h1><p class="cost">{i},00 €</p>'.encode()
    response = HtmlResponse(url, body=body, encoding="utf-8", request=Request(url))
    return response, ProductItem(sku=str(i), title=f"P{i}", currency="EUR", source="demo", url=url)


def test_a_reject_break_heard_before_the_types_first_page_is_wanted_once_its_pages_come() -> None:
    mw = RepairMiddleware(get_crawler(settings_dict={"REPAIR_ENABLED": True, "REPAIR_MIN_PAGES": 3}))
    mw.broke({"rejects/price": [0.5, 0.05], "rejects/currency": [0.5, 0.05]})
    assert mw.wanted == {}  # no type with a price met yet: nothing to learn

    response, item = _page(1)
    assert list(mw.process_spider_output(response, [item])) == [item]
    # The currency is repaired with its price: one target, named by the first break heard.
    assert mw.wanted == {("ProductItem", "price"): [0, -1, "rejects/price"]}
    assert mw.busy == set()  # one page of three needed: no try yet


def test_a_field_break_names_its_type_and_is_wanted_at_once() -> None:
    mw = RepairMiddleware(get_crawler(settings_dict={"REPAIR_ENABLED": True}))
    mw.broke({"ProductItem.title": [0.1, 0.9]})
    assert mw.wanted == {("ProductItem", "title"): [0, -1, "ProductItem.title"]}


def test_a_repair_verified_is_not_learnt_again_when_a_new_type_meets_the_break() -> None:
    # A repair waiting for review (or rejected by an operator since) is settled for this node:
    # the first page of another item type matches the breaks heard again, and must not make the
    # node learn that repair a second time.
    mw = RepairMiddleware(get_crawler(settings_dict={"REPAIR_ENABLED": True, "REPAIR_MIN_PAGES": 3}))
    mw.broke({"rejects/price": [0.5, 0.05]})
    response, item = _page(1)
    list(mw.process_spider_output(response, [item]))
    assert ("ProductItem", "price") in mw.wanted
    mw.wanted.pop(("ProductItem", "price"))  # as a verified repair leaves it (see _learn's done)
    mw.settled.add(("ProductItem", "price"))
    url = "http://jobs.test/j/1.html"
    job = Posting(ref="1")
    list(mw.process_spider_output(HtmlResponse(url, body=b"<h1>J</h1>", request=Request(url)), [job]))
    assert ("ProductItem", "price") not in mw.wanted
