"""What each page yielded, and in a revisit run, which links are worth a request.

For every page this middleware (close to the engine, after the canonical link was read) hashes
the items the callback yielded (the page's content as the spider reads it: markup that changes
without changing the items is no change) and tells the recorder (:mod:`.recorder`), so that the
page's interval is halved or grown. A sitemap's ``lastmod`` and ``changefreq`` (read from the
sitemap response, Scrapy's ``SitemapSpider`` or any callback parsing one) go with the requests
for their URLs.

In a revisit run (``REVISIT_DUE``, ``scrapy crawl SPIDER --due``) it also:

* queues, after the spider's own start requests, the known pages that are due by their own
  history (a page the sitemap speaks for waits for the sitemap's word), streamed from the
  database as the shared queue drains (``REVISIT_SEED_AHEAD``), never all at once;
* drops each link to a known page that is not due (``revisit/skipped``); links to pages never
  seen, listing pages (at ``REVISIT_LISTING_INTERVAL``) and ``dont_filter`` requests go on.

The states of a page's links are read together (one query for those not at hand, see
:mod:`.recorder`) before they are filtered; the page's items go on meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg2
from itemadapter import ItemAdapter
from scrapy import Request
from scrapy.http import TextResponse
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.sitemap import Sitemap
from twisted.internet import task

from ..adapters import engine
from ..config import get_int
from ..identity.canonical import canonical_link
from ..items.base import StoredItem
from .due_set import DueSet
from .recorder import RevisitRecorder, Visit, recorder_of
from .schedule import ITEMS, LISTING, PageState, due_without_sitemap, is_due, parse_lastmod

logger = logging.getLogger(__name__)

LASTMOD_META = "revisit_lastmod"
CHANGEFREQ_META = "revisit_changefreq"
HINTED_META = "revisit_hinted"
LINKS_AT_ONCE = 1000  # links of one page whose states are read by one query (a sitemap has 50,000)
SEED_CHECK = 100  # due pages queued between two looks at the shared queue's depth, at most


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    return isinstance(value, _SCALARS) or (
        type(value) is list and all(isinstance(v, _SCALARS) for v in value)  # noqa: E721
    )


def _item_bytes(item: Any) -> bytes:
    # The page's content digest, as stored: the same bytes for the same item whatever the path.
    # A stored item's values are plain as yielded (text, numbers, lists of text): its values
    # dict is then what ItemAdapter.asdict() rebuilds by checking every value for a nested item
    # (~10 checks a value: 45 µs of an item against 7 µs, measured on the demo's product).
    values = getattr(item, "_values", None)
    if isinstance(item, StoredItem) and all(_plain(v) for v in values.values()):
        fields = dict(values)
    else:
        fields = ItemAdapter(item).asdict()
    return json.dumps([type(item).__name__, fields], sort_keys=True, default=str).encode("utf-8")


class RevisitMiddleware:
    def __init__(self, crawler: Any, recorder: RevisitRecorder) -> None:
        self.crawler = crawler
        self.recorder = recorder
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.seed_ahead = get_int(crawler.settings, "REVISIT_SEED_AHEAD")

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
        recorder = self.recorder
        if not recorder.ready:
            return
        spider = self.crawler.spider
        queued, unknown = 0, 0
        # How often the queue's depth is looked at: a Redis round trip every few due pages, and
        # never more than a quarter of REVISIT_SEED_AHEAD queued past it.
        step = max(1, min(SEED_CHECK, self.seed_ahead // 4))
        due = DueSet(recorder.dsn, spider.name, recorder.now, recorder.schedule)
        try:
            async for key, state in due.stream():
                if state.fetched_at >= recorder.now or not due_without_sitemap(state, recorder.now, recorder.schedule):
                    continue  # visited by this run already, or left to the sitemap's word
                callback = getattr(spider, state.callback, None) if state.callback else None
                if state.callback and not callable(callback):
                    unknown += 1  # the spider no longer has that callback: found by links, or not at all
                    continue
                recorder.remember(key, state)  # its visit soon asks for it
                queued += 1
                yield Request(state.url, callback=callback)
                if queued % step == 0:
                    await self._room_to_seed()
        except psycopg2.Error as exc:
            # Those not queued are found by links (if due) or wait for the next revisit run.
            self.stats.set_value("revisit/due_unreadable", 1)
            logger.error("Could not read the pages due (%s): %d queued, the rest left out of this run", exc, queued)
        self.stats.set_value("revisit/seeded", queued)
        logger.info(
            "Revisit run: %d known page(s) due by their own history queued%s",
            queued,
            f"; {unknown} left out (their callback is gone from the spider)" if unknown else "",
        )

    async def _room_to_seed(self) -> None:
        """Wait while the shared queue holds ``REVISIT_SEED_AHEAD`` requests: the due pages go to
        it as it drains, not all at the start (a million due pages would be a million queue
        entries in Redis, and as many states read ahead of their fetch)."""
        from twisted.internet import reactor

        scheduler = engine.scheduler(self.crawler)
        if scheduler is None:
            return
        while True:
            try:
                if len(scheduler) < self.seed_ahead:
                    return
            except Exception:  # the queue cannot say (Redis away): its own retries cope
                return
            await maybe_deferred_to_future(task.deferLater(reactor, 0.2, lambda: None))

    # -- each page -------------------------------------------------------------------------------
    def _page_key(self, response: Any) -> tuple[bytes, str]:
        request = response.request
        canonical = canonical_link(response) if request.method == "GET" else None
        if canonical is not None:
            url = self.fingerprinter.policy.apply(canonical)
            return self.fingerprinter.url_fingerprint(url, request), url
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

    def _goes_on(
        self,
        request: Request,
        hints: dict[str, tuple[float | None, str | None]],
        states: Mapping[bytes, PageState | None] | None = None,
    ) -> bool:
        """Whether a link goes to the queue; *states*: those read for the page's links (else
        those at hand)."""
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
        key = self.fingerprinter.fingerprint(request)
        state = states.get(key) if states is not None else recorder.state(key)
        if state is None:
            return True
        if lastmod is not None and lastmod > state.fetched_at and state.kind == ITEMS:
            request.meta[HINTED_META] = True
        if not recorder.due_run:
            return True
        if state.fetched_at >= recorder.now:
            # Visited in this run already (a seeded page can be read before the sitemap that
            # also links it): a duplicate, not a page skipped as not due.
            return False
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
        recorder = self.recorder
        if recorder.due_run:
            # The items the page had are the run's to mark gone if unseen (see .recorder).
            await recorder.resolve(page.visit)
            await recorder.expect(page.visit.old, response.url)
        # Links wait for their states only where those decide: in a revisit run, or for a sitemap's hints.
        hold = recorder.due_run or bool(page.hints)
        held: list[Request] = []
        try:
            async for obj in result:
                if hold and isinstance(obj, Request) and not obj.dont_filter:
                    held.append(obj)
                    if len(held) >= LINKS_AT_ONCE:
                        for request in await page.links(held):
                            yield request
                        held = []
                elif page.passes(obj):
                    yield obj
            if held:
                for request in await page.links(held):
                    yield request
        except Exception:
            page.abandon()
            # The links read before the callback failed go on, as they would have unheld.
            if held:
                for request in await page.links(held):
                    yield request
            raise
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

    async def links(self, requests: list[Request]) -> list[Request]:
        """Those of *requests* that go on, their states read together (one query at most)."""
        mw = self.mw
        fingerprint = mw.fingerprinter.fingerprint
        found = await mw.recorder.lookup([fingerprint(r) for r in requests])
        return [r for r in requests if mw._goes_on(r, self.hints, found)]

    def abandon(self) -> None:
        self.mw.recorder.abandon(self.visit)  # the page is retried or buried: this visit did not happen

    def end(self) -> None:
        digests = self.digests
        content = hashlib.sha1("".join(sorted(digests)).encode()).hexdigest() if digests else ""
        self.mw.recorder.end(self.visit, content, ITEMS if digests else LISTING)


def _header(response: Any, name: bytes) -> str | None:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else None
