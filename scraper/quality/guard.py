"""The live quality guard: a run whose layout broke cannot damage what is stored.

The run-end checks (:mod:`.monitor`) say a run was degraded once it is over, after its blanks
were written and its unseen rows marked gone. The guard watches the valid items as they come out of
validation, before they are stored, per item type: once ``QUALITY_MIN_ITEMS`` items of a type are in, an optional
field whose share of filled items falls under its expectation (declared, or the baseline runs'
average less ``QUALITY_COVERAGE_TOLERANCE``, as the run-end coverage check takes it) breaks the
run. (A required field missing is a reject already; its spike is the run-end checks'.) What follows is ``QUALITY_ON_BREAK``:

* ``hold`` (the default): the crawl goes on and stores what is healthy; an item that lacks a
  broken field is held with the run (:mod:`scraper.storage.held`: its stored row, with the
  value, is left as it was, until ``scrapy runs SPIDER --apply RUN`` or ``--discard RUN``), the
  run's gone-marks are held the same way, and the values blanked before the break was seen are
  written back at the end (:mod:`.restore`);
* ``stop``: the spider closes (``quality_break``): no more pages or credits spent on it;
* ``continue``: only said (the run-end checks judge it).

A break is fleet-wide: the node that sees it writes it to the run's key in Redis, and every
node reads that key every ``QUALITY_GUARD_POLL`` seconds, so all of them hold. It is said once
per node, with the fields and the numbers; the run-end check reports it as a failed ``guard``
check, so the run is degraded.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from statistics import median
from typing import Any

from scrapy.exceptions import DropItem
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet import task

from ..config import ConfigError, get_float, get_int
from ..items.base import StoredItem
from ..pipelines.unstored import set_aside
from ..runs_hook import current_run_id
from ..storage import held
from ..storage.owner import writer_for
from ..storage.writer import DatabaseUnavailable, WriteFailed
from .breaks import break_key, run_break  # noqa: F401  (run_break: read from here by others)
from .checks import _reject_fields, _reject_share
from .coverage import filled
from .monitor import QualityMonitor
from .settings import EXIT_STATUS, read_settings

logger = logging.getLogger(__name__)

MODES = ("hold", "stop", "continue")
# A rejects break's name ("rejects/price"); the stats of rejects per field.
_REJECTS = "rejects/"
_REASONS = "item_rejected_reasons/"
CLOSE_REASON = "quality_break"
# How many items between two looks at the coverage: the look walks the fields, a count does not.
_EVERY = 10


def check_mode(settings: Any) -> str:
    """``QUALITY_ON_BREAK``: one of MODES; raises ConfigError naming it."""
    mode = (settings.get("QUALITY_ON_BREAK") or "hold").strip().lower()
    if mode not in MODES:
        raise ConfigError(f"QUALITY_ON_BREAK: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


class QualityGuardPipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        conf = read_settings(crawler.settings)
        self.mode = check_mode(crawler.settings)
        self.enabled = conf.enabled
        self.fail_exit = conf.fail_exit
        self.min_items = max(conf.min_items, 1)
        self.poll = get_float(crawler.settings, "QUALITY_GUARD_POLL", 2.0, minimum=0.1)
        # Item type -> [items, {field: filled}], and its expectations (field -> share), read once.
        self._counts: dict[type, list[Any]] = {}
        self._expected: dict[type, dict[str, float]] = {}
        self.held: dict[str, list[float]] = {}  # "Type.field" -> [coverage, expected]
        self._held_fields: dict[str, tuple[str, ...]] = {}  # item type name -> its broken fields
        self._said = False
        self._rejects: Any = None
        # Judged over the last QUALITY_GUARD_WINDOW items (a break halfway through a long run
        # shows at once, not once it has outweighed everything before it): snapshots of the
        # counts every _EVERY items, per type; and of the valid and rejected items per look.
        self.window = get_int(crawler.settings, "QUALITY_GUARD_WINDOW", 200, minimum=_EVERY)
        self._snapshots: dict[type, deque[tuple[int, dict[str, int]]]] = {}
        self._valid = 0
        self._reject_snapshots: deque[tuple[int, int, dict[str, int]]] = deque(maxlen=1000)
        self._reject_limits: dict[str, float] | None = None
        self._loop: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> QualityGuardPipeline:
        return cls(crawler)

    # --- where the run is ------------------------------------------------------------------

    def _monitor(self) -> QualityMonitor | None:
        return self.crawler.get_extension(QualityMonitor)

    def _scheduler(self) -> Any:
        monitor = self._monitor()
        return monitor._scheduler() if monitor is not None else None

    def _expectations(self, item_type: type) -> dict[str, float]:
        found = self._expected.get(item_type)
        if found is None:
            monitor = self._monitor()
            # Required fields are validation's: an item here has them all.
            found = monitor.expected_for(item_type.__name__, required=False) if monitor is not None else {}
            # A field expected at 0 can never fall under it.
            found = self._expected[item_type] = {f: e for f, e in found.items() if e > 0}
        return found

    # --- per item ---------------------------------------------------------------------------

    def open_spider(self) -> None:
        if self.enabled:
            # The fleet's break and the rejects are looked at on a timer: a run whose every item
            # is rejected sends none here.
            self._loop = task.LoopingCall(self._tick)
            self._loop.start(self.poll, now=False)

    def _tick(self) -> None:
        self._read_fleet()
        if not (self.mode == "continue" and self.held):
            self._look_rejects()

    def process_item(self, item: Any) -> Any:
        if not self.enabled or self.mode == "continue" and self.held or not isinstance(item, StoredItem):
            return item
        self._valid += 1
        kind = type(item)
        expected = self._expectations(kind)
        if not expected:
            return item
        entry = self._counts.get(kind)
        if entry is None:
            entry = self._counts[kind] = [0, dict.fromkeys(expected, 0)]
        values = item._values
        entry[0] += 1
        fields = entry[1]
        for field in fields:
            if filled(values.get(field)):
                fields[field] += 1
        if entry[0] % _EVERY == 0 or entry[0] == self.min_items:
            self._look(kind, entry, expected)
        held = self._held_fields.get(kind.__name__)
        if held and self.mode == "hold":
            missing = [f for f in held if not filled(values.get(f))]
            if missing:
                stats = self.crawler.stats
                stats.inc_value("quality/held_items")
                for f in missing:
                    stats.inc_value(f"quality/held_fields/{f}")
                reasons = [
                    f"{f}: held: empty while the run's {kind.__name__}.{f} coverage is broken "
                    f"(QUALITY_ON_BREAK=hold keeps the stored value)"
                    for f in missing
                ]
                return deferred_from_coro(self._hold(item, reasons))
        return item

    async def _hold(self, item: StoredItem, reasons: list[str]) -> None:
        """Keep *item* aside with the run (see :mod:`scraper.storage.held`) and drop it here."""
        record = held.item_record(self.crawler.spider.name, current_run_id(self.crawler) or 0, item, reasons)
        try:
            await maybe_deferred_to_future(self._writer().add_reject(record))
        except WriteFailed as exc:
            raise set_aside(self.crawler, item, exc, stop=isinstance(exc, DatabaseUnavailable)) from None
        raise DropItem(f"Held ({'; '.join(reasons)})", log_level="INFO")

    def close_spider(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        # A node that stored its last item before the break was written still says it: the
        # run it belongs to broke, and its operator reads this node's log too.
        if self.enabled:
            self._read_fleet()

    def _writer(self) -> Any:
        if self._rejects is None:
            self._rejects = writer_for(self.crawler)
        return self._rejects

    def _look(self, kind: type, entry: list[Any], expected: dict[str, float]) -> None:
        items, fields = entry
        snapshots = self._snapshots.get(kind)
        if snapshots is None:
            snapshots = self._snapshots[kind] = deque(maxlen=self.window // _EVERY + 1)
        # The window starts at the oldest snapshot once the run is longer than the window.
        start, before = snapshots[0] if len(snapshots) == snapshots.maxlen else (0, {})
        snapshots.append((items, dict(fields)))
        count = items - start
        if count < self.min_items:
            return
        broken = {
            f"{kind.__name__}.{f}": [round((fields[f] - before.get(f, 0)) / count, 4), e]
            for f, e in expected.items()
            if (fields[f] - before.get(f, 0)) / count < e - 1e-9 and f"{kind.__name__}.{f}" not in self.held
        }
        if broken:
            self._break(broken, source="this node")

    def _limits(self) -> dict[str, float]:
        """Field -> the share of items rejected for it the baseline runs allow (their median plus
        ``QUALITY_REJECTS_RISE``); empty without a baseline (nothing says what is normal)."""
        if self._reject_limits is None:
            monitor = self._monitor()
            baseline = [f for _, f in monitor.baseline] if monitor is not None else []
            limits: dict[str, float] = {}
            if baseline:
                fields = set().union(*(_reject_fields(f) for f in baseline))
                limits = {f: median(_reject_share(b, f) for b in baseline) for f in fields}
            self._reject_limits = limits
            self._rise = read_settings(self.crawler.settings).rejects_rise
        return self._reject_limits

    def _look_rejects(self) -> None:
        """A field's share of rejected items over the window above the baseline's breaks the run:
        the pages whose items are rejected still hold live rows, which must not be marked gone."""
        stats = self.crawler.stats.get_stats()
        rejected = int(stats.get("item_rejected_count", 0) or 0)
        by_field = {k[len(_REASONS) :]: int(v) for k, v in stats.items() if k.startswith(_REASONS)}
        self._reject_snapshots.append((self._valid, rejected, by_field))
        total = self._valid + rejected
        # The newest snapshot at least a window back, else the run's start.
        start = (0, 0, {})
        for snap in reversed(self._reject_snapshots):
            if total - snap[0] - snap[1] >= self.window:
                start = snap
                break
        count = total - start[0] - start[1]
        if count < self.min_items or not self._limits():
            return
        broken = {}
        for field, n in by_field.items():
            share = (n - start[2].get(field, 0)) / count
            limit = self._reject_limits.get(field, 0.0) + self._rise
            name = f"{_REJECTS}{field}"
            if share > limit + 1e-9 and name not in self.held:
                broken[name] = [round(share, 4), round(limit, 4)]
        if broken:
            self._break(broken, source="this node")

    def _read_fleet(self) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        try:
            found = run_break(scheduler.server, self.crawler.spider.name, scheduler.run.run_id)
        except Exception:  # Redis' own outage is said by the scheduler; the guard looks again
            return
        new = {k: v for k, v in found.items() if k not in self.held}
        if new:
            self._break(new, source="another node")

    def _break(self, broken: dict[str, list[float]], source: str) -> None:
        self.held.update(broken)
        by_type: dict[str, list[str]] = {}
        for name in self.held:
            if "." in name:  # a coverage break; a rejects break holds no item (they are rejects)
                type_name, field = name.split(".", 1)
                by_type.setdefault(type_name, []).append(field)
        self._held_fields = {name: tuple(fields) for name, fields in by_type.items()}
        stats = self.crawler.stats
        stats.set_value("quality/break", 1)
        stats.set_value("quality/broken_fields", ",".join(sorted(self.held)))
        scheduler = self._scheduler()
        if scheduler is not None and source == "this node":
            try:
                key = break_key(self.crawler.spider.name, scheduler.run.run_id)
                pipe = scheduler.server.pipeline(transaction=False)
                pipe.hset(key, mapping={k: json.dumps(v) for k, v in broken.items()})
                pipe.expire(key, 7 * 24 * 3600)
                pipe.execute()
            except Exception as exc:
                logger.error("Could not tell the fleet that the run's quality broke: %s", exc)
        coverage = [f"{k} {v[0]:.0%} < {v[1]:.0%}" for k, v in sorted(broken.items()) if not k.startswith(_REJECTS)]
        rejects = [
            f"{k[len(_REJECTS) :]} {v[0]:.0%} > {v[1]:.0%}" for k, v in sorted(broken.items()) if k.startswith(_REJECTS)
        ]
        shown = "; ".join(
            ([f"field coverage {', '.join(coverage)}"] if coverage else [])
            + ([f"items rejected for {', '.join(rejects)}"] if rejects else [])
        )
        action = {
            "hold": "holding: items without these fields are held, nothing is marked gone",
            "stop": "stopping the spider (QUALITY_ON_BREAK=stop)",
            "continue": "continuing (QUALITY_ON_BREAK=continue)",
        }[self.mode]
        logger.warning("Data quality broke in this run (seen by %s): %s; %s", source, shown, action)
        if self.mode == "stop" and not self._said:
            self._said = True
            stats.set_value("quality/outcome", "degraded")
            if self.fail_exit:
                stats.set_value("quality/exit_status", EXIT_STATUS)
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(self.crawler.engine.close_spider_async(reason=CLOSE_REASON)).addErrback(
                lambda failure: logger.error("Could not stop the spider: %s", failure.value)
            )
