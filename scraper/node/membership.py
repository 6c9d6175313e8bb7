"""A node's part in its spider's run: begin (start, resume, join, or wait for the run that is
ending), beat while crawling, notice a lost run, leave and say how the run stands.

The run's state itself is :mod:`scraper.runs.state`'s (in Redis); this is what one node does
with it, and what it says. Heartbeats and leases use Redis' clock (:mod:`scraper.queue.clock`):
a host whose own clock is off by more than ``RUNS_CLOCK_SKEW_WARN`` is told so once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from scrapy.utils.defer import deferred_from_coro

from ..backends.redis_client import UNREACHABLE
from ..config import get_float
from ..runs.nodes import NodeRegistry
from ..runs.state import Decision, RunState
from . import gone

# `scrapy crawl`'s exit status for a run whose shared state was lost (see scraper.runs.state).
LOST_EXIT_STATUS = 4

logger = logging.getLogger(__name__)


class RunMembership:
    def __init__(
        self,
        crawler: Any,
        name: str,
        run: RunState,
        nodes: NodeRegistry,
        queue: Any,
        node_ttl: float,
        redis_down: Callable[[Exception], None],
    ) -> None:
        self.crawler = crawler
        self.run = run
        self.nodes = nodes
        self.queue = queue
        self.node_ttl = node_ttl
        self._redis_down = redis_down
        self.name = name
        self.decision: Decision | None = None
        self.outcome: str | None = None
        self.lost = False
        self.closing = False
        self._said_lost_start = False
        self._beat_loop: Any = None

    # -- beginning -------------------------------------------------------------------------------
    def lowest_next_id(self) -> int:
        # Only when Redis has no run record (first run, or Redis lost its data): then Postgres
        # knows which ids are taken.
        if self.run.has_run_record():
            return 0
        dsn = self.crawler.settings.get("DATABASE_URL")
        if not dsn:
            return 0
        from ..runs import record

        try:
            run_id, state = record.last_run(dsn, self.name)
        except Exception as exc:  # the run still starts; its row is written when Postgres is back
            logger.warning("Could not read the recorded runs of %r: %s", self.name, exc)
            return 0
        if run_id and state != "finished" and self.run.has_run_record():
            # Another node began a run, in Redis then in Postgres, between this node's two looks:
            # nothing was lost.
            return run_id
        if run_id and state != "finished" and not self._said_lost_start:
            self._said_lost_start = True
            logger.warning(
                "Run %d of %s is recorded as %s in Postgres, but Redis has no record of it: its "
                "shared state (queue, seen-set) was lost. Starting a fresh run %d from the seeds; "
                "pages run %d had fetched are fetched again.",
                run_id,
                self.name,
                state,
                run_id + 1,
                run_id,
            )
        return run_id

    async def wait_to_begin(
        self, decision: Decision, begin: Callable[[], Decision], begun: Callable[[Decision], None]
    ) -> None:
        from twisted.internet import reactor, task

        last_report = float("-inf")
        while decision.action == "wait" and not self.closing:
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                self._report_wait(decision)
            await task.deferLater(reactor, 0.25, lambda: None)
            decision = begin()
        if not self.closing:
            begun(decision)

    def _report_wait(self, decision: Decision) -> None:
        now = self.nodes.clock.now()
        live = self.nodes.live(now)
        newest = max(live.values(), default=now)
        logger.info(
            "Waiting for run %d of %s: %d live node%s (%s; last heartbeat %.0f s ago) with nothing queued or "
            "leased. If they queue more, this node joins; once they leave (or stay silent until %s, "
            "RUNS_NODE_TTL=%gs) the run is finished and this node starts the next",
            decision.run_id,
            self.name,
            len(live),
            "" if len(live) == 1 else "s",
            ", ".join(n.rsplit(":", 1)[0] for n in sorted(live)) or "none",
            now - newest,
            time.strftime("%H:%M:%S", time.localtime(newest + self.node_ttl)),
            self.node_ttl,
        )

    def begun(self, decision: Decision) -> None:
        """Say what the node began, then beat: also while the engine does not ask for requests
        (downloads saturated)."""
        from twisted.internet import task

        if decision.finished_previous and decision.dropped:
            logger.warning(
                "Discarded run %d of %s (--fresh): %d queued or leased requests dropped",
                decision.finished_previous,
                self.name,
                decision.dropped,
            )
        elif decision.finished_previous and decision.action == "start":
            logger.info(
                "Run %d of %s had finished (no node left, nothing queued or leased): recorded as finished now",
                decision.finished_previous,
                self.name,
            )
        self.nodes.beat(force=True)
        self._say_skew()
        self._beat_loop = task.LoopingCall(self.beat)
        self._beat_loop.start(min(1.0, self.node_ttl / 6), now=False)
        self.decision = decision
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
        name, run_id = self.name, decision.run_id
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

    # -- crawling --------------------------------------------------------------------------------
    def beat(self) -> None:
        try:
            self.nodes.beat()
            if not self.lost and self.run.lost():
                self._lose()
        except UNREACHABLE as exc:
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not send this node's heartbeat: %s", exc)

    def _lose(self) -> None:
        """The run's shared state vanished under it: say so, end this node's part as ``lost``."""
        self.lost = True
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
            self.name,
            LOST_EXIT_STATUS,
            self.name,
        )
        engine = self.crawler.engine
        deferred_from_coro(engine.close_spider_async(reason="lost")).addErrback(
            lambda failure: logger.error("Could not stop the spider: %s", failure.value)
        )

    def stop(self) -> None:
        self.closing = True
        if self._beat_loop is not None and self._beat_loop.running:
            self._beat_loop.stop()

    # -- leaving ---------------------------------------------------------------------------------
    def leave(self, reason: str, run_keys: list[str], shard_run_keys: list[str], seen: Any) -> None:
        """Leave the run (the last node out finishes it), mark gone what it did not see if it
        finished, and say how the run stands. *seen*: the seen-set, for what the log says of it."""
        if not self.run.run_id:
            return  # closed while waiting to begin: never part of a run
        # The run's item claims are held back from the keys dropped at its finish: gone-marking
        # reads them first (and drops them).
        held = gone.hold_items_seen(self.crawler, self.name, run_keys)
        dropped = [k for k in run_keys if k not in held]
        outcome, live = self.run.leave(reason, dropped, shard_run_keys, held)
        if outcome == "lost" and not self.lost:
            self.lost = True
            self.crawler.stats.set_value("run/exit_status", LOST_EXIT_STATUS)
            logger.error(
                "Run %d of %s lost its shared state: Redis has no record of it any more (restarted "
                "without persistence, flushed, or failed over without the latest writes). The run ends "
                "lost (exit %d), nothing is marked gone, and the next `scrapy crawl %s` starts a fresh "
                "run from the seeds.",
                self.run.run_id,
                self.name,
                LOST_EXIT_STATUS,
                self.name,
            )
        self.outcome = outcome
        self.crawler.stats.set_value("run/outcome", outcome)
        gone.after_leave(self.crawler, self.run.server, self.name, reason, outcome == "finished", held)
        self._say_left(outcome, reason, live, seen)

    def _say_left(self, outcome: str, reason: str, live: int, seen: Any) -> None:
        name, run_id = self.name, self.run.run_id
        if outcome == "finished" and (seen.run_keys() or seen.shard_run_keys()):
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
                seen.store.expiry,
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
