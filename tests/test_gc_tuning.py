"""The collector leaves start-up's objects alone and runs seldom while a crawl runs; worker threads
get the interpreter back within THREAD_SWITCH_INTERVAL."""

from __future__ import annotations

import re

from support.crawls import crawl, crawl_env, run_scrapy


def _gc_stats(result) -> tuple[int, int, int]:
    def stat(name: str) -> int:
        found = re.search(rf"'{re.escape(name)}': (\d+)", result.stderr)
        assert found, f"no {name} in the final stats: {result.stderr[-2000:]}"
        return int(found.group(1))

    return stat("gc/frozen"), stat("gc/collections"), stat("response_received_count")


def test_collector_tuned_by_default_and_on_request(clean, site) -> None:
    frozen, collections, pages = _gc_stats(crawl(clean, site))
    assert frozen > 10_000  # Scrapy, Twisted and our own start-up objects
    cpython = _gc_stats(crawl(clean, site, GC_YOUNG_THRESHOLD="0", RUNS_FRESH="true"))[1]
    assert pages > 120
    # CPython's threshold of 700 collects every few pages; 20,000 a handful of times per crawl.
    assert collections * 5 < cpython, (collections, cpython)


def test_pages_are_freed_without_the_collector(clean, site) -> None:
    # Each page's response and the selector Scrapy caches on it hold each other: left so, ~35
    # objects per page (the parsed tree's among them) waited for a cyclic collection. What a
    # crawl leaves once (start-up, closing) is taken out by comparing a short crawl with a whole one.
    def garbage(*options: str) -> tuple[int, int]:
        result = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url, RUNS_FRESH="true"), "crawl", "demo", *options)
        assert result.returncode == 0, result.stderr[-3000:]
        collected = re.search(r"'gc/collected': (\d+)", result.stderr)
        assert collected, result.stderr[-2000:]
        return int(collected.group(1)), _gc_stats(result)[2]

    short, short_pages = garbage("-s", "DEPTH_LIMIT=1")
    whole, pages = garbage()
    assert pages - short_pages > 100
    per_page = (whole - short) / (pages - short_pages)
    # Measured: ~48 per page with the cycle, ~13 without it (this shop's rejected and duplicate
    # items leave their exception's traceback in a cycle).
    assert per_page < 25, (short, short_pages, whole, pages)


def test_the_middleware_breaks_the_response_selector_cycle() -> None:
    import asyncio
    import gc
    import weakref

    from scrapy import Request
    from scrapy.http import HtmlResponse
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scraper.middlewares.item_origin import ItemOriginMiddleware

    middleware = ItemOriginMiddleware(MemoryStatsCollector(get_crawler()))

    def page() -> HtmlResponse:
        return HtmlResponse(
            "http://shop.test/p/1.html",
            body=b"<html><h1>A</h1><a href='/p/2'>b</a></html>",
            request=Request("http://shop.test/p/1.html"),
        )

    def callback(response: HtmlResponse):
        yield {"title": response.css("h1::text").get()}
        yield response.follow(response.css("a::attr(href)").get())

    async def consume_async(response: HtmlResponse) -> list:
        async def output():
            for obj in callback(response):
                yield obj

        return [obj async for obj in middleware.process_spider_output_async(response, output())]

    gc.collect()
    gc.disable()  # only reference counting may free the page
    try:
        for consume in (
            lambda r: list(middleware.process_spider_output(r, callback(r))),
            lambda r: asyncio.run(consume_async(r)),
        ):
            response = page()
            out = consume(response)
            assert out[0] == {"title": "A"} and out[1].url == "http://shop.test/p/2"
            assert response.css("h1::text").get() == "A"  # parsed again on demand
            response = page()
            consume(response)
            ref = weakref.ref(response)
            del response, out
            assert ref() is None
        # Without the middleware the same page lives on until a collection.
        response = page()
        list(callback(response))
        ref = weakref.ref(response)
        del response
        assert ref() is not None
    finally:
        gc.enable()
        gc.collect()


def test_switch_interval_while_the_engine_runs(clean, site) -> None:
    def interval(result) -> float | None:
        found = re.search(r"'threads/switch_interval': ([\d.e-]+)", result.stderr)
        return float(found.group(1)) if found else None

    assert interval(crawl(clean, site)) == 0.0005
    assert interval(crawl(clean, site, THREAD_SWITCH_INTERVAL="0", RUNS_FRESH="true")) is None
    bad = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url, THREAD_SWITCH_INTERVAL="-1"), "crawl", "demo")
    assert bad.returncode != 0 and "THREAD_SWITCH_INTERVAL" in bad.stderr


def test_the_switch_interval_is_set_and_restored_in_process() -> None:
    import sys

    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scraper.extensions.switch_interval import SwitchInterval

    before = sys.getswitchinterval()
    crawler = get_crawler(settings_dict={"THREAD_SWITCH_INTERVAL": "0.001"})
    crawler.stats = MemoryStatsCollector(crawler)
    extension = SwitchInterval.from_crawler(crawler)
    extension.engine_started()
    try:
        assert sys.getswitchinterval() == 0.001
        assert crawler.stats.get_value("threads/switch_interval") == 0.001
    finally:
        extension.spider_closed()
    assert sys.getswitchinterval() == before


def test_start_up_pass_walks_the_young_generations_only() -> None:
    # A full pass at engine start walked every start-up object (~55 ms of CPU per crawl) to free
    # a handful; the young generations hold what start-up just dropped.
    import gc

    from scrapy.utils.test import get_crawler

    from scraper.extensions.gc_freeze import GcFreeze

    crawler = get_crawler(settings_dict={"GC_YOUNG_THRESHOLD": 0})
    extension = GcFreeze.from_crawler(crawler)
    passes: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])

    dropped: list = []
    dropped.append(dropped)  # cyclic garbage, as start-up leaves
    del dropped
    gc.callbacks.append(watch)
    try:
        extension.engine_started()
    finally:
        gc.callbacks.remove(watch)
        gc.unfreeze()
    assert passes and max(passes) <= 1, passes
    assert crawler.stats.get_value("gc/frozen") > 1000
