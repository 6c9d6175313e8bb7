"""Archive every response the spiders see (``ARCHIVE_ENABLED`` or ``ARCHIVE_URL``).

A downloader middleware at the very front (priority 1): its ``process_response`` runs last, so
it sees exactly what the spider will get, after redirects and retries, whether fetched
directly or through the scraping API (whose responses carry the ``scraping_api`` flag; the API
call itself never reaches any middleware). The request's callback and its plain meta are kept in
the index, so ``scrapy reprocess`` can hand the page to the same callback.
"""

from __future__ import annotations

import json
from http import HTTPStatus
import logging
from datetime import datetime, timezone
from typing import Any

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads

from ..queue.requests import _callback_name
from ..runs_hook import current_run_id
from ..scraping_api.middleware import FLAG as API_FLAG
from .config import read_config
from .store import store_for
from .writer import ArchiveWriter, Entry

logger = logging.getLogger(__name__)
_REASONS = {s.value: s.phrase for s in HTTPStatus}

# Meta that describes one download, not what the callback needs; "_" keys are private.
_TRANSIENT_META = ("_", "download_", "redirect_", "retry_", "callback_attempts", "proxy", "scraping_api",
                   "depth", "dont_", "handle_httpstatus_all", "ftp_", "cookiejar")


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
    def from_crawler(cls, crawler: Any) -> "ArchiveMiddleware":
        config = read_config(crawler.settings)
        if not config.enabled or crawler.settings.getbool("ARCHIVE_REPLAY"):
            raise NotConfigured  # off by default: no "Disabled" warning on every crawl
        store = store_for(config.url, str(crawler.settings.get("DATA_DIR") or ".data"), config.s3_endpoint)
        writer = ArchiveWriter(store, crawler.settings["DATABASE_URL"], config.retention_days, config.file_size,
                               config.file_age, stats=crawler.stats)
        writer.open()
        instance = cls(crawler, writer)
        crawler.signals.connect(instance.spider_closed, signal=signals.spider_closed)
        logger.info("Archiving every response to %s", config.url if config.url.startswith("s3://") else
                    f"the folder {config.url}")
        return instance

    async def spider_closed(self) -> None:
        # Drains the queue and closes (or uploads) the last file, off the reactor thread.
        await maybe_deferred_to_future(threads.deferToThread(self.writer.close))

    def process_response(self, request: Request, response: Response) -> Response:
        if request.meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt"):
            return response  # the robots.txt middleware's own fetch: no spider sees it
        spider = self.crawler.spider
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, values in response.headers.items() for v in values
        ]
        via_api = API_FLAG in response.flags
        self.writer.add(Entry(
            spider=spider.name,
            run_id=current_run_id(self.crawler),
            url=response.url,
            target_url=(request.meta.get("redirect_urls") or [request.url])[0],
            fingerprint=self.crawler.request_fingerprinter.fingerprint(request).hex(),
            fetched_at=datetime.now(timezone.utc),
            status=response.status,
            reason=_REASONS.get(response.status, ""),
            headers=headers,
            body=response.body,
            via="api" if via_api else "direct",
            provider=self.provider if via_api else None,
            request=replayable_request(request, spider, self._callbacks),
        ))
        return response
