"""Replay archived responses through today's callbacks and item pipeline, with no network.

Used by ``scrapy reprocess`` (which sets ``ARCHIVE_REPLAY``): the command picks the records,
:class:`ReplaySpiderMiddleware` turns them into the crawl's only requests (the spider's own
``start`` is not called) and keeps the links the callbacks find from being fetched,
:class:`ReplayDownloaderMiddleware` answers every request from the archive and refuses any
other, and :class:`ReplayProgress` logs pages/s and an ETA.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Headers
from scrapy.responsetypes import responsetypes
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task, threads

from . import warc
from .store import Store

logger = logging.getLogger(__name__)
RECORD_META = "_archive_record"


@dataclass
class Record:
    id: int
    url: str
    target_url: str
    fetched_at: datetime
    file: str
    record_offset: int
    record_length: int
    payload_file: str
    payload_offset: int
    payload_length: int
    request: dict[str, Any]
    fingerprint: str


def select_records(
    conn: Any,
    spider: str,
    run_id: int | None = None,
    since: datetime | None = None,
    url_glob: str | None = None,
    files: set[str] | None = None,
) -> list[Record]:
    """The latest archived version of each page of *spider* matching the filters; with *files*,
    the latest of the versions whose bytes are in those files (one archive's)."""
    where, params = ["spider = %s"], [spider]
    if files is not None:
        where.append("file = ANY(%s) AND payload_file = ANY(%s)")
        params += [sorted(files), sorted(files)]
    if run_id is not None:
        where.append("run_id = %s")
        params.append(run_id)
    if since is not None:
        where.append("fetched_at >= %s")
        params.append(since)
    with conn, conn.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT ON (fingerprint) id, url, target_url, fetched_at, file, record_offset,"
            " record_length, payload_file, payload_offset, payload_length, request, fingerprint FROM archive_index"
            f" WHERE {' AND '.join(where)} ORDER BY fingerprint, fetched_at DESC, id DESC",
            params,
        )
        records = [Record(*row) for row in cur.fetchall()]
    if url_glob:
        records = [
            r for r in records if fnmatch.fnmatchcase(r.url, url_glob) or fnmatch.fnmatchcase(r.target_url, url_glob)
        ]
    return sorted(records, key=lambda r: r.id)


def load(store: Store, record: Record) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of *record*; a revisit's body comes from the record it points at."""
    kind, status, headers, body = warc.read_record(store.read(record.file, record.record_offset, record.record_length))
    if kind == "revisit":
        _, _, _, body = warc.read_record(store.read(record.payload_file, record.payload_offset, record.payload_length))
    return status, headers, body


def replay_request(record: Record, spider: Any) -> Request:
    saved = record.request
    callback = getattr(spider, saved["callback"], None) if saved.get("callback") else None
    meta = {**saved.get("meta", {}), RECORD_META: record}
    # The target URL, as the spider asked for it; the response is the final URL's.
    return Request(
        record.target_url,
        callback=callback,
        method=saved.get("method", "GET"),
        cb_kwargs=saved.get("cb_kwargs") or {},
        meta=meta,
        dont_filter=True,
    )


BAD_RECORDS_NAMED = 20  # unreadable records named one by one in the log; the rest are counted


