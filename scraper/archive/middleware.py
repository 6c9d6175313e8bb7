"""Archive every response the spiders see (``ARCHIVE_ENABLED`` or ``ARCHIVE_URL``).

A downloader middleware at the very front (priority 1): its ``process_response`` runs last, so
it sees exactly what the spider will get, after redirects and retries, whether fetched
directly or through the scraping API (whose responses carry the ``scraping_api`` flag; the API
call itself never reaches any middleware). The request's callback and its plain meta are kept in
the index, so ``scrapy reprocess`` can hand the page to the same callback.

``ARCHIVE_REQUIRED=true``: a page goes on to the spider only once its record is on disk. When
the archive fails, the page is not acknowledged (its lease runs out and it is fetched again by a
later run), and the crawl stops with ``archive_failed`` (exit 5): a crawl that must keep its raw
pages does not go on without them.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet import threads
from twisted.internet.defer import Deferred

from ..queue.leases import lease_abandoned
from ..queue.requests import _callback_name
from ..rendering import RENDERED_FLAG
from ..runs_hook import current_run_id
from ..scraping_api.middleware import FLAG as API_FLAG
from .config import read_config
from .store import store_for
from .writer import ArchiveWriter, Entry

logger = logging.getLogger(__name__)
_REASONS = {s.value: s.phrase for s in HTTPStatus}

# Meta that describes one download, not what the callback needs; "_" keys are private.
_TRANSIENT_META = (
    "_",
    "download_",
    "redirect_",
    "retry_",
    "callback_attempts",
    "proxy",
    "scraping_api",
    "depth",
    "dont_",
    "handle_httpstatus_all",
    "ftp_",
    "cookiejar",
)


def replayable_request(request: Request, spider: Any, cache: dict[Any, str]) -> dict[str, Any]:
    """What a replay needs to call the same callback the same way: JSON only, no headers."""
    try:
        callback = _callback_name(spider, request.callback, cache)
    except Exception:
        callback = None  # not a spider method: replayed through the spider's default callback
    meta = {}
    for key, value in request.meta.items():
        if key.startswith(_TRANSIENT_META) and key != "scraping_api_extraction":
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        meta[key] = value
    cb_kwargs = request.cb_kwargs
    try:
        json.dumps(cb_kwargs)
    except (TypeError, ValueError):
        cb_kwargs = {}
    return {"method": request.method, "callback": callback, "cb_kwargs": cb_kwargs, "meta": meta}


class ArchiveMiddleware:
    def __init__(self, crawler: Any, writer: ArchiveWriter) -> None:
        self.crawler = crawler
        self.writer = writer
        self.provider = str(crawler.settings.get("SCRAPING_API_PROVIDER") or "alterlab")
        self._callbacks: dict[Any, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> ArchiveMiddleware:
        config = read_config(crawler.settings)
        if not config.enabled or crawler.settings.getbool("ARCHIVE_REPLAY"):
            raise NotConfigured  # off by default: no "Disabled" warning on every crawl
        store = store_for(config.url, str(crawler.settings.get("DATA_DIR") or ".data"), config.endpoint)
        writer = ArchiveWriter(
            store,
            crawler.settings["DATABASE_URL"],
            config.retention_days,
            config.file_size,
            config.file_age,
            stats=crawler.stats,
        )
        writer.open()
        instance = (RequiredArchiveMiddleware if config.required else cls)(crawler, writer)
        crawler.signals.connect(instance.spider_closed, signal=signals.spider_closed)
        logger.info(
            "Archiving every response to %s",
            config.url if config.url.startswith(("s3://", "gs://")) else f"the folder {config.url}",
        )
        return instance

    async def spider_closed(self) -> None:
        # Drains the queue and closes (or uploads) the last file, off the reactor thread.
        await maybe_deferred_to_future(threads.deferToThread(self.writer.close))

    def process_response(self, request: Request, response: Response) -> Response:
        entry = self._entry(request, response)
        if entry is not None:
            self.writer.add(entry)
        return response

    def _entry(self, request: Request, response: Response) -> Entry | None:
        if request.meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt"):
            return None  # the robots.txt middleware's own fetch: no spider sees it
        spider = self.crawler.spider
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, values in response.headers.items() for v in values]
        via_api = API_FLAG in response.flags
        return Entry(
            spider=spider.name,
            run_id=current_run_id(self.crawler),
            url=response.url,
            target_url=(request.meta.get("redirect_urls") or [request.url])[0],
            fingerprint=self.crawler.request_fingerprinter.fingerprint(request).hex(),
            fetched_at=datetime.now(UTC),
            status=response.status,
            reason=_REASONS.get(response.status, ""),
            headers=headers,
            body=response.body,
            via="api" if via_api else "rendered" if RENDERED_FLAG in response.flags else "direct",
            provider=self.provider if via_api else None,
            request=replayable_request(request, spider, self._callbacks),
        )


class RequiredArchiveMiddleware(ArchiveMiddleware):
    """``ARCHIVE_REQUIRED``: hands a page on only once its record is on disk."""

    def __init__(self, crawler: Any, writer: ArchiveWriter) -> None:
        super().__init__(crawler, writer)
        self._stopping = False

    async def process_response(self, request: Request, response: Response) -> Response:  # type: ignore[override]
        entry = self._entry(request, response)
        if entry is None:
            return response
        if self.writer.failed:
            self.writer.count_not_archived(1)
            self._refuse(request)
        from twisted.internet import reactor

        written: Deferred[bool] = Deferred()
        entry.done = lambda ok: reactor.callFromThread(written.callback, ok)
        self.writer.add(entry)
        if not await maybe_deferred_to_future(written):
            self._refuse(request)
        return response

    def _refuse(self, request: Request) -> None:
        """Not archived: not acknowledged (fetched again by a later run), and the crawl stops."""
        self.crawler.signals.send_catch_log(signal=lease_abandoned, request=request)
        if not self._stopping:
            self._stopping = True
            logger.error(
                "ARCHIVE_REQUIRED: the archive failed (%s), so the crawl stops (archive_failed, exit 5). "
                "Pages not archived are not acknowledged: the next run fetches them again once the "
                "archive's storage is fixed",
                self.writer.error,
            )
            deferred_from_coro(self.crawler.engine.close_spider_async(reason="archive_failed")).addErrback(
                lambda f: logger.error("Could not stop the crawl: %s", f.value)
            )
        raise IgnoreRequest(f"not archived (ARCHIVE_REQUIRED): {request.url}")
