"""Repair in a crawl: when the guard sees a field break, learn where it went from the pages at hand
and the values already stored, and read it from there — only once that is verified.

The middleware sits next to provenance (:mod:`.middleware`), so it sees each item as its callback
yielded it, with ``_sources``. It keeps the last ``REPAIR_PAGES`` pages that yielded exactly one
item of a type (their body and item: a product page, not a listing), per type, in memory: the
evidence a repair learns from, with no refetch and no archive needed.

When the guard breaks a field (``quality_broke``: coverage, a reject spike, values that moved,
unreadable values; this node's break or the fleet's), a worker thread takes those pages, the
stored values of their items that are stable (:mod:`.known`), and :func:`.induce.induce`: rules
that read exactly the stored value on the pages they learn from, misread none, and hold on pages
kept apart. The result, a repair or a refusal saying why, goes to the ``repairs`` table
(:mod:`.store`; the first node to write one for the run wins, the others take it). An active
repair is applied to every later page of the type, in this run and the next ones, on every node
(each reads the table every ``REPAIR_POLL`` seconds): the field is read by the repair's rules
from the page the spider already parsed, and its source becomes ``repair:ID``. A page none of
the rules reads keeps what the spider read, which the guard judges as before.

``REPAIR_APPLY=review`` records verified repairs as pending until ``scrapy repairs SPIDER
--accept ID``. Items the guard held before the repair stay held with the run; with the archive
on, ``scrapy reprocess SPIDER --run RUN`` reads them again through the repair.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall

from ..config import get_bool, get_choice, get_float, get_int
from ..items import stored_item_types
from ..items.base import StoredItem
from ..quality.breaks import quality_broke
from ..runs_hook import current_run_id
from ..runtime.worker_threads import defer_to_thread
from ..shared_state import is_crawl_node
from . import known, store
from .candidates import candidates
from .cleaner import FieldCleaner
from .evidence import Evidence, Reader
from .induce import Check, Refusal, Repair, induce
from .middleware import ProvenanceMiddleware
from .page import Page, parse
from .provenance import MISSING
from .rules import Rule

logger = logging.getLogger(__name__)

SOURCE = "repair:"


@dataclass
class _Seen:
    url: str
    body: bytes
    item: StoredItem


@dataclass
class _Active:
    row: store.RepairRow
    rules: list[Rule]


class RepairMiddleware:
    def __init__(self, crawler: Any) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.stats = crawler.stats
        self.dsn = settings["DATABASE_URL"]
        self.apply = get_choice(settings, "REPAIR_APPLY", choices=("auto", "review"))
        self.pages = get_int(settings, "REPAIR_PAGES", minimum=10)
        self.min_pages = get_int(settings, "REPAIR_MIN_PAGES", minimum=3)
        self.stable_runs = get_int(settings, "REPAIR_STABLE_RUNS", minimum=1)
        self.tries = get_int(settings, "REPAIR_TRIES", minimum=1)
        self.poll = get_float(settings, "REPAIR_POLL", minimum=0.1)
        self.node = socket.gethostname()
        self.seen: dict[type, deque[_Seen]] = {}
        self.active: dict[tuple[str, str], _Active] = {}
        # (type name, field) -> [tries, pages seen at the last try, trigger]; busy: learning now.
        self.wanted: dict[tuple[str, str], list[Any]] = {}
        self.busy: set[tuple[str, str]] = set()
        # Targets whose repair this node saw verified (active or waiting for review): a break
        # matched again (a new item type's first page) does not learn them again, nor one an
        # operator rejected or reverted since.
        self.settled: set[tuple[str, str]] = set()
        # The breaks heard so far, in order: a type this node meets later (a node that joined a
        # broken run before its first page of the type) is matched to them then.
        self.breaks: dict[str, None] = {}
        self.added: Counter[type] = Counter()
        self._loop: LoopingCall | None = None
        self._provenance: Any = None
        self.spider_name = ""

    @classmethod
    def from_crawler(cls, crawler: Any) -> RepairMiddleware:
        settings = crawler.settings
        if not get_bool(settings, "REPAIR_ENABLED"):
            raise NotConfigured("REPAIR_ENABLED is off")
        if not (is_crawl_node(settings) and settings.get("DATABASE_URL")):
            raise NotConfigured("repairs are learnt and kept by crawl nodes with a database")
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw.broke, signal=quality_broke)
        return mw

    # -- the repairs in force -------------------------------------------------------------------
    async def spider_opened(self, spider: Any) -> None:
        self.spider_name = spider.name
        # Read before the first page: a repair in force applies from the run's first item.
        await maybe_deferred_to_future(self._reload())
        self._loop = LoopingCall(self._reload)
        self._loop.start(self.poll, now=False)

    async def spider_closed(self, spider: Any) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        # A field still broken gets a last try with every page at hand: tries during the run may
        # have come with too few pages of a template; a repair learnt now serves the next run.
        for target in [t for t in self.wanted if t not in self.active and t not in self.busy]:
            kind = _type_named(target[0])
            pages = list(self.seen.get(kind, ())) if kind is not None else []
            if len(pages) >= self.min_pages and self.wanted[target][1] != self.added[kind]:
                self.wanted[target][1] = self.added[kind]
                await maybe_deferred_to_future(self._learn(kind, target[1], pages, self.wanted[target][2]))
        for (type_name, field), entry in sorted(self.active.items()):
            applied = self.stats.get_value(f"repair/applied/{type_name}.{field}", 0)
            if applied:
                logger.info(
                    "Repair %d of %s.%s read %d item(s) in this node's part of the run",
                    entry.row.id,
                    type_name,
                    field,
                    applied,
                )

    def _reload(self) -> Any:
        return defer_to_thread(self._read_active, self.spider_name).addCallbacks(self._took, self._unread)

    def _read_active(self, spider: str) -> list[store.RepairRow]:
        conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="repairs")
        try:
            with conn, conn.cursor() as cur:
                store.ensure(cur)
                return store.active(cur, spider)
        finally:
            conn.close()

    def _took(self, rows: list[store.RepairRow]) -> None:
        found = {}
        for row in rows:
            try:
                found[(row.item_type, row.field)] = _Active(row, [Rule.parse(r) for r in row.rules])
            except Exception as exc:  # a rule written by hand that does not parse: said, not applied
                logger.error("Repair %d of %s: its rules do not parse (%s): not applied", row.id, row.name, exc)
        for key, entry in found.items():
            if key not in self.active or self.active[key].row.id != entry.row.id:
                logger.warning(
                    "Repair %d in force: %s is read by %s (was %s)",
                    entry.row.id,
                    entry.row.name,
                    " | ".join(entry.row.rules),
                    entry.row.old_selector or "unknown",
                )
        for key in set(self.active) - set(found):
            logger.warning("Repair %d of %s.%s is no longer in force", self.active[key].row.id, *key)
        self.active = found
        self.settled.update(found)
        self.stats.set_value("repair/active", len(found))

    def _unread(self, failure: Any) -> None:
        self.stats.inc_value("repair/read_failed")
        logger.warning("Could not read the repairs in force (%s): tried again in %.0f s", failure.value, self.poll)

    # -- each page --------------------------------------------------------------------------------
    def process_spider_output(self, response: Any, result: Iterable[Any]) -> Iterator[Any]:
        page = _PageOut(self, response)
        for obj in result:
            page.take(obj)
            yield obj
        page.end()

    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        page = _PageOut(self, response)
        async for obj in result:
            page.take(obj)
            yield obj
        page.end()

    def _keep(self, url: str, body: bytes, item: StoredItem) -> None:
        kind = type(item)
        found = self.seen.get(kind)
        if found is None:
            found = self.seen[kind] = deque(maxlen=self.pages)
            if self.breaks:
                self._want(self.breaks)
        found.append(_Seen(url, body, item))
        self.added[kind] += 1
        if self.wanted:
            self._retry(kind)

    def provenance(self) -> Any:
        """The provenance middleware, whose counts a repaired field moves to its repair."""
        if self._provenance is None:
            found = [
                mw
                for mw in getattr(getattr(self.crawler.engine, "scraper", None), "spidermw", None).middlewares
                if isinstance(mw, ProvenanceMiddleware)
            ]
            self._provenance = found[0] if found else False
        return self._provenance or None

    # -- a break ----------------------------------------------------------------------------------
    def broke(self, broken: dict[str, Any]) -> None:
        self.breaks.update(dict.fromkeys(broken))
        self._want(broken)

    def _want(self, names: Iterable[str]) -> None:
        for name in names:
            for target in self._targets(name):
                if target in self.active or target in self.wanted or target in self.settled:
                    continue
                self.wanted[target] = [0, -1, name]
                kind = _type_named(target[0])
                if kind is not None:
                    self._retry(kind)

    def _targets(self, name: str) -> list[tuple[str, str]]:
        """(item type, field) of a break's name."""
        if name.startswith("rejects/"):
            field = name[len("rejects/") :]
            return [(kind.__name__, self._price_of(kind, field)) for kind in self.seen if field in kind.fields]
        name = name.split("/", 1)[1] if "/" in name else name
        type_name, _, field = name.partition(".")
        kind = _type_named(type_name)
        return [(type_name, self._price_of(kind, field) if kind is not None else field)] if field else []

    def _price_of(self, kind: type[StoredItem], field: str) -> str:
        """A currency field is read with its price: repairing the price repairs it."""
        for price, currency in kind.price_fields().items():
            if currency == field:
                return price
        return field

    def _retry(self, kind: type) -> None:
        """Learn each wanted field of *kind* once enough pages are at hand, and again (up to
        ``REPAIR_TRIES``) once as many new ones came as a try needs."""
        for target, entry in list(self.wanted.items()):
            if target[0] != kind.__name__ or target in self.busy or target in self.active:
                continue
            tries, last, trigger = entry
            added = self.added[kind]
            pages = self.seen.get(kind, ())
            if tries >= self.tries or len(pages) < self.min_pages or (last >= 0 and added - last < self.min_pages):
                continue
            entry[0], entry[1] = tries + 1, added
            self._learn(kind, target[1], list(pages), trigger)

    def _learn(self, kind: type[StoredItem], field: str, pages: list[_Seen], trigger: str) -> Deferred:
        target = (kind.__name__, field)
        self.busy.add(target)
        run_id = int(current_run_id(self.crawler) or 0)
        keys = [[page.item._values.get(k) for k in kind.key] for page in pages]
        current = _current_rule(pages, field)
        cleaner = FieldCleaner(self.crawler, kind, field)
        self.stats.inc_value("repair/tries")
        logger.info(
            "Learning where %s.%s went from %d page(s) (trigger: %s)", kind.__name__, field, len(pages), trigger
        )

        def done(row: store.RepairRow | None) -> None:
            self.busy.discard(target)
            if row is None:
                return
            if row.status in ("active", "pending"):
                self.settled.add(target)
            if row.status in ("active", "pending") and row.node == self.node:
                self.stats.inc_value("repair/learnt")
            if row.status == "active":
                self.wanted.pop(target, None)
                self._took([entry.row for key, entry in self.active.items() if key != target] + [row])
            elif row.status == "pending":
                self.wanted.pop(target, None)
                logger.warning(
                    "Repair %d of %s verified, waiting for `scrapy repairs %s --accept %d` (REPAIR_APPLY=review)",
                    row.id,
                    row.name,
                    self.spider_name,
                    row.id,
                )
            else:
                self.stats.inc_value("repair/refused")
                logger.warning("No repair of %s.%s: %s; its items stay held", kind.__name__, field, row.reason)

        def failed(failure: Any) -> None:
            self.busy.discard(target)
            self.stats.inc_value("repair/failed")
            logger.error("Could not learn a repair of %s.%s: %s", kind.__name__, field, failure.value)

        return defer_to_thread(
            self._learn_in_thread, kind, field, pages, keys, current, cleaner, run_id, trigger
        ).addCallbacks(done, failed)

    def _learn_in_thread(
        self,
        kind: type[StoredItem],
        field: str,
        pages: list[_Seen],
        keys: list[list[Any]],
        current: str | None,
        cleaner: FieldCleaner,
        run_id: int,
        trigger: str,
    ) -> store.RepairRow:
        conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="repairs")
        try:
            with conn, conn.cursor() as cur:
                store.ensure(cur)
                since = known.threshold(cur, self.spider_name, kind.__name__, field, run_id, self.stable_runs)
                values = known.stable_values(cur, kind, field, keys, since)
                if cleaner.companion is not None:
                    # Known as the cleaner reads it: the amount with its stored, stable currency.
                    currencies = known.stable_values(cur, kind, cleaner.companion, keys, since)
                    values = {k: (v, currencies[k]) for k, v in values.items() if k in currencies}
                current = current or known.last_selector(cur, self.spider_name, kind.__name__, field, run_id)
            evidence = _present(
                [Evidence(page.url, page.body, values.get(known.key_text(key))) for page, key in zip(pages, keys)],
                cleaner,
            )
            try:
                current_rule = Rule.parse(current) if current else None
            except Exception:
                current_rule = None
            result = induce(field, evidence, cleaner, current=current_rule, min_pages=self.min_pages)
            row = _row(self, kind, field, run_id, trigger, current, result, evidence)
            with conn, conn.cursor() as cur:
                undone = store.undone_with(cur, row) if row.rules else None
            if undone is not None:
                # An operator set these very rules aside: they are not learnt again.
                row.status, row.reason = "refused", f"the same rules were {undone.status} (repair {undone.id})"
            with conn, conn.cursor() as cur:
                return store.save(cur, row)
        finally:
            conn.close()


