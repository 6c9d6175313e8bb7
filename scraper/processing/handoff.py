"""A fetcher hands each response to the stream instead of calling the spider (``PROCESSING=decoupled``).

A downloader middleware at the very front (priority 0), so its ``process_response`` runs last,
after the archive's: it sees exactly the response the spider would get. Once ``XADD`` returned
the response is in Redis, and the request's callback becomes a no-op: the engine then finishes
the request, and the scheduler acknowledges its lease as for any other. If Redis is away the lease
is abandoned instead, and the page is fetched again later: never acknowledged, never lost.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK

from ..backends.redis_client import UNREACHABLE, get_redis
from ..queue.leases import lease_abandoned
from ..queue.serializer import SerializationError
from ..runs_hook import current_run_id
from . import entry
from .config import read_config
from .stream import ResponseStream

logger = logging.getLogger(__name__)


def _handed_off(response: Response, **kwargs: Any) -> list[Any]:
    return []


class HandoffMiddleware:
    def __init__(self, crawler: Any, stream: ResponseStream) -> None:
        self.crawler = crawler
        self.stream = stream
        self._callbacks: dict[Any, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> HandoffMiddleware:
        if not read_config(crawler.settings).fetcher:
            raise NotConfigured  # inline processing (the default) or a processor: no warning
        stream = ResponseStream(get_redis(crawler.settings["REDIS_URL"]), crawler.spidercls.name)
        stream.ensure_group()
        logger.info(
            "PROCESSING=decoupled: responses go to the stream %s for `scrapy process %s`",
            stream.key,
            crawler.spidercls.name,
        )
        return cls(crawler, stream)

    def process_response(self, request: Request, response: Response) -> Response:
        if request.callback is NO_CALLBACK:
            return response  # a component's own request (robots.txt): no spider sees it
        stats = self.crawler.stats
        try:
            fields = entry.encode(request, response, self.crawler.spider, current_run_id(self.crawler), self._callbacks)
        except SerializationError as exc:
            # The shared queue could not have held it either: processed here, as inline.
            stats.inc_value("processing/not_handed_off")
            logger.warning("Processing %s here, not in a processor: %s", request.url, exc)
            return response
        try:
            self.stream.add(fields)
        except UNREACHABLE as exc:
            self.crawler.signals.send_catch_log(signal=lease_abandoned, request=request)
            stats.inc_value("processing/handoff_errors")
            raise IgnoreRequest(
                f"Redis unreachable ({type(exc).__name__}): {request.url} is fetched again later"
            ) from None
        stats.inc_value("processing/handed_off")
        stats.inc_value("processing/handed_off_bytes", len(fields["m"]) + len(fields["b"]))
        request.callback = _handed_off
        request.errback = None
        # Whatever the status, the processor decides (its HttpErrorMiddleware, its errback).
        request.meta["handle_httpstatus_all"] = True
        return response
