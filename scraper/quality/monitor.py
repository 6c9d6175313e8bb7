"""The data-quality extension: count as the run stores, check the run when it finishes.

Per node and in memory: field coverage of the items stored (``item_scraped``, sent
only once an item's row is committed), and how responses went (``response_received``: errors,
blocks, empty bodies). Every ``RUNS_REPORT_INTERVAL`` seconds and at close the node writes its
snapshot to the run's quality figures in Redis (:mod:`.figures`), with its rejects per field,
pages and stored items.

With ``PROCESSING=decoupled`` the items are stored by ``scrapy process`` workers: each counts
its items the same way and writes them just before it acknowledges the stream entries they
came from (:meth:`QualityMonitor.report_processed`); pages and responses stay the fetchers'.

The node that finishes the run (the last one out, its queue empty, see
:mod:`scraper.runs.state`) sums every node's figures and runs the checks against the spider's
last ``QUALITY_BASELINE_RUNS`` checked runs (prices pair by pair from the history, see
:mod:`.pairs`), logs the report, writes it to Postgres and marks
the run ``degraded`` if a check failed. A run that stopped (Ctrl-C, a close reason other than
``finished``) is not checked and so never becomes a baseline; a stopped run that is resumed
is checked when it finishes. With ``QUALITY_FAIL_EXIT`` a degraded run makes ``scrapy crawl``
exit with status 3 (the stat ``quality/exit_status``).

Nodes that leave together: each writes its final snapshot just before it leaves the run
(:data:`scraper.runs.state.leaving_run`), so the last one out, which checks the run as soon as it
has left, counts every node's figures however close behind the others it left.
"""

from __future__ import annotations

import logging
from collections import Counter
from statistics import mean, median
from types import SimpleNamespace
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from ..adapters import engine
from ..config import get_bool, get_float
from ..item_observers import on_item_scraped, on_response_received
from ..items import StoredItem, stored_item_types
from ..runs.state import leaving_run, processor_reporting
from . import coverage as coverage_figures
from . import figures as run_figures
from . import report, store
from .breaks import run_break
from .checks import Check, ItemExpectations, outcome, run_checks
from .coverage import CoverageCounter
from .pairs import price_checks
from .repairs import repair_checks
from .settings import EXIT_STATUS, QualitySettings, check_declared_coverage, declared_coverage, read_settings
from .settle import settle_waiting

logger = logging.getLogger(__name__)

# Per item type and field, values present on the page that the cleaner could not read (they are
# stored empty): counted by the clean pipeline.
UNREADABLE_STAT = "clean/unreadable/"

BLOCKED_STATUSES = (403, 429)


def _processor(settings: Any) -> bool:
    # `scrapy process` runs the stream's scheduler (scraper.processing.scheduler).
    return str(settings.get("SCHEDULER", "")).endswith("StreamScheduler")


