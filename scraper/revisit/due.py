"""What each page yielded, and in a revisit run, which links are worth a request.

For every page this middleware (close to the engine, after the canonical link was read) hashes
the items the callback yielded (the page's content as the spider reads it: markup that changes
without changing the items is no change) and tells the recorder (:mod:`.recorder`), so that the
page's interval is halved or grown. A sitemap's ``lastmod`` and ``changefreq`` (read from the
sitemap response, Scrapy's ``SitemapSpider`` or any callback parsing one) go with the requests
for their URLs.

In a revisit run (``REVISIT_DUE``, ``scrapy crawl SPIDER --due``) it also:

* queues, after the spider's own start requests, the known pages that are due by their own
  history (a page the sitemap speaks for waits for the sitemap's word);
* drops each link to a known page that is not due (``revisit/skipped``); links to pages never
  seen, listing pages (at ``REVISIT_LISTING_INTERVAL``) and ``dont_filter`` requests go on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from itemadapter import ItemAdapter
from scrapy import Request
from scrapy.http import TextResponse
from scrapy.utils.sitemap import Sitemap

from ..identity.canonical import canonical_link
from ..items.base import StoredItem
from .recorder import RevisitRecorder, Visit, recorder_of
from .schedule import ITEMS, LISTING, due_without_sitemap, is_due, parse_lastmod

logger = logging.getLogger(__name__)

LASTMOD_META = "revisit_lastmod"
CHANGEFREQ_META = "revisit_changefreq"
HINTED_META = "revisit_hinted"


def _item_bytes(item: Any) -> bytes:
    fields = ItemAdapter(item).asdict()
    return json.dumps([type(item).__name__, fields], sort_keys=True, default=str).encode("utf-8")


class RevisitMiddleware:
    def __init__(self, crawler: Any, recorder: RevisitRecorder) -> None:
        self.crawler = crawler
        self.recorder = recorder
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter

    @classmethod
    def from_crawler(cls, crawler: Any) -> RevisitMiddleware:
        return cls(crawler, recorder_of(crawler))

    # -- a revisit run's start ---------------------------------------------------------------------
    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in start:
            yield obj
        if not self.recorder.due_run:
            return
        await self.recorder.mark_due_run()
        spider = self.crawler.spider
        recorder, queued, unknown = self.recorder, 0, 0
        for state in list(recorder.states.values()):
            if state.kind != ITEMS or not due_without_sitemap(state, recorder.now, recorder.schedule):
                continue
            callback = getattr(spider, state.callback, None) if state.callback else None
            if state.callback and not callable(callback):
                unknown += 1  # the spider no longer has that callback: found by links, or not at all
                continue
            queued += 1
            yield Request(state.url, callback=callback)
        self.stats.set_value("revisit/seeded", queued)
        logger.info(
            "Revisit run: %d known page(s) due by their own history queued%s",
            queued,
            f"; {unknown} left out (their callback is gone from the spider)" if unknown else "",
        )

    # -- each page -------------------------------------------------------------------------------
    def _page_key(self, response: Any) -> tuple[bytes, str]:
        request = response.request
        canonical = canonical_link(response) if request.method == "GET" else None
        if canonical is not None:
            url = self.fingerprinter.policy.apply(canonical)
            return self.fingerprinter.fingerprint(Request(url)), url
        return self.fingerprinter.fingerprint(request), self.fingerprinter.identity(request.url)

    def _callback_name(self, request: Request) -> str | None:
        callback = request.callback
        if callback is None or getattr(callback, "__self__", None) is not self.crawler.spider:
            return None
        return callback.__name__

    def _sitemap_hints(self, response: Any) -> dict[str, tuple[float | None, str | None]]:
        body = response.body
        # A SitemapSpider's sitemap may come gzipped (sitemap.xml.gz): it knows how to open it.
        opener = getattr(self.crawler.spider, "_get_sitemap_body", None)
        if callable(opener) and not isinstance(response, TextResponse):
            try:
                body = opener(response) or b""
            except Exception:
                return {}
        if b"<urlset" not in body[:4096]:
            return {}
        try:
            sitemap = Sitemap(body)
        except Exception:  # not one after all: no hints
            return {}
        if sitemap.type != "urlset":
            return {}
        hints = {}
        for entry in sitemap:
            loc = entry.get("loc")
            if loc:
                hints[loc] = (parse_lastmod(entry.get("lastmod")), entry.get("changefreq"))
        return hints

    def _goes_on(self, request: Request, hints: dict[str, tuple[float | None, str | None]]) -> bool:
        lastmod = None
        if hints:
            found = hints.get(request.url)
            if found is not None:
                lastmod, changefreq = found
                request.meta[LASTMOD_META] = lastmod
                request.meta[CHANGEFREQ_META] = changefreq
        recorder = self.recorder
        if request.dont_filter or not (recorder.due_run or hints):
            return True
        state = recorder.state(self.fingerprinter.fingerprint(request))
        if state is None:
            return True
        if lastmod is not None and lastmod > state.fetched_at and state.kind == ITEMS:
            request.meta[HINTED_META] = True
        if not recorder.due_run:
            return True
        if is_due(state, recorder.now, recorder.schedule, lastmod):
            return True
        self.stats.inc_value("revisit/skipped")
        return False

    def _begin(self, response: Any) -> _Page | None:
        recorder = self.recorder
        if not recorder.ready or response.status != 200:
            return None
        request = response.request
        key, url = self._page_key(response)
        meta = request.meta
        visit = recorder.begin(
            Visit(
                key=key,
                url=url,
                callback=self._callback_name(request),
                etag=_header(response, b"ETag"),
                last_modified=_header(response, b"Last-Modified"),
                lastmod=meta.get(LASTMOD_META),
                changefreq=meta.get(CHANGEFREQ_META),
                hinted=bool(meta.get(HINTED_META)),
            )
        )
        return _Page(self, visit, self._sitemap_hints(response))

    # Asynchronous only: a revisit run awaits its claims before a visited page goes on (Scrapy
    # runs every spider middleware's output asynchronously anyway).
    async def process_spider_output(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        page = self._begin(response)
        if page is None:
            async for obj in result:
                yield obj
            return
        if self.recorder.due_run:
            # The items the page had are the run's to mark gone if unseen (see .recorder).
            await self.recorder.expect(self.recorder.state(page.visit.key), response.url)
        try:
            async for obj in result:
                if page.passes(obj):
                    yield obj
        except BaseException:
            page.abandon()
            raise
        page.end()


class _Page:
    """One page's output on its way out: its items hashed and tagged, its links filtered."""

    __slots__ = ("digests", "hints", "mw", "visit")

    def __init__(self, mw: RevisitMiddleware, visit: Visit, hints: dict[str, tuple[float | None, str | None]]) -> None:
        self.mw, self.visit, self.hints = mw, visit, hints
        self.digests: list[str] = []

    def passes(self, obj: Any) -> bool:
        if isinstance(obj, StoredItem):
            obj._page_key = self.visit.key
            self.visit.pending += 1
            self.digests.append(hashlib.sha1(_item_bytes(obj)).hexdigest())
            return True
        return not isinstance(obj, Request) or self.mw._goes_on(obj, self.hints)

    def abandon(self) -> None:
        self.mw.recorder.abandon(self.visit)  # the page is retried or buried: this visit did not happen

    def end(self) -> None:
        digests = self.digests
        content = hashlib.sha1("".join(sorted(digests)).encode()).hexdigest() if digests else ""
        self.mw.recorder.end(self.visit, content, ITEMS if digests else LISTING)


def _header(response: Any, name: bytes) -> str | None:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else None
