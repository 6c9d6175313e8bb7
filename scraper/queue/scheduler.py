"""The shared scheduler: scrapy-redis' Scheduler, made safe for a fleet.

What differs from scrapy-redis' own:

* the queue and the seen-set always persist: one node closing never wipes them for the others;
  they are dropped only by the last node out of a crawl that *finished* (queue drained), so a
  stopped crawl resumes where it left off and a finished one can be run again;
* requests are JSON (see :mod:`scraper.queue.serializer`), never pickle;
* a request that cannot be queued is one clear error naming spider and callback, not a crash;
* the dupefilter uses Scrapy's ``REQUEST_FINGERPRINTER_CLASS`` and a local pre-check;
* one Redis connection pool per process, shared with the other components.

Settings: ``SCHEDULER_QUEUE_CLASS``, ``SCHEDULER_SERIALIZER``, ``SCHEDULER_FLUSH_ON_START``,
``SCHEDULER_DUPEFILTER_LOCAL_CACHE``, ``SCHEDULER_IDLE_TIMEOUT`` (see :mod:`scraper.extensions.idle_close`).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler

from ..config import get_bool, get_int
from ..redis_client import get_redis
from . import keys
from .dupefilter import SharedDupeFilter
from .nodes import NodeRegistry
from .queues import RequestSerializationError

logger = logging.getLogger(__name__)


class SharedScheduler(Scheduler):
    @classmethod
    def from_crawler(cls, crawler: Any) -> "SharedScheduler":
        settings = crawler.settings
        instance = cls(
            server=get_redis(settings["REDIS_URL"]),
            persist=True,
            flush_on_start=get_bool(settings, "SCHEDULER_FLUSH_ON_START", False),
            queue_key=settings.get("SCHEDULER_QUEUE_KEY") or "%(spider)s:requests",
            queue_cls=settings.get("SCHEDULER_QUEUE_CLASS") or "scraper.queue.queues.PriorityQueue",
            dupefilter_key=settings.get("SCHEDULER_DUPEFILTER_KEY") or "%(spider)s:dupefilter",
            serializer=importlib.import_module(settings.get("SCHEDULER_SERIALIZER") or "scraper.queue.serializer"),
        )
        instance.crawler = crawler
        instance.stats = crawler.stats
        instance.local_cache_size = get_int(settings, "SCHEDULER_DUPEFILTER_LOCAL_CACHE", 200_000, minimum=0)
        instance.debug = settings.getbool("DUPEFILTER_DEBUG")
        instance.prefetch = get_int(settings, "SCHEDULER_PREFETCH", 4, minimum=1)
        return instance

    def open(self, spider: Spider) -> None:
        self.df = SharedDupeFilter(
            self.server,
            key=self.dupefilter_key % {"spider": spider.name},
            fingerprinter=self.crawler.request_fingerprinter,
            debug=self.debug,
            local_cache_size=self.local_cache_size,
            stats=self.stats,
        )
        self.nodes = NodeRegistry(self.server, keys.nodes_key(spider.name), info=self._node_info)
        self._unserializable_logged: set[str] = set()
        self.spider = spider
        self._flush_call: Any = None
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            prefetch=self.prefetch,
        )
        if self.flush_on_start:
            self.flush()
        pending = len(self.queue)
        if pending:
            logger.info("Resuming crawl (%d requests scheduled in the shared queue)", pending)
        self.nodes.beat(force=True)

    def _node_info(self) -> dict[str, Any]:
        stats = self.crawler.stats
        engine = getattr(self.crawler, "_engine", None)
        downloader = getattr(engine, "downloader", None)
        return {
            "inflight": len(getattr(downloader, "active", ())) + self.queue.local_pending(),
            "pages": stats.get_value("response_received_count", 0),
            "items": stats.get_value("item_scraped_count", 0),
        }

    def close(self, reason: str) -> None:
        self.flush_staged()
        returned = self.queue.return_prefetched()
        if returned:
            logger.info("Returned %d prefetched requests to the shared queue", returned)
        finished = reason == "finished"
        outcome = self.nodes.leave(self.queue.key, finished, keys.crawl_scoped_keys(self.spider.name))
        if outcome == -1:
            logger.info(
                "Crawl of %r complete on every node: its seen-set was cleared so the next run starts fresh",
                self.spider.name,
            )
        elif not finished or len(self.queue):
            logger.info(
                "Spider %r closed (%s) with %d requests left in the shared queue; they resume on the next start",
                self.spider.name, reason, len(self.queue),
            )
        self.df.close(reason)

    def flush(self) -> None:
        self.df.clear()
        self.queue.clear()

    def enqueue_request(self, request: Request) -> bool:
        # Returns True for a request staged for the next flush even if Redis then finds
        # another node saw it first; those are counted as dupefilter/filtered_shared.
        try:
            if request.dont_filter:
                self.queue.stage(request)
            else:
                seen, fp = self.df.seen_locally(request)
                if seen:
                    self.df.log(request, self.spider)
                    return False
                self.queue.stage(request, self.df.key, fp)
        except RequestSerializationError as exc:
            self.stats.inc_value("scheduler/unserializable")
            message = str(exc)
            first_line = message.split(": cannot queue")[0]
            if first_line not in self._unserializable_logged:
                self._unserializable_logged.add(first_line)
                logger.error("%s (further requests from this callback that fail the same way are only counted)", message)
            return False
        if self.queue.staged_count() >= 100:
            self.flush_staged()
        elif self._flush_call is None:
            from twisted.internet import reactor

            self._flush_call = reactor.callLater(0, self.flush_staged)
        return True

    def flush_staged(self) -> None:
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        queued, filtered = self.queue.flush_staged()
        if queued:
            self.stats.inc_value("scheduler/enqueued/redis", queued)
        if filtered:
            self.stats.inc_value("dupefilter/filtered_shared", filtered)

    def next_request(self) -> Request | None:
        self.nodes.beat()
        self.flush_staged()
        request = self.queue.pop()
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self) -> bool:
        return self.queue.local_pending() > 0 or len(self.queue) > 0
