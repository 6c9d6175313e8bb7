"""Replay archived responses through today's callbacks and item pipeline, with no network.

Used by ``scrapy reprocess`` (which sets ``ARCHIVE_REPLAY``): the command picks the records,
:class:`ReplaySpiderMiddleware` hands them to the spider (the spider's own ``start`` is not
called) and keeps the links the callbacks find from being fetched,
:class:`ReplayDownloaderMiddleware` answers every request from the archive and refuses any
other, and :class:`ReplayProgress` logs pages/s and an ETA.

The records go straight to the engine's scraper (:mod:`.direct`, read in batches); with
``crawler.replay_direct`` off they are the crawl's start requests instead, through Scrapy's
scheduler and downloader, as replays were first made (the reference the direct path is tested
against).
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

from .direct import LOADED_META, DirectReplay
from .reader import parse_record
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


_COLUMNS = (
    "id, url, target_url, fetched_at, file, record_offset, record_length, payload_file, payload_offset,"
    " payload_length, request, fingerprint"
)


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
            f"SELECT DISTINCT ON (fingerprint) {_COLUMNS} FROM archive_index"
            f" WHERE {' AND '.join(where)} ORDER BY fingerprint, fetched_at DESC, id DESC",
            params,
        )
        records = [Record(*row) for row in cur.fetchall()]
    if url_glob:
        records = [
            r for r in records if fnmatch.fnmatchcase(r.url, url_glob) or fnmatch.fnmatchcase(r.target_url, url_glob)
        ]
    return sorted(records, key=lambda r: r.id)


def records_by_id(conn: Any, ids: list[int]) -> list[Record]:
    """The records *ids* name (a worker's share of a replay), in index order."""
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM archive_index WHERE id = ANY(%s) ORDER BY id", (ids,))
        return [Record(*row) for row in cur.fetchall()]


def load(store: Store, record: Record) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of *record*; a revisit's body comes from the record it points at."""
    return parse_record(store, record)


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


class Unreadable:
    """Says which archive files and records a replay cannot read: each file once, the first
    records one by one, the rest counted. One per replay: a replay split over processes sends
    its workers' reports to the one in the command (:mod:`.workers`)."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.records = 0

    def file(self, name: str, error: str) -> None:
        if name in self.files:
            return
        self.files.add(name)
        logger.warning(
            "reprocess: cannot read %s from the archive (%s); its damaged records are skipped, every good one is "
            "replayed",
            name,
            error,
        )

    def record(self, url: str, name: str, start: int, end: int) -> None:
        self.records += 1
        if self.records <= BAD_RECORDS_NAMED:
            logger.warning("reprocess: skipped %s: its record at %s bytes %d-%d cannot be read", url, name, start, end)
        elif self.records == BAD_RECORDS_NAMED + 1:
            logger.warning(
                "reprocess: more unreadable records: the rest are counted, not named (stat reprocess/unreadable)"
            )


class ReplayDownloaderMiddleware:
    """First of all downloader middlewares: no request ever reaches the network."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.store: Store = crawler.replay_store
        self.unreadable: Unreadable = getattr(crawler, "replay_unreadable", None) or Unreadable()

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
            # Read ahead in a batch by the direct replay; else here, alone.
            loaded = request.meta.pop(LOADED_META, None)
            if loaded is None:
                loaded = await maybe_deferred_to_future(threads.deferToThread(load, self.store, record))
            elif isinstance(loaded, Exception):
                raise loaded
            status, headers, body = loaded
        except Exception as exc:  # gone since the replay began (pruned), or damaged: skip the page
            self.crawler.stats.inc_value("reprocess/unreadable")
            self.unreadable.file(record.file, f"{type(exc).__name__}: {exc}")
            end = record.record_offset + record.record_length
            self.unreadable.record(record.url, record.file, record.record_offset, end)
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
        if getattr(self.crawler, "replay_direct", True):
            # The engine waits for its start requests until this returns: it stays open meanwhile.
            await DirectReplay(self.crawler, self.records, lambda record: replay_request(record, spider)).run()
            return
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
    """One line every few seconds, and a last one: pages replayed, pages/s, ETA. The last one's
    rate is over the whole replay, from the spider's opening until every page's items are done.

    In a worker of a replay split over processes (``crawler.replay_report``), the figures go to
    the command instead, which says them for the whole replay."""

    def __init__(self, crawler: Any, interval: float = 5.0) -> None:
        self.crawler = crawler
        self.total = len(crawler.replay_records)
        self.report = getattr(crawler, "replay_report", None)
        self.interval = 1.0 if self.report is not None else interval
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
        if self.report is not None:
            self.report.send(opened=time.time())
        self.loop.start(self.interval, now=False)

    def closed(self) -> None:
        if self.loop.running:
            self.loop.stop()
        if self.report is not None:
            self.report.send(closed=time.time())
        self.log()

    def done(self) -> int:
        return int(self.crawler.stats.get_value("reprocess/pages", 0))

    def line(self) -> str:
        return progress_line(self.done(), self.total, time.monotonic() - self.started)

    def log(self) -> None:
        if self.report is not None:
            self.report.send(progress=self.done())
        else:
            logger.info("%s", self.line())


def progress_line(done: int, total: int, elapsed: float) -> str:
    rate = done / max(elapsed, 1e-6)
    eta = (total - done) / rate if rate else float("inf")
    return f"reprocess: {done}/{total} pages, {rate:.0f} pages/s, ETA {'-' if eta == float('inf') else f'{eta:.0f} s'}"
