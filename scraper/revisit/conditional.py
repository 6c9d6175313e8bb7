"""Conditional revisits: in a revisit run, a page fetched before is asked for again only if it
changed.

A revisit run's request to a known page carries its validators (``If-None-Match`` with the ``ETag``,
``If-Modified-Since`` with the ``Last-Modified`` it last answered). A ``304 Not Modified`` goes no
further: the page is unchanged, its items are claimed as seen in this run (so gone-marking keeps
them) and their ``last_seen`` refreshed, its interval grows (:mod:`.recorder`). A known page that
answers ``404`` or ``410`` has its items expected in a revisit run, so they are marked gone.

Through a scraping API the validators go to the target as request headers (AlterLab: the
``headers`` option; ScrapingBee: ``Spb-`` forwarded headers; Zyte API: ``customHttpRequestHeaders``,
HTTP requests only, a browser request takes none), and the target's ``304`` comes back as its
status. A 304 through an API is still a billed call: the schedule (:mod:`.due`), not the
validators, is what saves requests.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from .due import HINTED_META, LASTMOD_META
from .recorder import RevisitRecorder, recorder_of
from .schedule import ITEMS

CONDITIONAL_META = "revisit_conditional"
_OWN = (b"If-None-Match", b"If-Modified-Since")


class NotModified(IgnoreRequest):
    """The page answered 304: nothing to parse, its items are still there."""


class ConditionalRequestsMiddleware:
    def __init__(self, crawler: Any, recorder: RevisitRecorder) -> None:
        self.recorder = recorder
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter

    @classmethod
    def from_crawler(cls, crawler: Any) -> ConditionalRequestsMiddleware:
        return cls(crawler, recorder_of(crawler))

    async def process_request(self, request: Request) -> None:
        # A full crawl re-reads every page: after a spider's fix, a new field, a table emptied by
        # hand, a 304 would keep the old reading. Only a revisit run asks conditionally.
        if not self.recorder.due_run or not self.recorder.ready or request.method not in ("GET", "HEAD"):
            return
        if any(name in request.headers for name in _OWN):
            return  # the spider's own validators: its business
        key = self.fingerprinter.fingerprint(request)
        # At hand when this node queued it (a due page, a link); read by key when another did.
        state = (await self.recorder.lookup([key])).get(key)
        if state is None or state.kind != ITEMS or not (state.etag or state.last_modified):
            return
        if state.etag:
            request.headers[b"If-None-Match"] = state.etag
        if state.last_modified:
            request.headers[b"If-Modified-Since"] = state.last_modified
        request.meta[CONDITIONAL_META] = key
        self.stats.inc_value("revisit/conditional")

    async def process_response(self, request: Request, response: Response) -> Response:
        key = request.meta.get(CONDITIONAL_META)
        if response.status == 304 and key is not None:
            hinted = bool(request.meta.get(HINTED_META))
            await self.recorder.not_modified(key, request.url, hinted, request.meta.get(LASTMOD_META))
            raise NotModified(f"not modified since the last visit: {request.url}")
        if response.status in (404, 410) and self.recorder.ready:
            await self.recorder.gone(key or self.fingerprinter.fingerprint(request), request.url)
        return response
