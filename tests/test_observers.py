"""Our per-item and per-response watchers share one signal receiver each."""

from __future__ import annotations

import logging

from scrapy import signals
from scrapy.http import HtmlResponse, Request
from scrapy.utils.test import get_crawler

from scraper.item_observers import on_item_scraped, on_response_received


def test_every_response_observer_sees_each_response_even_after_one_raises(caplog) -> None:
    crawler = get_crawler()
    seen: list[tuple[str, str]] = []
    before = len(_receivers(crawler, signals.response_received))  # Scrapy's own

    def broken(response, request) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("observer bug")

    on_response_received(crawler, broken)
    on_response_received(crawler, lambda response, request: seen.append((response.url, request.url)))
    request = Request("http://shop.example/p/1")
    response = HtmlResponse(request.url, body=b"<html></html>", request=request)
    with caplog.at_level(logging.ERROR):
        crawler.signals.send_catch_log(signals.response_received, response=response, request=request, spider=None)
    assert seen == [("http://shop.example/p/1", "http://shop.example/p/1")]
    assert "observer bug" in caplog.text
    # One receiver for all of them, whatever their number.
    assert len(_receivers(crawler, signals.response_received)) == before + 1


def test_item_observers_share_one_receiver_too() -> None:
    crawler = get_crawler()
    got: list[object] = []
    before = len(_receivers(crawler, signals.item_scraped))
    on_item_scraped(crawler, got.append)
    on_item_scraped(crawler, got.append)
    assert len(_receivers(crawler, signals.item_scraped)) == before + 1
    crawler._item_observers.item_scraped("item")
    assert got == ["item", "item"]


def _receivers(crawler, signal):  # type: ignore[no-untyped-def]
    from pydispatch import dispatcher

    return list(dispatcher.getAllReceivers(crawler.signals.sender, signal))