class QualityMonitor:
    def __init__(self, crawler: Any, conf: QualitySettings, interval: float) -> None:
        self.crawler = crawler
        # In a processor (PROCESSING=decoupled): the run is that of the entries it processes.
        self.processor = _processor(crawler.settings)
        self._baseline_of = 0
        self.conf = conf
        self.interval = interval
        self.coverage = CoverageCounter()
        self.responses: Counter[str] = Counter()
        self.baseline: list[tuple[int, dict[str, float]]] = []
        #: The last checked run of the spider: (run id, outcome, failed checks), for the metrics.
        self.last: tuple[int, str, int] | None = None
        self._loop: Any = None
        self.revisit = get_bool(crawler.settings, "REVISIT_DUE")

    @classmethod
    def from_crawler(cls, crawler: Any) -> QualityMonitor:
        conf = read_settings(crawler.settings)
        processor = _processor(crawler.settings)
        if not conf.enabled or not (processor or crawler.settings.get("SCHEDULER", "").endswith("SharedScheduler")):
            raise NotConfigured  # no shared scheduler, no run to judge
        check_declared_coverage(crawler.spidercls)  # a typo in `coverage` fails before any fetch
        ext = cls(crawler, conf, get_float(crawler.settings, "RUNS_REPORT_INTERVAL", 5.0, minimum=0.1))
        if processor:
            crawler.signals.connect(ext.report_processed, signal=processor_reporting)
            crawler.signals.connect(ext.processor_closed, signal=signals.spider_closed)
        else:
            crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
            crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
            crawler.signals.connect(ext.report, signal=leaving_run)
        on_item_scraped(crawler, ext.item_scraped)
        on_response_received(crawler, ext.response_received)
        return ext

    # --- counting ----------------------------------------------------------------------------

    def item_scraped(self, item: Any) -> None:
        if isinstance(item, StoredItem):
            self.coverage.add(item)

    def response_received(self, response: Any, request: Any) -> None:
        self.responses["total"] += 1
        if response.status in BLOCKED_STATUSES:
            self.responses["blocked"] += 1
        elif response.status >= 400:
            self.responses["error"] += 1
        elif response.status == 200 and not response.body:
            self.responses["empty"] += 1

    def report_processed(self, run_id: int, reporter: str) -> None:
        """A processor's figures: the items it stored, rejected, held or could not read, under
        *reporter*. Pages and responses are the fetchers' (a processor's responses come from
        the stream, already counted once), and so is the check."""
        figures = {
            k: v
            for k, v in self.snapshot().items()
            if k != "pages" and not k.startswith(("responses/", "revisit/", "run/")) and k != "gone"
        }
        try:
            run_figures.write(
                engine.scheduler(self.crawler).server, self.crawler.spider.name, run_id, reporter, figures
            )
        except Exception as exc:
            logger.warning("Could not report this processor's quality figures for run %d: %s", run_id, exc)

    def processor_closed(self, spider: Any, reason: str) -> None:
        self._say_unreadable()

    def snapshot(self) -> dict[str, float]:
        """This node's figures for the run, cumulative."""
        stats = self.crawler.stats.get_stats()
        get = lambda key: float(stats.get(key, 0) or 0)  # noqa: E731
        exceptions = get("downloader/exception_count")
        figures = {
            **self.coverage.figures(),
            "items/stored": get("postgres/inserted") + get("postgres/updated") + get("postgres/unchanged"),
            "items/rejected": get("item_rejected_count"),
            "pages": get("response_received_count"),
            "responses/total": self.responses["total"] + exceptions,
            "responses/error": self.responses["error"] + exceptions,
            "responses/blocked": self.responses["blocked"] + get("scraping_api/blocked_retries"),
            "responses/empty": float(self.responses["empty"]),
            "dead_letters": get("dead_letters/count"),
        }
        for key, value in stats.items():
            if key.startswith("item_rejected_reasons/"):
                figures[f"rejects/{key.split('/', 1)[1]}"] = float(value)
            elif key.startswith(UNREADABLE_STAT):  # values on the page the cleaner could not read
                figures[f"unreadable/{key[len(UNREADABLE_STAT) :]}"] = float(value)
            elif key.startswith("quality/held_fields/"):  # items the live guard held (see .guard)
                figures[f"held/{key.rsplit('/', 1)[1]}"] = float(value)
        if self.revisit:
            # A revisit run is judged by what it meant to visit, against earlier revisit runs.
            figures["run/revisit"] = 1.0
            figures["revisit/expected_items"] = get("revisit/expected_items")
            figures["revisit/confirmed_items"] = get("revisit/confirmed_items")
        if "items/gone" in stats:  # rows the last node out marked gone (scraper.node.gone)
            figures["gone"] = get("items/gone")
        return figures

    # --- the run -----------------------------------------------------------------------------

    def _scheduler(self) -> Any:
        scheduler = engine.scheduler(self.crawler)
        if self.processor:
            return self._processor_view(scheduler)
        return scheduler if getattr(getattr(scheduler, "run", None), "run_id", 0) else None

    def _processor_view(self, scheduler: Any) -> Any:
        """What the live guard needs of the run, in a processor (no node of the run): Redis and
        the run of the entries it processes, whose baseline is read once that run is known."""
        run_id = int(self.crawler.stats.get_value("run/id") or 0)
        if not run_id or scheduler is None:
            return None
        if self._baseline_of != run_id:
            self._baseline_of = run_id
            self._read_baseline(self.crawler.spider.name, run_id)
        return SimpleNamespace(server=scheduler.server, run=SimpleNamespace(run_id=run_id))

    def run_id(self) -> int:
        scheduler = self._scheduler()
        return scheduler.run.run_id if scheduler is not None else 0

    def spider_opened(self, spider: Any) -> None:
        from twisted.internet import task

        run_id = self.run_id()
        if not run_id:
            return
        self._read_baseline(spider.name, run_id)
        self._loop = task.LoopingCall(self.report)
        self._loop.start(self.interval, now=False)

    def _read_baseline(self, spider: str, run_id: int) -> None:
        dsn = self.crawler.settings.get("DATABASE_URL")
        try:
            conn = store.connect(dsn)
            try:
                self.baseline = store.baseline(conn, spider, run_id, self.conf.baseline_runs, self.revisit)
                self.last = store.last_outcome(conn, spider, run_id)
            finally:
                conn.close()
        except Exception as exc:  # the expectations in the metrics wait; the crawl does not
            logger.warning("Could not read the quality record of earlier runs of %s: %s", spider, exc)

    def report(self) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        try:
            run_figures.write(
                scheduler.server,
                self.crawler.spider.name,
                scheduler.run.run_id,
                scheduler.nodes.node_id,
                self.snapshot(),
            )
        except Exception as exc:
            logger.warning("Could not report this node's quality figures for the run: %s", exc)

    def spider_closed(self, spider: Any, reason: str) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._say_unreadable()
        scheduler = self._scheduler()
        if scheduler is None:
            return
        self.report()
        run_id, ended = scheduler.run.run_id, getattr(scheduler, "run_outcome", "")
        if ended == "stopped":
            logger.info(
                "Data quality of run %d of %s: not checked yet (stopped); checked when it finishes", run_id, spider.name
            )
            return
        if ended != "finished":
            return  # other nodes go on; the last one out checks the run
        if reason != "finished":
            logger.info(
                "Data quality of run %d of %s: not checked (it ended with %r), and never a baseline",
                run_id,
                spider.name,
                reason,
            )
            return
        try:
            self.check(spider, scheduler, run_id)
        except Exception as exc:
            logger.error("Could not check the data quality of run %d of %s: %s", run_id, spider.name, exc)

    def check(self, spider: Any, scheduler: Any, run_id: int) -> None:
        current = run_figures.summed(scheduler.server, spider.name, run_id)
        conn = store.connect(self.crawler.settings.get("DATABASE_URL"))
        try:
            gone = store.gone_column(conn, spider.name, run_id)
            if gone is not None:
                current["gone"] = gone
            baseline = store.baseline(conn, spider.name, run_id, self.conf.baseline_runs, self.revisit)
            checks = run_checks(
                current,
                [f for _, f in baseline],
                expectations(spider, current, baseline),
                self.conf,
                expects_items=bool(getattr(spider, "expects_items", True)),
            )
            checks += price_checks(conn, spider.name, run_id, stored_item_types(), current, self.conf)
            checks += guard_checks(run_break(scheduler.server, spider.name, run_id))
            checks += settle_waiting(conn, spider.name, run_id, checks)
            checks += repair_checks(conn, spider.name, run_id)
            result = outcome(checks)
            store.save(conn, spider.name, run_id, result, [r for r, _ in baseline], current, checks)
        finally:
            conn.close()
        failed = sum(c.passed is False for c in checks)
        self.last = (run_id, result, failed)
        stats = self.crawler.stats
        stats.set_value("quality/outcome", result)
        stats.set_value("quality/failed_checks", failed)
        if result == "degraded" and self.conf.fail_exit:
            stats.set_value("quality/exit_status", EXIT_STATUS)
        text = report.render(spider.name, run_id, result, [r for r, _ in baseline], checks)
        (logger.warning if result == "degraded" else logger.info)("%s", text)

    def _say_unreadable(self) -> None:
        """One line per field whose values were on the page and could not be read: stored empty,
        they would otherwise vanish quietly."""
        stats = self.crawler.stats.get_stats()
        items = coverage_figures.item_counts(self.coverage.figures())
        for key, count in sorted(stats.items()):
            if not key.startswith(UNREADABLE_STAT) or not count:
                continue
            name = key[len(UNREADABLE_STAT) :]
            of = items.get(name.split(".", 1)[0], 0.0)
            logger.warning(
                "Unreadable: %s could not be read in %d item(s)%s: stored empty (no format of the page's "
                "locale or date languages fits; see the rejects' reasons or set date_order / date_languages)",
                name,
                count,
                f" of {of:.0f} stored" if of else "",
            )

    # --- what the metrics show ---------------------------------------------------------------

    def expected_coverage(self) -> dict[tuple[str, str], float]:
        """(item type, field) -> the coverage the current run is expected to reach."""
        out: dict[tuple[str, str], float] = {}
        for item_type in self._types_seen():
            for field, expected in self.expected_for(item_type).items():
                out[(item_type, field)] = expected
        return out

    def expected_for(self, item_type: str, required: bool = True) -> dict[str, float]:
        """Field -> the coverage an item type's items are expected to reach in this run (without
        the required fields when *required* is false: their absence is a reject already)."""
        spider = getattr(self.crawler, "spider", None)
        if spider is None:
            return {}
        if self.processor:
            self._scheduler()  # the baseline of the run being processed
        expect = expectations(spider, {f"{coverage_figures.PREFIX}{item_type}/items": 1.0}, self.baseline).get(
            item_type
        )
        if expect is None:
            return {}
        before = [
            coverage_figures.ratios(f, {item_type: expect.fields})
            for _, f in self.baseline
            if coverage_figures.item_counts(f).get(item_type, 0) > 0
        ]
        out: dict[str, float] = {}
        for field in expect.fields:
            if field in expect.declared:
                out[field] = expect.declared[field]
            elif field in expect.required:
                if required:
                    out[field] = 1.0
            elif before:
                average = mean(r[(item_type, field)] for r in before)
                out[field] = max(0.0, average - self.conf.coverage_tolerance)
        return out

    def _types_seen(self) -> set[str]:
        return {k[len(coverage_figures.PREFIX) : -len("/items")] for k in self.coverage.counts if k.endswith("/items")}

    def baseline_items(self) -> float | None:
        return median(f.get("items/stored", 0.0) for _, f in self.baseline) if self.baseline else None


