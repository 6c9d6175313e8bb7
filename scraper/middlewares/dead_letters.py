"""Send requests that keep failing to the dead-letter queue (see :mod:`scraper.queue.dead_letters`).

Two components, because failures surface in two places:

* ``DeadLetterDownloaderMiddleware`` (downloader, just outside Scrapy's RetryMiddleware): a
  download that still fails, or still answers a retryable status, once RetryMiddleware has
  given up; a failure RetryMiddleware does not retry at all (not in ``RETRY_EXCEPTIONS``) at
  once; an exception that names its own reason (``dead_letter_reason``, e.g. the scraping API's
  ``api:403:BLOCKED_BY_ANTIBOT``) at once, with that reason;
* ``DeadLetterSpiderMiddleware`` (spider): a callback that raises is tried again
  ``DLQ_CALLBACK_RETRIES`` times (1), then set aside. Nothing is retried in a hot loop.
"""

from __future__ import annotations

import logging
import re
import weakref
from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.misc import load_object

from ..backends.redis_client import UNREACHABLE, get_redis
from ..config import get_int
from ..queue.dead_letters import DeadLetters
from ..queue.leases import lease_abandoned

logger = logging.getLogger(__name__)

ATTEMPTS_META = "callback_attempts"
REASON_CLASS = re.compile(r"[\s:]")


# The dead-letter store of each crawl, made when its first dead letter comes (kept here, by
# crawler, rather than on the crawler: no component reads another's private state).
_STORES: weakref.WeakKeyDictionary[Any, DeadLetters] = weakref.WeakKeyDictionary()


def _dead_letters(crawler: Any) -> DeadLetters:
    store = _STORES.get(crawler)
    if store is None:
        store = _STORES[crawler] = DeadLetters(get_redis(crawler.settings["REDIS_URL"]), crawler.spider)
    return store


def bury(crawler: Any, request: Request, reason: str, attempts: int) -> None:
    """Make *request* a dead letter, counted as ``dead_letters/<reason's first word>`` (``api``
    for ``api:403:BLOCKED_BY_ANTIBOT``).

    If Redis is unreachable the request is not lost: its lease is abandoned, so that it is
    delivered again (and fails again, or not) once Redis is back."""
    try:
        _dead_letters(crawler).add(request, reason, attempts)
    except UNREACHABLE as exc:
        crawler.signals.send_catch_log(signal=lease_abandoned, request=request)
        logger.warning(
            "Redis unreachable (%s): %s (%s) will be fetched again instead of becoming a dead letter now",
            type(exc).__name__,
            request.url,
            reason,
        )
        return
    crawler.stats.inc_value("dead_letters/count")
    crawler.stats.inc_value(f"dead_letters/{REASON_CLASS.split(reason, maxsplit=1)[0]}")
    logger.warning("Dead letter: %s (%s after %d attempts)", request.url, reason, attempts)


class DeadLetterDownloaderMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self.max_retries = settings.getint("RETRY_TIMES")
        self.retry_codes = {int(c) for c in settings.getlist("RETRY_HTTP_CODES")}
        self.retry_enabled = settings.getbool("RETRY_ENABLED")
        self.retry_exceptions = tuple(
            load_object(x) if isinstance(x, str) else x for x in settings.getlist("RETRY_EXCEPTIONS")
        )

    @classmethod
    def from_crawler(cls, crawler: Any) -> DeadLetterDownloaderMiddleware:
        return cls(crawler)

    def _gave_up(self, request: Request) -> bool:
        if request.meta.get("dont_retry") or not self.retry_enabled:
            return True
        limit = request.meta.get("max_retry_times", self.max_retries)
        return request.meta.get("retry_times", 0) >= limit

    def process_response(self, request: Request, response: Response) -> Response:
        if response.status in self.retry_codes and self._gave_up(request):
            self._bury(request, f"http {response.status}")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if isinstance(exception, IgnoreRequest):
            return None  # dropped on purpose (robots.txt, offsite, a stopping crawl), not failed
        reason = getattr(exception, "dead_letter_reason", None)
        if reason:
            # A failure that explains itself: one line, not Scrapy's "Error downloading" traceback.
            logger.warning("%s", exception)
            self._bury(request, str(reason))
            raise IgnoreRequest(f"dead letter ({reason}): {exception}")
        elif self._gave_up(request) or not isinstance(exception, self.retry_exceptions):
            self._bury(request, f"download {type(exception).__name__}")

    def _bury(self, request: Request, reason: str) -> None:
        if request.callback is NO_CALLBACK:
            # A component's own request (robots.txt, a media download): the component that
            # made it handles its failure; as a dead letter it would be requeued to no callback.
            return
        bury(self.crawler, request, reason, request.meta.get("retry_times", 0) + 1)


class DeadLetterSpiderMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.callback_retries = get_int(crawler.settings, "DLQ_CALLBACK_RETRIES", 1, minimum=0)

    @classmethod
    def from_crawler(cls, crawler: Any) -> DeadLetterSpiderMiddleware:
        return cls(crawler)

    def process_spider_exception(self, response: Response, exception: Exception) -> Any:
        if isinstance(exception, HttpError):
            return None  # HttpErrorMiddleware's business; retried statuses are buried downstream
        request = response.request
        attempts = request.meta.get(ATTEMPTS_META, 0) + 1
        if attempts <= self.callback_retries:
            self.crawler.stats.inc_value("dead_letters/callback_retries")
            retry = request.replace(dont_filter=True)
            retry.meta[ATTEMPTS_META] = attempts
            return [retry]
        bury(self.crawler, request, f"callback {type(exception).__name__}: {str(exception)[:200]}", attempts)
        return None  # still logged by Scrapy as a spider error
