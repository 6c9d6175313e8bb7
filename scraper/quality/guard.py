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
from collections import Counter, deque
from math import sqrt
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
from ..storage.upsert import Watch
from ..storage.writer import DatabaseUnavailable, WriteFailed
from .breaks import break_key, quality_broke, run_break  # noqa: F401  (run_break: read from here by others)
from .checks import _reject_fields, _reject_share
from .coverage import filled
from .coverage import item_counts as coverage_counts
from .monitor import UNREADABLE_STAT, QualityMonitor
from .settings import EXIT_STATUS, read_settings, value_shifts

logger = logging.getLogger(__name__)

MODES = ("hold", "stop", "continue")
# A rejects break's name ("rejects/price"); the stats of rejects per field.
_REJECTS = "rejects/"
_REASONS = "item_rejected_reasons/"
# A values break's name ("values/ProductItem.price"); the writer's stats of value pairs.
_VALUES = "values/"
_PAIRS = "values/pairs/"
_MOVED = "values/moved/"
CLOSE_REASON = "quality_break"
# How many items between two looks at the coverage: the look walks the fields, a count does not.
_EVERY = 10


def surely_above(share: float, count: int, limit: float) -> bool:
    """Whether a share seen over *count* items is above *limit* beyond chance: the lower bound of
    its 95 % Wilson interval is. One node of a fleet sees a part of a small run, where 2 broken
    pages in 12 items are 17 % though the shop's share is 10 %; half the pages broken are not."""
    if count <= 0 or share <= limit + 1e-9:
        return False
    z2 = 1.96**2
    centre = share + z2 / (2 * count)
    spread = 1.96 * sqrt(share * (1 - share) / count + z2 / (4 * count * count))
    return (centre - spread) / (1 + z2 / count) > limit + 1e-9


def watch_for(item_type: type[StoredItem], price_shift: float) -> Watch | None:
    """What of *item_type*'s changes waits for the run's verdict: prices (and numeric fields
    declaring ``shift``) moving more than their shift, and optional values going empty."""
    moves = value_shifts(item_type, price_shift)
    columns = item_type.columns()
    blanks = {
        name
        for name, meta in item_type.fields.items()
        if name in columns and name not in item_type.key and not meta.get("required")
    }
    companions = {
        currency: price
        for price, currency in item_type.price_fields().items()
        if price in moves and currency in columns
    }
    # Every field starts on probation: its changes wait until the guard has judged a look's worth.
    return Watch(moves, frozenset(blanks), companions, probation=set(moves))


