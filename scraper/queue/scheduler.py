"""The shared scheduler: scrapy-redis' Scheduler, made safe for a fleet.

What differs from scrapy-redis' own:

* the queue and the seen-set always persist: one node closing never wipes them for the others;
  they are dropped only by the last node out of a crawl that *finished* (queue drained), so a
  stopped crawl resumes where it left off and a finished one can be run again;
* requests are JSON (see :mod:`scraper.queue.serializer`), never pickle;
* a request that cannot be queued is one clear error naming spider and callback, not a crash;
* the dupefilter uses Scrapy's ``REQUEST_FINGERPRINTER_CLASS`` and a local pre-check, keeps
  its fingerprints in a set or a Bloom filter, and may forget them after an expiry (see
  :mod:`scraper.queue.dupefilter`);
* one Redis connection pool per process, shared with the other components;
* Redis going away for a while is waited out: nothing staged is dropped, no lease is
  acknowledged before the requests that replace it are in Redis, and the spider does not
  close as "finished" meanwhile.

Settings: ``SCHEDULER_QUEUE_CLASS``, ``SCHEDULER_SERIALIZER``, ``SCHEDULER_FLUSH_ON_START``,
``SCHEDULER_DUPEFILTER_LOCAL_CACHE``, ``SCHEDULER_IDLE_TIMEOUT`` (see :mod:`scraper.extensions.idle_close`),
``DUPEFILTER_BACKEND``, ``DUPEFILTER_EXPIRY``, ``DUPEFILTER_BLOOM_CAPACITY``, ``DUPEFILTER_BLOOM_ERROR_RATE``.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler

from ..config import get_bool, get_float, get_int
from ..redis_client import UNREACHABLE, get_redis
from ..storage import gone
from . import keys
from .dupefilter import SharedDupeFilter, make_store, seen_config
from .nodes import NodeRegistry
from .leases import Leases, lease_abandoned
from .queues import LEASE_META, RequestSerializationError

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
        instance.lease_timeout = get_float(settings, "SCHEDULER_LEASE_TIMEOUT", 60.0, minimum=0)
        instance.max_redeliveries = get_int(settings, "SCHEDULER_MAX_REDELIVERIES", 5, minimum=0)
        seen_config(settings)  # a bad DUPEFILTER_* setting fails here even without the add-on
        return instance

    def open(self, spider: Spider) -> None:
        self.df = SharedDupeFilter(
            self.server,
            key=self.dupefilter_key % {"spider": spider.name},
            fingerprinter=self.crawler.request_fingerprinter,
            debug=self.debug,
            local_cache_size=self.local_cache_size,
            stats=self.stats,
            store=make_store(self.server, spider.name, self.crawler.settings),
        )
        self.nodes = NodeRegistry(self.server, keys.nodes_key(spider.name), info=self._node_info)
        self._unserializable_logged: set[str] = set()
        self._last_redis_warning = float("-inf")
        self._no_reap_until = float("-inf")
        self.spider = spider
        self._flush_call: Any = None
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            prefetch=self.prefetch,
        )
        self.leases = None
        self._lease_loop: Any = None
        if self.lease_timeout > 0:
            self.leases = Leases(self.server, spider.name, self.queue.key, keys.dead_key(spider.name),
                                 self.lease_timeout, self.max_redeliveries, owner=self.nodes.node_id)
            self.queue.leases = self.leases
        if self.flush_on_start:
            self.flush()
        if self.leases is not None:
            self._reap()  # requests a worker of an earlier run died holding
            from twisted.internet import task

            self.crawler.signals.connect(self._abandon, signal=lease_abandoned)
            self._lease_loop = task.LoopingCall(self._tend_leases)
            self._lease_loop.start(max(0.05, min(0.5, self.lease_timeout / 6)), now=False)
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

    # --- leases ---------------------------------------------------------------------------------
    def _in_progress(self) -> set[str]:
        """Leases of requests the engine still works on (downloading, in a callback, or with
        items in the pipelines). The engine keeps a request in its slot until all of that is
        done; private attribute, so a rename in Scrapy makes every lease look busy (safe: they
        are then acknowledged at close)."""
        slot = getattr(getattr(self.crawler, "_engine", None), "_slot", None)
        inprogress = getattr(slot, "inprogress", None)
        if inprogress is None:
            return set(self.leases.mine)
        return {r.meta.get(LEASE_META) for r in list(inprogress)} | self.queue.prefetched_leases()

    def _abandon(self, request: Request) -> None:
        lease = request.meta.get(LEASE_META)
        if lease and lease in self.leases.mine:
            self.leases.mine.discard(lease)  # not acknowledged, not renewed: it runs out
            self.stats.inc_value("scheduler/abandoned")

    def _tend_leases(self) -> None:
        try:
            # Requests that replace a leased one (retries, redirects) must be in Redis before
            # the lease they inherit from is acknowledged.
            if not self.flush_staged():
                return
            done = self.leases.mine - self._in_progress()
            self.leases.ack(done)
            if done:
                self.stats.inc_value("scheduler/acked", len(done))
            self.leases.renew()
            self._reap()
            self._wake_engine()
        except UNREACHABLE as exc:  # the next tick tries again; leases outlive a blip
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not tend the request leases: %s", exc)

    def _wake_engine(self) -> None:
        # While other workers hold leases the engine does not count as idle, so the idle
        # extension does not poke it and it would look at the shared queue only every 5 s.
        slot = getattr(getattr(self.crawler, "_engine", None), "_slot", None)
        if slot is not None and not self.queue.local_pending():
            slot.nextcall.schedule()

    def _reap(self) -> None:
        if time.monotonic() < self._no_reap_until:
            return
        requeued, dead = self.leases.reap()
        if requeued or dead:
            self.stats.inc_value("scheduler/redelivered", requeued)
            if dead:
                self.stats.inc_value("dead_letters/count", dead)
                self.stats.inc_value("dead_letters/lease", dead)
            logger.warning(
                "Requests of a worker that stopped renewing its leases: %d back in the queue, %d dead letters",
                requeued, dead,
            )

    def close(self, reason: str) -> None:
        if self._lease_loop is not None and self._lease_loop.running:
            self._lease_loop.stop()
        try:
            self._close(reason)
        except UNREACHABLE as exc:
            self._closed_without_redis(type(exc).__name__)
        self.df.close(reason)

    def _closed_without_redis(self, why: str) -> None:
        # Nothing unsafe was acknowledged: the leases left behind expire, and their requests
        # are fetched again by another node or the next run.
        logger.error("Redis unreachable while closing (%s): %d requests not queued; the leases of "
                     "the pages that produced them expire and those pages are fetched again",
                     why, self.queue.staged_count())

    def _close(self, reason: str) -> None:
        if not self.flush_staged():
            self._closed_without_redis("the staged requests could not be sent")
            return
        returned = self.queue.return_prefetched()
        if returned:
            logger.info("Returned %d prefetched requests to the shared queue", returned)
        if self.leases is not None:
            # The engine has drained: everything this node still holds is done.
            self.leases.ack(set(self.leases.mine))
        finished = reason == "finished"
        run_keys = keys.crawl_scoped_keys(self.spider.name, self.df.run_keys())
        run_keys = gone.hold_items_seen(self.crawler, self.spider.name, run_keys)
        outcome = self.nodes.leave(self.queue.key, finished, run_keys,
                                   leases_key=self.leases.deadlines_key if self.leases else None)
        gone.after_leave(self.crawler, self.server, self.spider.name, reason, outcome == -1)
        if outcome == -1 and self.df.run_keys():
            logger.info(
                "Crawl of %r complete on every node: its seen-set was cleared so the next run starts fresh",
                self.spider.name,
            )
        elif outcome == -1:
            logger.info(
                "Crawl of %r complete on every node: its seen-set is kept, each fingerprint for at most "
                "DUPEFILTER_EXPIRY=%gs after it was claimed", self.spider.name, self.df.store.expiry,
            )
        elif not finished or len(self.queue):
            logger.info(
                "Spider %r closed (%s) with %d requests left in the shared queue; they resume on the next start",
                self.spider.name, reason, len(self.queue),
            )

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
                self.queue.stage(request, self.df, fp)
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

    def flush_staged(self) -> bool:
        """Send staged requests to Redis; False (and they stay staged) if it is unreachable."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        try:
            queued, filtered = self.queue.flush_staged()
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return False
        if queued:
            self.stats.inc_value("scheduler/enqueued/redis", queued)
        if filtered:
            self.stats.inc_value("dupefilter/filtered_shared", filtered)
        return True

    def _redis_down(self, exc: Exception) -> None:
        self.stats.inc_value("scheduler/redis_errors")
        now = time.monotonic()
        # After an outage every node's leases look expired until their owners renew them:
        # give them a lease period to do so before reaping anything.
        self._no_reap_until = now + self.lease_timeout
        if now - self._last_redis_warning >= 10:
            self._last_redis_warning = now
            logger.warning("Redis unreachable (%s): %d requests wait to be queued; retrying",
                           type(exc).__name__, self.queue.staged_count())

    def next_request(self) -> Request | None:
        try:
            self.nodes.beat()
            self.flush_staged()
            request = self.queue.pop()
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return None
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self) -> bool:
        if self.queue.local_pending() > 0:
            return True
        try:
            if len(self.queue) > 0:
                return True
            # Another worker's leases: if it dies, its requests come back here.
            return self.leases is not None and self.leases.outstanding_elsewhere() > 0
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True  # unknown: a crawl is not finished because Redis is away