class _PageOut:
    """One response's output: its items of a type with a repair in force read again, and the page
    kept as evidence when it yielded exactly one item of a type."""

    __slots__ = ("items", "mw", "page", "response")

    def __init__(self, mw: RepairMiddleware, response: Any) -> None:
        self.mw, self.response = mw, response
        self.items: list[StoredItem] | None = None
        self.page: Page | None = None

    def take(self, obj: Any) -> None:
        if not isinstance(obj, StoredItem):
            return
        if self.items is None:
            self.items = [obj]
        else:
            self.items.append(obj)
        mw = self.mw
        if mw.active:
            kind = type(obj).__name__
            for (type_name, field), entry in mw.active.items():
                if type_name == kind and field in obj.fields:
                    self._apply(obj, field, entry)

    def _apply(self, item: StoredItem, field: str, entry: _Active) -> None:
        if self.page is None:
            try:
                root = self.response.selector.root
            except Exception:  # not a text response: nothing to read
                root = None
            self.page = Page(self.response.url, root)
        raw = _read(entry.rules, self.page)
        name = entry.row.name
        stats = self.mw.stats
        if raw is None:
            stats.inc_value(f"repair/unread/{name}")
            return
        item[field] = raw
        sources = getattr(item, "_sources", None)
        if sources is None:
            sources = item._sources = {}
        old = sources.get(field, MISSING)
        new = sources[field] = f"{SOURCE}{entry.row.id}"
        stats.inc_value(f"repair/applied/{name}")
        stats.set_value("repair/applied_any", 1)
        provenance = self.mw.provenance()
        if provenance is not None:
            provenance.moved(entry.row.item_type, field, old, new)

    def end(self) -> None:
        items = self.items
        if not items:
            return
        kinds = Counter(type(i) for i in items)
        body = getattr(self.response, "body", b"")
        for item in items:
            if kinds[type(item)] == 1 and body:
                self.mw._keep(self.response.url, body, item)


