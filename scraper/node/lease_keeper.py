"""A node's side of at-least-once delivery: the leases it holds, tended while it crawls.

Each tick (at most every 0.1 s) acknowledges the leases of requests the engine is done with
(downloaded, called back, every item committed), after the requests that replace them (retries,
redirects, links) are in Redis and, on a replicated Redis, on a replica; renews the rest; and now
and then reaps the leases of workers that stopped renewing theirs (their requests go back in the
queue, or become dead letters past ``SCHEDULER_MAX_REDELIVERIES``). A node holding
``SCHEDULER_MAX_LEASES`` takes no more until some are acknowledged. See :mod:`scraper.queue.leases`
for the keys and scripts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from scrapy import Request

from ..adapters import engine
from ..backends.redis_client import UNREACHABLE
from ..queue.leases import Leases, lease_abandoned
from ..queue.queues import LEASE_META
from ..queue.replication import ReplicaBarrier
from ..runs.nodes import NodeRegistry
from ..runs.state import RunState

logger = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        crawler: Any,
        leases: Leases,
        queue: Any,
        barrier: ReplicaBarrier | None,
        max_leases: int,
        flush_staged: Callable[[], bool],
        redis_down: Callable[[Exception], None],
        flush_writer: Callable[[int], None],
    ) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.leases = leases
        self.queue = queue
        self.barrier = barrier
        self.max_leases = max_leases
        self._flush_staged = flush_staged
        self._redis_down = redis_down
        self._flush_writer = flush_writer
        self._loop: Any = None
        self._no_reap_until = float("-inf")
        # Acknowledging soon after a commit is what keeps few leases held (and a killed worker's
        # refetches few); one small script per tick. Reaping needs no such haste.
        self._reap_every = max(0.05, min(0.5, leases.ttl / 6))
        self._next_reap = 0.0
        self._last_report = float("-inf")
        self._wait_since: float | None = None

    def start(self) -> None:
        from twisted.internet import task

        self.reap()  # requests a worker of an earlier run died holding
        self.crawler.signals.connect(self._abandon, signal=lease_abandoned)
        self._loop = task.LoopingCall(self.tend)
        self._loop.start(min(0.1, self._reap_every), now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def hold_off_reaping(self) -> None:
        """After an outage every node's leases look expired until their owners renew them: give
        them a lease period to do so before reaping anything."""
        self._no_reap_until = time.monotonic() + self.leases.ttl

    @property
    def held(self) -> set[str]:
        return self.leases.mine

    def room(self) -> int | None:
        """How many more leases this node may take (None: no cap)."""
        return self.max_leases - len(self.leases.mine) if self.max_leases else None

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

    def tend(self) -> None:
        try:
            if not self.ack_done():
                return
            self.leases.renew()
            if time.monotonic() >= self._next_reap:
                self._next_reap = time.monotonic() + self._reap_every
                self.reap()
            self._wake_engine()
        except UNREACHABLE as exc:  # the next tick tries again; leases outlive a blip
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not tend the request leases: %s", exc)

    def ack_done(self, at_least: int = 0) -> bool:
        """Acknowledge the leases of requests the engine is done with (once fewer than
        *at_least* are done, wait for a next call); False if Redis is unreachable."""
        done = self.leases.mine - self._in_progress()
        if at_least and len(done) < at_least:
            return True
        # Requests that replace a leased one (retries, redirects) must be in Redis before
        # the lease they inherit from is acknowledged.
        if not self._flush_staged():
            return False
        if done and self.barrier is not None and not self.barrier.settle():
            done = set()  # acknowledged at a next tick, once a replica has their links
        self.leases.ack(done)
        if done:
            self.stats.inc_value("scheduler/acked", len(done))
        return True

    def ack_all(self) -> None:
        """The engine has drained: everything this node still holds is done (unless a replica
        never confirmed their links: then they run out and come back)."""
        if self.barrier is None or self.barrier.settle():
            self.leases.ack(set(self.leases.mine))

    def _wake_engine(self) -> None:
        # While other workers hold leases the engine does not count as idle, so the idle
        # extension does not poke it and it would look at the shared queue only every 5 s.
        if not self.queue.local_pending():
            engine.wake(self.crawler)

    def reap(self) -> None:
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

    def at_cap(self) -> bool:
        """This node holds ``SCHEDULER_MAX_LEASES`` leases and has none left to hand out: take no
        more until some are acknowledged, and have the writer commit what it holds now instead
        of at its next interval (rows waiting for their batch keep their pages leased)."""
        if not self.max_leases or self.queue.prefetched_count():
            return False
        if len(self.leases.mine) < self.max_leases:
            return False
        # Acknowledge at once what is done rather than at the next tick: the tick's period
        # would otherwise bound the pages per second to the cap per period. A quarter of the
        # cap at a time keeps it to a few round trips per cap's worth of pages.
        quarter = max(1, self.max_leases // 4)
        try:
            if self.ack_done(at_least=quarter) and len(self.leases.mine) < self.max_leases:
                return False
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True
        self.stats.inc_value("scheduler/lease_cap_waits")
        # A quarter of the cap's rows per batch: committing whatever waited at each look made
        # batches of ~10 rows on the bench's demo shop, whose fixed cost (writer thread,
        # Postgres) dominated the store's cost per page; with ~20 rows per batch the crawler's
        # CPU per page fell 4-9 % and pages/s rose 8-22 %.
        self._flush_writer(quarter)
        return True

    def waiting_elsewhere(self, run: RunState, nodes: NodeRegistry) -> bool:
        """Whether other workers hold leases (if one dies, its requests come back here); says
        so now and then."""
        if self.leases.outstanding_elsewhere() <= 0:
            self._wait_since = None
            return False
        self._report_wait(run, nodes)
        return True

    def not_waiting(self) -> None:
        self._wait_since = None

    def _report_wait(self, run: RunState, nodes: NodeRegistry) -> None:
        now = time.monotonic()
        if self._wait_since is None:
            self._wait_since = now
        # At once for a stopped worker's leases (the wait can be long), after 10 s for live ones.
        if now - self._last_report < 10 or (self._last_report == float("-inf") and now - self._wait_since < 2):
            return
        summary = run.lease_summary(self.leases.mine)
        if summary.stopped:
            self._last_report = now
            back = summary.stopped_back_at
            logger.info(
                "Waiting for %d requests leased by %s that stopped (%s): they return to the queue by "
                "%s (in %.0f s, SCHEDULER_LEASE_TIMEOUT)",
                summary.stopped,
                "a worker" if len(summary.stopped_owners) == 1 else "workers",
                ", ".join(sorted(summary.stopped_owners)),
                time.strftime("%H:%M:%S", time.localtime(back)),
                max(0.0, back - nodes.clock.now()),
            )
        elif summary.live and now - self._wait_since >= 10:
            self._last_report = now
            logger.info(
                "Waiting for %d requests leased by live workers: they finish there, or return to the "
                "queue within SCHEDULER_LEASE_TIMEOUT=%gs if their worker stops",
                summary.live,
                self.leases.ttl,
            )