def expectations(
    spider: Any, current: dict[str, float], baseline: list[tuple[int, dict[str, float]]]
) -> dict[str, ItemExpectations]:
    """What each item type the run (or its baseline) stored is expected to show."""
    types = {t.__name__: t for t in stored_item_types()}
    names = set(coverage_figures.item_counts(current))
    for _, f in baseline:
        names |= set(coverage_figures.item_counts(f))
    out: dict[str, ItemExpectations] = {}
    for name in names:
        cls = types.get(name)
        if cls is None:  # a type this code no longer has: judge the fields it had
            seen = coverage_figures.fields_seen(current).get(name, set())
            out[name] = ItemExpectations(sorted(seen), [], {})
            continue
        fields = list(cls.columns())
        out[name] = ItemExpectations(
            fields, [f for f in fields if cls.fields[f].get("required")], declared_coverage(spider, cls)
        )
    return out


def guard_checks(broken: dict[str, list[float]]) -> list[Check]:
    """The live guard's break as failed checks: the items it held are not stored, so the stored
    items' coverage alone would call the run healthy."""
    return [
        Check(
            "guard",
            name,
            f"{'<=' if name.startswith('rejects/') else '>='} {expected:.2f}",
            f"{observed:.2f}",
            False,
            "broke while the run went: its changes were held",
        )
        for name, (observed, expected) in sorted(broken.items())
    ]
