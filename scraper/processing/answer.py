"""A processor's downloader: every request is answered from its stream entry, none reaches the network.

Placed just after the Postgres backpressure (priority 10), so that a processor whose database is
away takes no more entries in hand than its downloads in flight, and before every middleware
that would fetch (``scrapy process`` turns those off as well).
"""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response

from .config import read_config
from .scheduler import ENTRY_META


class StreamAnswerMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamAnswerMiddleware:
        if not read_config(crawler.settings).processor:
            raise NotConfigured
        return cls(crawler)

    def process_request(self, request: Request) -> Response:
        entry_id = request.meta.get(ENTRY_META)
        payloads = getattr(self.crawler, "stream_payloads", {})
        decoded = payloads.pop(entry_id, None) if entry_id else None
        if decoded is None:
            self.crawler.stats.inc_value("processing/refused")
            raise IgnoreRequest(f"a processor fetches nothing: {request.url}")
        self.crawler.stats.inc_value("processing/responses")
        return decoded.to_response(request)
