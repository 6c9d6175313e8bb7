"""Keep the run's figures and its ``crawl_runs`` row up to date from every node.

Each node reports its own figures (pages, items by outcome, rejects, duplicates, dead letters,
API credits, redeliveries) into the run's figures hash every ``RUNS_REPORT_INTERVAL`` seconds
and just before it leaves the run (so the last node out, which records the finished run, has
them all); the run's figures are their sum, so a node killed with SIGKILL still counts
for what it reported last. The Postgres row is written when a node joins the run, when it
leaves, and for a run that this node's start found finished. A database that is away costs
a warning, never the crawl: the next write carries the whole row again.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from ..adapters import engine
from ..config import get_float
from ..queue import keys
from . import record
from .state import leaving_run, summed_figures

logger = logging.getLogger(__name__)


class RunRecorder:
    def __init__(self, crawler: Any, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self._loop: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> RunRecorder:
        interval = get_float(crawler.settings, "RUNS_REPORT_INTERVAL", 5.0, minimum=0.1)
        if not crawler.settings.get("SCHEDULER", "").endswith("SharedScheduler"):
            raise NotConfigured  # no shared scheduler, no run (e.g. Scrapy's in-memory one)
        ext = cls(crawler, interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.report, signal=leaving_run)
        return ext

    def _scheduler(self) -> Any:
        scheduler = engine.scheduler(self.crawler)
        return scheduler if getattr(getattr(scheduler, "run", None), "run_id", 0) else None

    def spider_opened(self, spider: Any) -> None:
        from twisted.internet import task

        scheduler = self._scheduler()
        if scheduler is None:
            return
        run = scheduler.run
        self.crawler.stats.set_value("run/id", run.run_id)
        self.crawler.stats.set_value("run/action", scheduler.run_decision.action)
        self.report()
        previous = scheduler.run_decision.finished_previous
        if previous:
            # Found finished by this start: its row is ours to complete (the Redis record now
            # describes the new run, so the old one is written as finished from its figures).
            self._write_row(previous, {"state": "finished", "reason": self._previous_reason(scheduler)})
        self._write_row(run.run_id, run.current())
        self._loop = task.LoopingCall(self.report)
        self._loop.start(self.interval, now=False)

    @staticmethod
    def _previous_reason(scheduler: Any) -> str:
        decision = scheduler.run_decision
        return "discarded" if decision.dropped else "finished (noticed by the next start)"

    def spider_closed(self, spider: Any, reason: str) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        scheduler = self._scheduler()
        if scheduler is None:
            return
        self.report()
        current = scheduler.run.current()
        run_id = scheduler.run.run_id
        if self.crawler.stats.get_value("run/outcome") == "lost":
            current = {"state": "lost", "reason": "lost: Redis lost the run's shared state"}
        elif str(run_id) != current.get("id"):
            current = {"state": "finished", "reason": reason}
        self._write_row(run_id, current)

    def figures(self) -> dict[str, float]:
        stats = self.crawler.stats
        return {stat: float(stats.get_value(stat, 0) or 0) for stat in record.FIGURES.values()}

    def report(self) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        try:
            scheduler.run.write_figures(scheduler.run.run_id, self.figures())
        except Exception as exc:
            logger.warning("Could not report this node's figures for the run: %s", exc)

    def _write_row(self, run_id: int, run: dict[str, str]) -> None:
        scheduler = self._scheduler()
        dsn = self.crawler.settings.get("DATABASE_URL")
        if scheduler is None or not dsn:
            return
        name = self.crawler.spider.name
        try:
            figures, nodes = summed_figures(scheduler.server, name, run_id)
            if not run.get("started"):
                run = {**run, "started": self._started_of(scheduler.server, name, run_id)}
            conn = record.connect(dsn)
            try:
                record.upsert(conn, name, run_id, run, figures, nodes)
            finally:
                conn.close()
        except Exception as exc:
            logger.warning("Could not record run %d of %s in crawl_runs: %s", run_id, name, exc)

    @staticmethod
    def _started_of(server: Any, name: str, run_id: int) -> str:
        current = server.hgetall(keys.run_key(name))
        if current.get(b"id") == str(run_id).encode():
            return current.get(b"started", b"").decode()
        return ""