def _present(evidence: list[Evidence], cleaner: FieldCleaner) -> list[Evidence]:
    """*evidence* with the stored value of each page where no node holds it any more set to
    None: that page changed its value with its layout (a price changed in the same run), so it
    can neither confirm nor contradict a rule; a rule must still read exactly one node there."""
    paired = cleaner.companion is not None
    # A price known with its currency is still on the page when its amount is, under any mark: a
    # node that reads it with the default currency where another is stored contradicts a rule.
    reader = Reader((lambda raw: (cleaner(raw) or (None,))[0]) if paired else cleaner)
    longest = max([200] + [3 * len(str(e.known)) for e in evidence if e.known is not None])
    out = []
    for e in evidence:
        wanted = e.known[0] if paired and e.known is not None else e.known
        if wanted is not None and not candidates(parse(e.url, e.html), wanted, reader, longest):
            e = Evidence(e.url, e.html, None)
        out.append(e)
    return out


def _read(rules: list[Rule], page: Page) -> str | None:
    for rule in rules:
        values = rule.values(page)
        if values:
            return values[0] if len(values) == 1 else None
    return None


def _current_rule(pages: list[_Seen], field: str) -> str | None:
    """The selector most of the pages' items took the field from, when it is one."""
    found = Counter(
        source
        for page in pages
        if (source := (getattr(page.item, "_sources", None) or {}).get(field))
        and not source.startswith(SOURCE)
        and source not in ("url", "request", "unknown", "constant", "missing")
        and ">>" not in source
        and not source.endswith("(derived)")
    )
    return found.most_common(1)[0][0] if found else None


