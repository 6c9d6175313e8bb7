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
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler
from twisted.internet import defer

from ..adapters import engine
from ..backends.redis_client import UNREACHABLE, count_refusal, get_redis, unreachable_reason
from ..config import get_bool, get_float, get_int
from ..queue import keys, signing
from ..queue.dupefilter import SharedDupeFilter, make_stores, seen_config
from ..queue.leases import Leases, lease_abandoned
from ..queue.queues import LEASE_META, RequestSerializationError
from ..queue.replication import ReplicaBarrier
from ..queue.shards import Shards, discard_shards, shard_count, shards_setting
from ..runs.nodes import NodeRegistry
from ..runs.state import Decision, RunState
from ..storage.writer import existing_writer
from . import gone

# `scrapy crawl`'s exit status for a run whose shared state was lost (see scraper.runs.state).
LOST_EXIT_STATUS = 4

logger = logging.getLogger(__name__)


class SharedScheduler(Scheduler):
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
        self._no_reap_until = float("-inf")
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
        self.barrier: ReplicaBarrier | None = None
        self._lease_loop: Any = None
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
            self.queue.barrier = self.barrier = ReplicaBarrier.needed(self.server, self.shards)
        if self.flush_on_start:
            self.flush()
        self.run = RunState(self.server, spider.name, self.nodes, self.queue.key, self.leases, shards=self.shards)
        self._closing = False
        self._lost = False
        self._said_lost_start = False
        self._beat_loop: Any = None
        self._last_lease_report = float("-inf")
        self._lease_wait_since: float | None = None
        decision = self.run.begin(self._run_keys(), self._lowest_next_id(), self.fresh, self._shard_run_keys())
        if decision.action == "wait":
            # Not on the reactor thread's time: the engine awaits this before the start requests.
            return defer.ensureDeferred(self._wait_to_begin(decision))
        self._begun(decision)
        return None

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

    def _lowest_next_id(self) -> int:
        # Only when Redis has no run record (first run, or Redis lost its data): then Postgres
        # knows which ids are taken.
        if self.run.has_run_record():
            return 0
        dsn = self.crawler.settings.get("DATABASE_URL")
        if not dsn:
            return 0
        from ..runs import record

        try:
            run_id, state = record.last_run(dsn, self.spider.name)
        except Exception as exc:  # the run still starts; its row is written when Postgres is back
            logger.warning("Could not read the recorded runs of %r: %s", self.spider.name, exc)
            return 0
        if run_id and state != "finished" and not self._said_lost_start:
            self._said_lost_start = True
            logger.warning(
                "Run %d of %s is recorded as %s in Postgres, but Redis has no record of it: its "
                "shared state (queue, seen-set) was lost. Starting a fresh run %d from the seeds; "
                "pages run %d had fetched are fetched again.",
                run_id,
                self.spider.name,
                state,
                run_id + 1,
                run_id,
            )
        return run_id

    async def _wait_to_begin(self, decision: Decision) -> None:
        from twisted.internet import reactor, task

        last_report = float("-inf")
        while decision.action == "wait" and not self._closing:
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                self._report_run_wait(decision)
            await task.deferLater(reactor, 0.25, lambda: None)
            decision = self.run.begin(self._run_keys(), self._lowest_next_id(), self.fresh, self._shard_run_keys())
        if not self._closing:
            self._begun(decision)

    def _report_run_wait(self, decision: Decision) -> None:
        now = self.nodes.clock.now()
        live = self.nodes.live(now)
        newest = max(live.values(), default=now)
        logger.info(
            "Waiting for run %d of %s: %d live node%s (%s; last heartbeat %.0f s ago) with nothing queued or "
            "leased. If they queue more, this node joins; once they leave (or stay silent until %s, "
            "RUNS_NODE_TTL=%gs) the run is finished and this node starts the next",
            decision.run_id,
            self.spider.name,
            len(live),
            "" if len(live) == 1 else "s",
            ", ".join(n.rsplit(":", 1)[0] for n in sorted(live)) or "none",
            now - newest,
            time.strftime("%H:%M:%S", time.localtime(newest + self.node_ttl)),
            self.node_ttl,
        )

    def _begun(self, decision: Decision) -> None:
        from twisted.internet import task

        name = self.spider.name
        adopted = self.queue.adopt_unsharded()
        if adopted:
            logger.info(
                "Moved %d requests queued unsharded into the %d shards of %s's frontier",
                adopted,
                self.shards.count,
                name,
            )
        if decision.finished_previous and decision.dropped:
            logger.warning(
                "Discarded run %d of %s (--fresh): %d queued or leased requests dropped",
                decision.finished_previous,
                name,
                decision.dropped,
            )
        elif decision.finished_previous and decision.action == "start":
            logger.info(
                "Run %d of %s had finished (no node left, nothing queued or leased): recorded as finished now",
                decision.finished_previous,
                name,
            )
        if self.leases is not None:
            self._reap()  # requests a worker of an earlier run died holding
            self.crawler.signals.connect(self._abandon, signal=lease_abandoned)
            self._lease_loop = task.LoopingCall(self._tend_leases)
            # Acknowledging soon after a commit is what keeps few leases held (and a killed
            # worker's refetches few); one small script per tick. Reaping needs no such haste.
            self._reap_every = max(0.05, min(0.5, self.lease_timeout / 6))
            self._next_reap = 0.0
            self._lease_loop.start(min(0.1, self._reap_every), now=False)
        self.nodes.beat(force=True)
        self._say_skew()
        # Heartbeats also while the engine does not ask for requests (downloads saturated).
        self._beat_loop = task.LoopingCall(self._beat)
        self._beat_loop.start(min(1.0, self.node_ttl / 6), now=False)
        self.run_decision = decision
        logger.info("%s", self._start_line(decision))

    def _say_skew(self) -> None:
        """Leases and heartbeats use Redis' clock, so a skewed host does no harm to the run; but
        its own timestamps (logs, archive records) are off, and it is said once."""
        bound = get_float(self.crawler.settings, "RUNS_CLOCK_SKEW_WARN", 30.0, minimum=0)
        skew = -self.nodes.clock.offset  # this host's clock minus Redis'
        if bound and abs(skew) > bound:
            logger.warning(
                "This host's clock is %.0f s %s Redis' (more than RUNS_CLOCK_SKEW_WARN=%gs): leases and "
                "heartbeats use Redis' clock and are not affected, but this host's own timestamps "
                "(logs, archive records) are off; check its time synchronisation (NTP)",
                abs(skew),
                "ahead of" if skew > 0 else "behind",
                bound,
            )
            self.crawler.stats.set_value("run/clock_skew_seconds", round(skew, 1))

    def _start_line(self, decision: Decision) -> str:
        name, run_id = self.spider.name, decision.run_id
        if decision.action == "join":
            return f"joining run {run_id} of {name} ({decision.live} live node{'' if decision.live == 1 else 's'})"
        queued = len(self.queue)
        if decision.action == "start":
            return f"starting run {run_id} of {name}" + (f" ({queued:,} queued)" if queued else "")
        details = [f"{queued:,} queued"]
        summary = self.run.lease_summary()
        if summary.stopped:
            wait = max(0.0, summary.stopped_back_at - self.nodes.clock.now())
            details.append(
                f"{summary.stopped:,} leased by {'a worker' if len(summary.stopped_owners) == 1 else 'workers'}"
                f" that stopped; they return in {wait:.0f} s"
            )
        return f"resuming run {run_id} of {name} ({', '.join(details)})"

    def _beat(self) -> None:
        try:
            self.nodes.beat()
            if not self._lost and self.run.lost():
                self._lose()
        except UNREACHABLE as exc:
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not send this node's heartbeat: %s", exc)

    def _lose(self) -> None:
        """The run's shared state vanished under it: say so, end this node's part as ``lost``."""
        self._lost = True
        stats = self.crawler.stats
        stats.set_value("run/outcome", "lost")
        stats.set_value("run/exit_status", LOST_EXIT_STATUS)
        logger.error(
            "Run %d of %s lost its shared state: Redis has no record of it any more (restarted without "
            "persistence, flushed, or failed over to a replica without the latest writes), and with it the "
            "queue and the seen-set. This node stops; the run ends lost (exit %d), nothing is marked gone, and "
            "the next `scrapy crawl %s` starts a fresh run from the seeds. Keep the queue's Redis persistent "
            "(appendonly yes) to survive a restart.",
            self.run.run_id,
            self.spider.name,
            LOST_EXIT_STATUS,
            self.spider.name,
        )
        engine = self.crawler.engine
        deferred_from_coro(engine.close_spider_async(reason="lost")).addErrback(
            lambda failure: logger.error("Could not stop the spider: %s", failure.value)
        )

    def _node_info(self) -> dict[str, Any]:
        stats = self.crawler.stats
        return {
            "inflight": engine.downloads(self.crawler) + self.queue.local_pending(),
            "pages": stats.get_value("response_received_count", 0),
            "items": stats.get_value("item_scraped_count", 0),
        }

    # --- leases ---------------------------------------------------------------------------------
    def _in_progress(self) -> set[str]:
        """Leases of requests the engine still works on (downloading, in a callback, or with
        items in the pipelines). The engine keeps a request in its slot until all of that is
        done; private attribute, so a rename in Scrapy makes every lease look busy (safe: they
        are then acknowledged at close)."""
        inprogress = engine.in_progress(self.crawler)
        if inprogress is None:
            return set(self.leases.mine)
        return {r.meta.get(LEASE_META) for r in inprogress} | self.queue.prefetched_leases()

    def _abandon(self, request: Request) -> None:
        lease = request.meta.get(LEASE_META)
        if lease and lease in self.leases.mine:
            self.leases.mine.discard(lease)  # not acknowledged, not renewed: it runs out
            self.stats.inc_value("scheduler/abandoned")

    def _tend_leases(self) -> None:
        try:
            if not self._ack_done():
                return
            self.leases.renew()
            if time.monotonic() >= self._next_reap:
                self._next_reap = time.monotonic() + self._reap_every
                self._reap()
            self._wake_engine()
        except UNREACHABLE as exc:  # the next tick tries again; leases outlive a blip
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not tend the request leases: %s", exc)

    def _ack_done(self, at_least: int = 0) -> bool:
        """Acknowledge the leases of requests the engine is done with (once fewer than
        *at_least* are done, wait for a next call); False if Redis is unreachable."""
        done = self.leases.mine - self._in_progress()
        if at_least and len(done) < at_least:
            return True
        # Requests that replace a leased one (retries, redirects) must be in Redis before
        # the lease they inherit from is acknowledged.
        if not self.flush_staged():
            return False
        if done and self.barrier is not None and not self.barrier.settle():
            done = set()  # acknowledged at a next tick, once a replica has their links
        self.leases.ack(done)
        if done:
            self.stats.inc_value("scheduler/acked", len(done))
        return True

    def _wake_engine(self) -> None:
        # While other workers hold leases the engine does not count as idle, so the idle
        # extension does not poke it and it would look at the shared queue only every 5 s.
        if not self.queue.local_pending():
            engine.wake(self.crawler)

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
                requeued,
                dead,
            )

    def close(self, reason: str) -> None:
        self._closing = True
        for loop in (self._lease_loop, getattr(self, "_beat_loop", None)):
            if loop is not None and loop.running:
                loop.stop()
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
        if self.leases is not None:
            # The engine has drained: everything this node still holds is done (unless a
            # replica never confirmed their links: then they run out and come back).
            if self.barrier is None or self.barrier.settle():
                self.leases.ack(set(self.leases.mine))
        if not self.run.run_id:
            return  # closed while waiting to begin: never part of a run
        # The run's item claims are held back from the keys dropped at its finish: gone-marking
        # reads them first (and drops them).
        outcome, live = self.run.leave(
            reason, gone.hold_items_seen(self.crawler, self.spider.name, self._run_keys()), self._shard_run_keys()
        )
        if outcome == "lost" and not self._lost:
            self._lost = True
            self.crawler.stats.set_value("run/exit_status", LOST_EXIT_STATUS)
            logger.error(
                "Run %d of %s lost its shared state: Redis has no record of it any more (restarted "
                "without persistence, flushed, or failed over without the latest writes). The run ends "
                "lost (exit %d), nothing is marked gone, and the next `scrapy crawl %s` starts a fresh "
                "run from the seeds.",
                self.run.run_id,
                self.spider.name,
                LOST_EXIT_STATUS,
                self.spider.name,
            )
        self.run_outcome = outcome
        self.crawler.stats.set_value("run/outcome", outcome)
        gone.after_leave(self.crawler, self.server, self.spider.name, reason, outcome == "finished")
        name, run_id = self.spider.name, self.run.run_id
        if outcome == "finished" and (self.df.run_keys() or self.df.shard_run_keys()):
            logger.info(
                "Run %d of %s finished on every node: its seen-set was cleared so the next run starts fresh",
                run_id,
                name,
            )
        elif outcome == "finished":
            logger.info(
                "Run %d of %s finished on every node: its seen-set is kept, each fingerprint for at most "
                "DUPEFILTER_EXPIRY=%gs after it was claimed",
                run_id,
                name,
                self.df.store.expiry,
            )
        elif outcome == "stopped":
            logger.info(
                "Run %d of %s stopped (%s) with %d requests left in the shared queue; the next "
                "`scrapy crawl %s` resumes it",
                run_id,
                name,
                reason,
                len(self.queue),
                name,
            )
        elif outcome == "gone":
            logger.warning(
                "Run %d of %s was ended by another node while this one was silent for over RUNS_NODE_TTL=%gs",
                run_id,
                name,
                self.node_ttl,
            )
        else:
            logger.info(
                "Spider %r closed (%s); run %d goes on with %d other live node%s",
                name,
                reason,
                run_id,
                live,
                "" if live == 1 else "s",
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
        # After an outage every node's leases look expired until their owners renew them:
        # give them a lease period to do so before reaping anything.
        self._no_reap_until = now + self.lease_timeout
        if now - self._last_redis_warning >= 10:
            self._last_redis_warning = now
            logger.warning(
                "Redis unreachable (%s): %d requests wait to be queued; retrying",
                unreachable_reason(exc),
                self.queue.staged_count(),
            )

    def _report_lease_wait(self) -> None:
        now = time.monotonic()
        if self._lease_wait_since is None:
            self._lease_wait_since = now
        # At once for a stopped worker's leases (the wait can be long), after 10 s for live ones.
        if now - self._last_lease_report < 10 or (
            self._last_lease_report == float("-inf") and now - self._lease_wait_since < 2
        ):
            return
        summary = self.run.lease_summary(self.leases.mine)
        if summary.stopped:
            self._last_lease_report = now
            back = summary.stopped_back_at
            logger.info(
                "Waiting for %d requests leased by %s that stopped (%s): they return to the queue by "
                "%s (in %.0f s, SCHEDULER_LEASE_TIMEOUT)",
                summary.stopped,
                "a worker" if len(summary.stopped_owners) == 1 else "workers",
                ", ".join(sorted(summary.stopped_owners)),
                time.strftime("%H:%M:%S", time.localtime(back)),
                max(0.0, back - self.nodes.clock.now()),
            )
        elif summary.live and now - self._lease_wait_since >= 10:
            self._last_lease_report = now
            logger.info(
                "Waiting for %d requests leased by live workers: they finish there, or return to the "
                "queue within SCHEDULER_LEASE_TIMEOUT=%gs if their worker stops",
                summary.live,
                self.lease_timeout,
            )

    def _at_lease_cap(self) -> bool:
        """This node holds ``SCHEDULER_MAX_LEASES`` leases and has none left to hand out: take no
        more until some are acknowledged, and have the writer commit what it holds now instead
        of at its next interval (rows waiting for their batch keep their pages leased)."""
        if self.leases is None or not self.max_leases or self.queue.prefetched_count():
            return False
        if len(self.leases.mine) < self.max_leases:
            return False
        # Acknowledge at once what is done rather than at the next tick: the tick's period
        # would otherwise bound the pages per second to the cap per period. A quarter of the
        # cap at a time keeps it to a few round trips per cap's worth of pages.
        quarter = max(1, self.max_leases // 4)
        try:
            if self._ack_done(at_least=quarter) and len(self.leases.mine) < self.max_leases:
                return False
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True
        self.stats.inc_value("scheduler/lease_cap_waits")
        # A quarter of the cap's rows per batch: committing whatever waited at each look made
        # batches of ~10 rows on the bench's demo shop, whose fixed cost (writer thread,
        # Postgres) dominated the store's cost per page; with ~20 rows per batch the crawler's
        # CPU per page fell 4-9 % and pages/s rose 8-22 %.
        self._flush_writer(enough=quarter)
        return True

    def _flush_writer(self, enough: int | None = None) -> None:
        """Have the writer commit the rows waiting now, rather than at ``POSTGRES_FLUSH_INTERVAL``,
        once *enough* of them wait, or whenever no download is in flight to bring more (the end
        of a crawl, or the lease cap): their pages' leases, and the end of the crawl, wait on them."""
        writer = existing_writer(self.crawler)
        if writer is None or writer.gave_up is not None:
            return
        waiting = writer.pending()
        if not waiting:
            return
        if (enough is not None and waiting >= enough) or not engine.downloads(self.crawler):
            writer._flush_if_idle()

    def next_request(self) -> Request | None:
        if self._at_lease_cap():
            return None
        try:
            self.nodes.beat()
            self.flush_staged()
            room = self.max_leases - len(self.leases.mine) if self.leases is not None and self.max_leases else None
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
                self._lease_wait_since = None
                return True
            # Another worker's leases: if it dies, its requests come back here.
            waiting = self.leases is not None and self.leases.outstanding_elsewhere() > 0
            if waiting:
                self._report_lease_wait()
            else:
                self._lease_wait_since = None
            return waiting
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True  # unknown: a crawl is not finished because Redis is away