class ReplayDownloaderMiddleware:
    """First of all downloader middlewares: no request ever reaches the network."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.store: Store = crawler.replay_store
        self._unreadable: set[str] = set()  # files already reported
        self._bad_records = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> ReplayDownloaderMiddleware:
        if not crawler.settings.getbool("ARCHIVE_REPLAY") or not hasattr(crawler, "replay_store"):
            raise NotConfigured("not replaying")
        return cls(crawler)

    async def process_request(self, request: Request) -> Any:
        record: Record | None = request.meta.get(RECORD_META)
        if record is None:
            self.crawler.stats.inc_value("reprocess/refused")
            raise IgnoreRequest(f"not in the archive being replayed: {request.url}")
        try:
            status, headers, body = await maybe_deferred_to_future(threads.deferToThread(load, self.store, record))
        except Exception as exc:  # gone since the replay began (pruned), or damaged: skip the page
            self.crawler.stats.inc_value("reprocess/unreadable")
            if record.file not in self._unreadable:
                self._unreadable.add(record.file)
                logger.warning(
                    "reprocess: cannot read %s from the archive (%s: %s); its damaged records are "
                    "skipped, every good one is replayed",
                    record.file,
                    type(exc).__name__,
                    exc,
                )
            self._bad_records += 1
            if self._bad_records <= BAD_RECORDS_NAMED:
                logger.warning(
                    "reprocess: skipped %s: its record at %s bytes %d-%d cannot be read",
                    record.url,
                    record.file,
                    record.record_offset,
                    record.record_offset + record.record_length,
                )
            elif self._bad_records == BAD_RECORDS_NAMED + 1:
                logger.warning(
                    "reprocess: more unreadable records: the rest are counted, not named (stat reprocess/unreadable)"
                )
            raise IgnoreRequest(f"archive record unreadable: {record.url}") from None
        scrapy_headers = Headers()
        for name, value in headers:
            scrapy_headers.appendlist(name, value)
        cls = responsetypes.from_args(headers=scrapy_headers, url=record.url, body=body)
        self.crawler.stats.inc_value("reprocess/pages")
        return cls(url=record.url, status=status, headers=scrapy_headers, body=body, request=request, flags=["archive"])


class ReplaySpiderMiddleware:
    """Feeds the archived pages in, and keeps links found from being fetched (``--follow``
    collects the new ones for the shared queue instead)."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.records: list[Record] = crawler.replay_records
        self.follow: bool = crawler.settings.getbool("ARCHIVE_REPLAY_FOLLOW")
        self.found: dict[str, Request] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> ReplaySpiderMiddleware:
        if not crawler.settings.getbool("ARCHIVE_REPLAY") or not hasattr(crawler, "replay_records"):
            raise NotConfigured("not replaying")
        instance = cls(crawler)
        crawler.replay_found = instance.found
        return instance

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        spider = self.crawler.spider
        for record in self.records:
            yield replay_request(record, spider)

    def _keep(self, obj: Any) -> bool:
        if not isinstance(obj, Request):
            return True
        self.crawler.stats.inc_value("reprocess/links_not_fetched")
        if self.follow:
            self.found.setdefault(obj.url, obj)
        return False

    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in result:
            if self._keep(obj):
                yield obj

    def process_spider_output(self, response: Any, result: Iterable[Any]) -> Iterable[Any]:
        for obj in result:
            if self._keep(obj):
                yield obj


class ReplayProgress:
    """One line every few seconds, and a last one: pages replayed, pages/s, ETA."""

    def __init__(self, crawler: Any, interval: float = 5.0) -> None:
        self.crawler = crawler
        self.total = len(crawler.replay_records)
        self.interval = interval
        self.started = time.monotonic()
        self.loop = task.LoopingCall(self.log)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ReplayProgress:
        if not crawler.settings.getbool("ARCHIVE_REPLAY") or not hasattr(crawler, "replay_records"):
            raise NotConfigured("not replaying")
        ext = cls(crawler)
        crawler.signals.connect(ext.opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.closed, signal=signals.spider_closed)
        return ext

    def opened(self) -> None:
        self.started = time.monotonic()
        self.loop.start(self.interval, now=False)

    def closed(self) -> None:
        if self.loop.running:
            self.loop.stop()
        self.log()

    def line(self) -> str:
        done = self.crawler.stats.get_value("reprocess/pages", 0)
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate else float("inf")
        return (
            f"reprocess: {done}/{self.total} pages, {rate:.0f} pages/s, "
            f"ETA {'-' if eta == float('inf') else f'{eta:.0f} s'}"
        )

    def log(self) -> None:
        logger.info("%s", self.line())