def _type_named(name: str) -> type[StoredItem] | None:
    for kind in stored_item_types():
        if kind.__name__ == name:
            return kind
    return None


def _row(
    mw: RepairMiddleware,
    kind: type[StoredItem],
    field: str,
    run_id: int,
    trigger: str,
    current: str | None,
    result: Repair | Refusal,
    evidence: list[Evidence],
) -> store.RepairRow:
    stable = sum(1 for e in evidence if e.known is not None)
    common = dict(
        id=0,
        spider=mw.spider_name,
        item_type=kind.__name__,
        field=field,
        run_id=run_id,
        trigger=trigger,
        old_selector=current,
        node=mw.node,
    )
    if isinstance(result, Refusal) or result.unchanged:
        reason = (
            f"{result.reason}: {result.detail}"
            if isinstance(result, Refusal)
            else "the selector in use still reads every stable value: the values changed, not the page"
        )
        return store.RepairRow(
            status="refused",
            rules=[],
            evidence=stable,
            distinct_values=0,
            contradictions=0,
            validation={"pages": len(evidence)},
            reason=reason,
            **common,
        )
    checks = [f.validation for f in result.rules]
    total = Check(sum(c.ok for c in checks), sum(c.wrong for c in checks), sum(c.multiple for c in checks), 0)
    return store.RepairRow(
        status="active" if mw.apply == "auto" else "pending",
        rules=[str(f.rule) for f in result.rules],
        evidence=sum(f.evidence for f in result.rules),
        distinct_values=sum(f.distinct for f in result.rules),
        contradictions=sum(f.contradictions for f in result.rules),
        validation={
            "ok": total.ok,
            "wrong": total.wrong,
            "multiple": total.multiple,
            "uncovered": len(result.uncovered),
            "pages": len(evidence),
            "stable": stable,
        },
        reason=None,
        **common,
    )
