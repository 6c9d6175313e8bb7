"""The shared scheduler: scrapy-redis' Scheduler, made safe for a fleet.

What differs from scrapy-redis' own:

* every node starts, resumes or joins a *run* (see :mod:`scraper.runs.state`) and says which;
  the queue and the seen-set persist with the run: one node closing never wipes them for the
  others, and they are dropped only when the run is finished (queue drained, nothing leased,
  no node alive), by the last node out or by the next start, so a stopped run resumes where
  it left off and a finished one can be run again;
* requests are JSON (see :mod:`scraper.queue.serializer`), never pickle;
* a request that cannot be queued is one clear error naming spider and callback, not a crash;
* the dupefilter uses Scrapy's ``REQUEST_FINGERPRINTER_CLASS`` and a local pre-check, keeps
  its fingerprints in a set or a Bloom filter, and may forget them after an expiry (see
  :mod:`scraper.queue.dupefilter`);
* one Redis connection pool per process, shared with the other components;
* Redis going away for a while is waited out: nothing staged is dropped, no lease is
  acknowledged before the requests that replace it are in Redis, and the spider does not
  close as "finished" meanwhile.

This module wires the queue and the seen-set into Scrapy's scheduler interface; the node's
leases are tended by :mod:`.lease_keeper`, its part in the run by :mod:`.membership`.

Settings: ``SCHEDULER_QUEUE_CLASS``, ``SCHEDULER_SERIALIZER``, ``SCHEDULER_FLUSH_ON_START``,
``SCHEDULER_DUPEFILTER_LOCAL_CACHE``, ``SCHEDULER_IDLE_TIMEOUT`` (see :mod:`scraper.extensions.idle_close`),
``DUPEFILTER_BACKEND``, ``DUPEFILTER_EXPIRY``, ``DUPEFILTER_BLOOM_CAPACITY``, ``DUPEFILTER_BLOOM_ERROR_RATE``,
``RUNS_NODE_TTL``, ``RUNS_FRESH``.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler
from twisted.internet import defer

from ..adapters import engine
from ..backends.redis_client import UNREACHABLE, count_refusal, get_redis, unreachable_reason
from ..config import get_bool, get_float, get_int
from ..queue import keys, signing
from ..queue.dupefilter import SharedDupeFilter, make_stores, seen_config
from ..queue.leases import Leases
from ..queue.queues import RequestSerializationError
from ..queue.replication import ReplicaBarrier
from ..queue.shards import Shards, discard_shards, shard_count, shards_setting
from ..runs.nodes import NodeRegistry
from ..runs.state import Decision, RunState, leaving_run
from ..storage.owner import store_of
from .lease_keeper import LeaseKeeper
from .membership import RunMembership

logger = logging.getLogger(__name__)


class SharedScheduler(Scheduler):
    _store: Any = None  # the crawl's Postgres store, looked up when first needed

    @classmethod
    def from_crawler(cls, crawler: Any) -> SharedScheduler:
        settings = crawler.settings
        signing.install(settings)  # no secret with a shared Redis: refused here, before any pop
        instance = cls(
            server=get_redis(settings["REDIS_URL"]),
            persist=True,
            flush_on_start=get_bool(settings, "SCHEDULER_FLUSH_ON_START", False),
            queue_key=settings.get("SCHEDULER_QUEUE_KEY") or keys.queue_key("%(spider)s"),
            queue_cls=settings.get("SCHEDULER_QUEUE_CLASS") or "scraper.queue.queues.PriorityQueue",
            dupefilter_key=settings.get("SCHEDULER_DUPEFILTER_KEY") or keys.dupefilter_key("%(spider)s"),
            serializer=importlib.import_module(settings.get("SCHEDULER_SERIALIZER") or "scraper.queue.serializer"),
        )
        instance.crawler = crawler
        instance.stats = crawler.stats
        instance.local_cache_size = get_int(settings, "SCHEDULER_DUPEFILTER_LOCAL_CACHE", 20_000, minimum=0)
        instance.debug = settings.getbool("DUPEFILTER_DEBUG")
        instance.prefetch = get_int(settings, "SCHEDULER_PREFETCH", 4, minimum=1)
        instance.lease_timeout = get_float(settings, "SCHEDULER_LEASE_TIMEOUT", 60.0, minimum=0)
        instance.max_redeliveries = get_int(settings, "SCHEDULER_MAX_REDELIVERIES", 5, minimum=0)
        # What a worker killed at any moment costs in refetched pages: the leases it holds.
        instance.max_leases = get_int(
            settings, "SCHEDULER_MAX_LEASES", 2 * get_int(settings, "CONCURRENT_REQUESTS"), minimum=0
        )
        instance.node_ttl = get_float(settings, "RUNS_NODE_TTL", 60.0, minimum=1)
        instance.fresh = get_bool(settings, "RUNS_FRESH", False)
        seen_config(settings)  # a bad DUPEFILTER_* setting fails here even without the add-on
        shards_setting(settings)
        return instance

    def open(self, spider: Spider) -> None:
        keys.migrate_legacy(self.server, spider.name)
        self.nodes = NodeRegistry(self.server, keys.nodes_key(spider.name), ttl=self.node_ttl, info=self._node_info)
        self.shards = self._shards(spider.name)
        self.df = SharedDupeFilter(
            self.server,
            key=self.dupefilter_key % {"spider": spider.name},
            fingerprinter=self.crawler.request_fingerprinter,
            debug=self.debug,
            local_cache_size=self.local_cache_size,
            stats=self.stats,
            stores=make_stores(self.server, spider.name, self.crawler.settings, self.shards),
            shards=self.shards,
        )
        self._unserializable_logged: set[str] = set()
        self._last_redis_warning = float("-inf")
        self.spider = spider
        self._flush_call: Any = None
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            prefetch=self.prefetch,
            shards=self.shards,
        )
        self.leases = None
        self.keeper: LeaseKeeper | None = None
        if self.lease_timeout > 0:
            self.leases = Leases(
                self.server,
                spider.name,
                self.queue.key,
                keys.dead_key(spider.name),
                self.lease_timeout,
                self.max_redeliveries,
                owner=self.nodes.node_id,
                shards=self.shards,
                clock=self.nodes.clock,
            )
            self.queue.leases = self.leases
            self.queue.barrier = barrier = ReplicaBarrier.needed(self.server, self.shards)
            self.keeper = LeaseKeeper(
                self.crawler,
                self.leases,
                self.queue,
                barrier,
                self.max_leases,
                self.flush_staged,
                self._redis_down,
                self._flush_writer,
            )
        if self.flush_on_start:
            self.flush()
        self.run = RunState(self.server, spider.name, self.nodes, self.queue.key, self.leases, shards=self.shards)
        self.member = RunMembership(
            self.crawler, spider.name, self.run, self.nodes, self.queue, self.node_ttl, self._redis_down
        )
        decision = self._begin()
        if decision.action == "wait":
            # Not on the reactor thread's time: the engine awaits this before the start requests.
            return defer.ensureDeferred(self.member.wait_to_begin(decision, self._begin, self._begun))
        self._begun(decision)
        return None

    def _begin(self) -> Decision:
        return self.run.begin(self._run_keys(), self.member.lowest_next_id(), self.fresh, self._shard_run_keys())

    def _begun(self, decision: Decision) -> None:
        self.df.begun()
        adopted = self.queue.adopt_unsharded()
        if adopted:
            logger.info(
                "Moved %d requests queued unsharded into the %d shards of %s's frontier",
                adopted,
                self.shards.count,
                self.spider.name,
            )
        if self.keeper is not None:
            self.keeper.start()
        self.member.begun(decision)

    def _node_info(self) -> dict[str, Any]:
        stats = self.crawler.stats
        return {
            "inflight": engine.downloads(self.crawler) + self.queue.local_pending(),
            "pages": stats.get_value("response_received_count", 0),
            "items": stats.get_value("item_scraped_count", 0),
        }

    @property
    def run_decision(self) -> Decision | None:
        """How this node began its run (read by the run recorder)."""
        return self.member.decision

    @property
    def run_outcome(self) -> str | None:
        """How the run stood when this node left it."""
        return self.member.outcome

    def _shards(self, name: str) -> Shards:
        wanted = shards_setting(self.crawler.settings)
        count = shard_count(self.server, name, self.crawler.settings)
        if count == wanted:
            return Shards(name, count)
        if self.fresh and not self.nodes.live():
            # The run is discarded (see RunState.begin), and with it the frontier in its own
            # shard count: the next run starts on the new one.
            if count > 1:
                old = Shards(name, count)
                stores = make_stores(self.server, name, self.crawler.settings, old)
                dropped = discard_shards(self.server, old, [k for store in stores for k in store.run_keys()])
                logger.warning(
                    "Discarded the %d shards of the current run of %s (--fresh): %d queued or leased requests dropped",
                    count,
                    name,
                    dropped,
                )
            return Shards(name, wanted)
        logger.warning(
            "SCHEDULER_SHARDS=%d not applied: the current run of %s has its frontier in %d shard%s "
            "and keeps them until it finishes (or start it again with --fresh)",
            wanted,
            name,
            count,
            "" if count == 1 else "s",
        )
        return Shards(name, count)

    def _shard_run_keys(self) -> list[str]:
        """Keys of the run in the shards' own slots: their seen-states, their replica marks."""
        marks = [f"{prefix}:sync" for prefix in self.shards.prefixes] if self.shards.count > 1 else []
        return self.df.shard_run_keys() + marks

    def _run_keys(self) -> list[str]:
        return keys.crawl_scoped_keys(self.spider.name, self.df.run_keys())

    def close(self, reason: str) -> None:
        member = getattr(self, "member", None)
        if member is None:  # its opening failed: nothing of a run to leave
            return
        member.stop()
        if self.keeper is not None:
            self.keeper.stop()
        try:
            self._close(reason)
        except UNREACHABLE as exc:
            self._closed_without_redis(type(exc).__name__)
        self.df.close(reason)

    def _closed_without_redis(self, why: str) -> None:
        # Nothing unsafe was acknowledged: the leases left behind expire, and their requests
        # are fetched again by another node or the next run.
        logger.error(
            "Redis unreachable while closing (%s): %d requests not queued; the leases of "
            "the pages that produced them expire and those pages are fetched again",
            why,
            self.queue.staged_count(),
        )

    def _close(self, reason: str) -> None:
        if not self.flush_staged():
            self._closed_without_redis("the staged requests could not be sent")
            return
        returned = self.queue.return_prefetched()
        if returned:
            logger.info("Returned %d prefetched requests to the shared queue", returned)
        if self.keeper is not None:
            self.keeper.ack_all()
        self.crawler.signals.send_catch_log(signal=leaving_run)
        self.member.leave(reason, self._run_keys(), self._shard_run_keys(), self.df)

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
                logger.error(
                    "%s (further requests from this callback that fail the same way are only counted)", message
                )
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
        count_refusal(self.stats, exc)
        # A Redis (or cluster master) that comes back may have lost its last writes, seen-set
        # claims among them: this process must not go on filtering those links by its own memory.
        self.df.forget_local()
        now = time.monotonic()
        if self.keeper is not None:
            self.keeper.hold_off_reaping()
        if now - self._last_redis_warning >= 10:
            self._last_redis_warning = now
            logger.warning(
                "Redis unreachable (%s): %d requests wait to be queued; retrying",
                unreachable_reason(exc),
                self.queue.staged_count(),
            )

    def _flush_writer(self, enough: int | None = None) -> None:
        """Have the writer commit the rows waiting now, rather than at ``POSTGRES_FLUSH_INTERVAL``,
        once *enough* of them wait, or whenever no download is in flight to bring more (the end
        of a crawl, or the lease cap): their pages' leases, and the end of the crawl, wait on them."""
        if self._store is None:
            self._store = store_of(self.crawler)
        writer = self._store.writer if self._store is not None else None
        if writer is None or writer.gave_up is not None:
            return
        waiting = writer.pending()
        if not waiting:
            return
        if (enough is not None and waiting >= enough) or not engine.downloads(self.crawler):
            writer._flush_if_idle()

    def next_request(self) -> Request | None:
        if self.keeper is not None and self.keeper.at_cap():
            return None
        try:
            self.nodes.beat()
            self.flush_staged()
            room = self.keeper.room() if self.keeper is not None else None
            request = self.queue.pop(limit=room)
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return None
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        else:
            self._flush_writer()
        return request

    def has_pending_requests(self) -> bool:
        if self.queue.local_pending() > 0:
            return True
        try:
            if len(self.queue) > 0:
                if self.keeper is not None:
                    self.keeper.not_waiting()
                return True
            # Another worker's leases: if it dies, its requests come back here.
            return self.keeper is not None and self.keeper.waiting_elsewhere(self.run, self.nodes)
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True  # unknown: a crawl is not finished because Redis is away