def check_mode(settings: Any) -> str:
    """``QUALITY_ON_BREAK``: one of MODES; raises ConfigError naming it."""
    mode = (settings.get("QUALITY_ON_BREAK") or "hold").strip().lower()
    if mode not in MODES:
        raise ConfigError(f"QUALITY_ON_BREAK: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


class QualityGuardPipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        conf = self.conf = read_settings(crawler.settings)
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
        self._value_snapshots: deque[dict[str, tuple[int, int]]] = deque(maxlen=1000)
        self._valid_by_type: Counter[str] = Counter()
        self._loop: Any = None
        self._watches: dict[str, Watch] = {}  # item type name -> the writer's watch of it

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
            if self.mode != "continue" and self._monitor() is not None:
                # A run that judges itself keeps its implausible changes waiting for the verdict.
                shift = self.conf.price_shift

                def watch(item_type: type[StoredItem]) -> Watch | None:
                    found = self._watches.get(item_type.__name__)
                    if found is None:
                        found = self._watches[item_type.__name__] = watch_for(item_type, shift)
                        self._doubt(item_type.__name__, found)
                    return found

                self._writer().set_watch(watch)

    def _tick(self) -> None:
        self._read_fleet()
        if not (self.mode == "continue" and self.held):
            self._look_rejects()
            self._look_values()
            self._look_unreadable()

    def process_item(self, item: Any) -> Any:
        if not self.enabled or self.mode == "continue" and self.held or not isinstance(item, StoredItem):
            return item
        self._valid += 1
        kind = type(item)
        self._valid_by_type[kind.__name__] += 1
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
            if self.held and self.mode != "continue" and self.fail_exit:
                # Every node of a broken run exits non-zero, not only the one that checks it.
                self.crawler.stats.set_value("quality/outcome", "degraded")
                self.crawler.stats.set_value("quality/exit_status", EXIT_STATUS)

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
            self._rise = self.conf.rejects_rise
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
        # A baseline without a single reject still says what is normal: none. Without a
        # baseline (a first run) there is no live row a reject could hide.
        monitor = self._monitor()
        if count < self.min_items or monitor is None or not monitor.baseline:
            return
        self._limits()
        broken = {}
        for field, n in by_field.items():
            share = (n - start[2].get(field, 0)) / count
            limit = self._reject_limits.get(field, 0.0) + self._rise
            name = f"{_REJECTS}{field}"
            if surely_above(share, count, limit) and name not in self.held:
                broken[name] = [round(share, 4), round(limit, 4)]
        if broken:
            self._break(broken, source="this node")

    def _look_values(self) -> None:
        """A field whose known values moved beyond their shift in more than ``QUALITY_PRICE_JUMPS``
        of the pairs over the window breaks the run: a bundle price on half the pages, a misread
        separator. Its waiting changes then stay held at the end (see :mod:`.settle`)."""
        stats = self.crawler.stats.get_stats()
        now = {
            k[len(_PAIRS) :]: (int(v), int(stats.get(f"{_MOVED}{k[len(_PAIRS) :]}", 0) or 0))
            for k, v in stats.items()
            if k.startswith(_PAIRS)
        }
        if not now:
            return
        self._value_snapshots.append(now)
        jumps = self.conf.price_jumps
        broken = {}
        for field, (pairs, moved) in now.items():
            # The newest snapshot at least a window of pairs back, else the run's start.
            start = (0, 0)
            for snap in reversed(self._value_snapshots):
                earlier = snap.get(field, (0, 0))
                if pairs - earlier[0] >= self.window:
                    start = earlier
                    break
            count = pairs - start[0]
            name = f"{_VALUES}{field}"
            if count < self.min_items or name in self.held:
                continue
            share = (moved - start[1]) / count
            if surely_above(share, count, jumps):
                broken[name] = [round(share, 4), jumps]
            elif share <= jumps and pairs >= self.window:
                self._trust(field)
        if broken:
            self._break(broken, source="this node")

    def _look_unreadable(self) -> None:
        """A field whose values the cleaner cannot read (stored empty) in a larger share of the
        items than the baseline runs' breaks the run like missing coverage: its items that lack it
        are held. A first run has no stored value to keep: the run-end check says it."""
        monitor = self._monitor()
        if monitor is None or not monitor.baseline:
            return
        stats = self.crawler.stats.get_stats()
        conf = self.conf
        broken = {}
        for key, count in stats.items():
            if not key.startswith(UNREADABLE_STAT):
                continue
            name = key[len(UNREADABLE_STAT) :]
            type_name = name.split(".", 1)[0]
            items = self._valid_by_type.get(type_name, 0)
            if items < self.min_items or name in self.held:
                continue
            before = [
                min(1.0, f.get(f"unreadable/{name}", 0.0) / n)
                for _, f in monitor.baseline
                if (n := coverage_counts(f).get(type_name, 0.0)) > 0
            ]
            limit = max(conf.unreadable, (median(before) if before else 0.0) + conf.coverage_tolerance)
            share = min(1.0, int(count) / items)
            if surely_above(share, items, limit):
                broken[name] = [round(1 - share, 4), round(1 - limit, 4)]
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

    def _trust(self, name: str) -> None:
        """A look's worth of *name*'s ("Type.field") pairs moved no more than a healthy run's:
        its changes are written as they come from now on."""
        type_name, _, field = name.partition(".")
        watch = self._watches.get(type_name)
        if watch is not None and field in watch.probation and field not in watch.broken:
            watch.probation.discard(field)
            self.crawler.stats.set_value(f"quality/trusted/{name}", self._valid)

    def _doubt(self, type_name: str, watch: Watch | None) -> None:
        """Every change of the fields broken in this run waits for the verdict (and stays held)."""
        if watch is None:
            return
        for name in self.held:
            if name.startswith(_REJECTS):
                field = name[len(_REJECTS) :]
            else:
                broken_type, _, field = name.removeprefix(_VALUES).partition(".")
                if broken_type != type_name:
                    continue
            if field in watch.moves or field in watch.blanks or field in watch.companions:
                watch.broken.add(field)
                price = watch.companions.get(field)
                if price is not None:
                    watch.broken.add(price)

    def _break(self, broken: dict[str, list[float]], source: str) -> None:
        self.held.update(broken)
        for type_name, watch in self._watches.items():
            self._doubt(type_name, watch)
        # What acts on a break besides holding (a repair of the field) hears of it here.
        self.crawler.signals.send_catch_log(quality_broke, broken=dict(broken))
        by_type: dict[str, list[str]] = {}
        for name in self.held:
            if "/" not in name:  # a coverage break; a rejects or values break holds no item
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
        coverage = [f"{k} {v[0]:.0%} < {v[1]:.0%}" for k, v in sorted(broken.items()) if "/" not in k]
        rejects = [
            f"{k[len(_REJECTS) :]} {v[0]:.0%} > {v[1]:.0%}" for k, v in sorted(broken.items()) if k.startswith(_REJECTS)
        ]
        values = [
            f"{k[len(_VALUES) :]} {v[0]:.0%} > {v[1]:.0%}" for k, v in sorted(broken.items()) if k.startswith(_VALUES)
        ]
        shown = "; ".join(
            ([f"field coverage {', '.join(coverage)}"] if coverage else [])
            + ([f"items rejected for {', '.join(rejects)}"] if rejects else [])
            + ([f"known values moved for {', '.join(values)}"] if values else [])
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
