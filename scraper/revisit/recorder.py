"""The crawl's page states: read by key as the crawl needs them, updated by each visit, written back.

Nothing is read when the spider opens: a page's state is read (in batches, off the reactor
thread, :mod:`.reader`) when a page links to it, when a revisit run queues it as due, or when it
is visited, and the recent ones are kept in a bounded cache (:mod:`.cache`), so a node's memory
and start do not grow with the number of pages the spider knows. A visit whose earlier state is
not at hand when it ends (a full crawl looks nothing up on the way) is merged with it at the next
write, whose one query reads them all.

A visit ends in one of three ways:

* the page answered and its callback yielded items or links: its content hash (of what it yielded)
  says whether it changed; its interval is halved or grown (:mod:`.schedule`); the keys of its
  items, as stored, are kept for the next visit. The state is final once every item the page
  yielded has left the pipelines (stored, rejected or dropped);
* it answered ``304 Not Modified`` (:mod:`.conditional`): unchanged, its items are claimed as
  seen in this run (gone-marking then leaves them alone) and their ``last_seen`` refreshed;
* it answered ``404`` / ``410``: its items are no longer there.

In a revisit run (``REVISIT_DUE``), the items a visited page had at its last visit are recorded in
Redis as the run's "expected" items: gone-marking (:mod:`scraper.node.gone`) then covers only
those, never the rows of pages the run skipped. Claims go through the dedupe pipeline's batched
script calls, before the page's lease is acknowledged, so the last node out reads them all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg2
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.task import LoopingCall

from ..config import get_bool, get_int
from ..item_observers import on_item_scraped
from ..items.base import StoredItem
from ..pipelines.dedupe import DedupePipeline
from ..queue.keys import REVISIT_DUE_FIELD, items_seen_key, revisit_expected_key
from ..runtime.worker_threads import defer_to_thread
from ..shared_state import is_crawl_node
from . import store
from .cache import PageCache
from .reader import StateReader
from .schedule import GONE, ITEMS, LISTING, PageState, Schedule

logger = logging.getLogger(__name__)

FLUSH_EVERY = 5.0  # seconds between two writes of the page states
WARN_EVERY = 10.0  # seconds between two warnings of states that could not be read


def item_key(item: StoredItem) -> list[Any]:
    return [item.table, [item.get(k) for k in item.key]]


def digest(entry: list[Any]) -> str:
    """The dedupe pipeline's claim of a stored item key (see :mod:`scraper.pipelines.dedupe`)."""
    table, values = entry
    return hashlib.sha1("\0".join([table, *(str(v) for v in values)]).encode("utf-8")).hexdigest()


@dataclass
class Visit:
    """One page being processed: what it answered and what its items became."""

    key: bytes
    url: str
    callback: str | None
    etag: str | None
    last_modified: str | None
    lastmod: float | None
    changefreq: str | None
    hinted: bool  # fetched because its sitemap lastmod said it changed
    content_hash: str = ""
    kind: str = LISTING
    pending: int = 0
    ended: bool = False
    items: list[list[Any]] = field(default_factory=list)
    old: PageState | None = None  # the page's state before this visit
    known: bool = False  # whether *old* was read (None then: a page never seen)


def recorder_of(crawler: Any) -> RevisitRecorder:
    """The crawl's recorder, for the revisit middlewares; NotConfigured when it keeps no states."""
    recorder = crawler.get_extension(RevisitRecorder)
    if recorder is None:
        raise NotConfigured("no page states kept")
    return recorder


class RevisitRecorder:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.schedule = Schedule.from_settings(crawler.settings)
        self.due_run = get_bool(crawler.settings, "REVISIT_DUE")
        self.dsn = crawler.settings["DATABASE_URL"]
        #: The states at hand, most recently used last (the rest is read by key when needed).
        self.states = PageCache(get_int(crawler.settings, "REVISIT_CACHE_PAGES"))
        self.reader: StateReader | None = None
        self.now = time.time()
        self.spider_name = ""
        self._visits: dict[bytes, Visit] = {}
        self._dirty: dict[bytes, PageState] = {}
        self._writing: dict[bytes, PageState] = {}  # taken from _dirty by the write under way
        # Visits that ended before their page's earlier state was read: merged at the next write.
        self._pending: list[Visit] = []
        self._pending_keys: Counter[bytes] = Counter()
        # Items of pages not modified, by table: (page key, item key values).
        self._touch: dict[str, list[tuple[bytes, list[Any]]]] = defaultdict(list)
        self._flushing: LoopingCall | None = None
        self._flush_lock = DeferredLock()  # one write at a time, in the order of the visits
        self._dedupe: DedupePipeline | None = None
        self._last_warning = float("-inf")
        self.ready = False

    @classmethod
    def from_crawler(cls, crawler: Any) -> RevisitRecorder:
        settings = crawler.settings
        # (`scrapy crawl --due` with REVISIT_ENABLED=false is refused at start: scraper/commands/crawl.py.)
        if not get_bool(settings, "REVISIT_ENABLED") or not is_crawl_node(settings) or not settings.get("DATABASE_URL"):
            raise NotConfigured("page states are kept by crawl nodes with a database")
        if settings.getbool("ARCHIVE_REPLAY"):
            raise NotConfigured("a replay fetches nothing")
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        on_item_scraped(crawler, ext.item_stored)
        crawler.signals.connect(ext.item_lost, signal=signals.item_dropped)
        crawler.signals.connect(ext.item_lost, signal=signals.item_error)
        return ext

    # -- lifecycle -------------------------------------------------------------------------------
    async def spider_opened(self, spider: Any) -> None:
        self.spider_name = spider.name
        self.now = time.time()
        try:
            # Off the reactor thread: a first start may build the due index of a large table.
            await maybe_deferred_to_future(defer_to_thread(self._prepare))
        except psycopg2.Error as exc:
            # Then nothing is skipped and no validator sent; a revisit run also marks nothing gone
            # (its expected items stay empty).
            logger.error(
                "Could not read the page states of %r (%s): every page is fetched in full%s",
                spider.name,
                exc,
                " and this revisit run marks nothing gone" if self.due_run else "",
            )
            self.stats.set_value("revisit/states_unreadable", 1)
            return
        self.reader = StateReader(self.dsn, spider.name)
        self.ready = True
        if self.due_run:
            logger.info("A revisit run of %r: only the pages due, and new links", spider.name)
        self._flushing = LoopingCall(self._flush)
        self._flushing.start(FLUSH_EVERY, now=False)

    def _prepare(self) -> None:
        conn = psycopg2.connect(self.dsn, connect_timeout=10)
        try:
            with conn, conn.cursor() as cur:
                store.ensure(cur)
        finally:
            conn.close()

    async def spider_closed(self, spider: Any) -> None:
        if self._flushing is not None and self._flushing.running:
            self._flushing.stop()
        for visit in list(self._visits.values()):
            if visit.ended:  # items still pending when the crawl stopped: what was stored counts
                self._finish(visit)
        await maybe_deferred_to_future(self._flush())
        if self.reader is not None:
            self.stats.set_value("revisit/state_queries", self.reader.queries)
            self.reader.close()

    def _flush(self) -> Deferred:
        return self._flush_lock.run(lambda: deferred_from_coro(self._flush_now()))

    async def _flush_now(self) -> None:
        if self._pending:
            await self._merge_pending()
        if not self._dirty and not self._touch:
            return
        dirty, self._dirty = self._dirty, {}
        touch, self._touch = self._touch, defaultdict(list)
        self._writing = dirty
        try:
            await maybe_deferred_to_future(defer_to_thread(self._write, dirty, touch))
        finally:
            self._writing = {}

    async def _merge_pending(self) -> None:
        """The visits that ended without their page's earlier state, with it: one query for all."""
        pending, self._pending = self._pending, []
        found = await self.lookup([visit.key for visit in pending])
        lost = 0
        for visit in pending:
            key = visit.key
            self._pending_keys[key] -= 1
            if self._pending_keys[key] <= 0:
                del self._pending_keys[key]
            known, old = self._at_hand(key)  # a visit of the same page merged just before: newer
            if not known:
                if key not in found:
                    lost += 1  # the database could not say what the page was: the visit is not kept
                    continue
                old = found[key]
            self._merge(visit, old)
        if lost:
            # As a write that failed: those pages are fetched in full next time.
            self.stats.inc_value("revisit/not_saved", lost)

    def _write(self, dirty: dict[bytes, PageState], touch: dict[str, list[tuple[bytes, list[Any]]]]) -> None:
        from ..items import stored_item_types

        types = {t.table: t for t in stored_item_types()}
        try:
            conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="revisit")
            try:
                with conn, conn.cursor() as cur:
                    touched, missing = 0, set()
                    for table, entries in touch.items():
                        if table not in types:
                            continue
                        found = store.touch(cur, self.spider_name, types[table], [values for _, values in entries])
                        touched += len(found)
                        missing |= {page for page, values in entries if json.dumps(values, default=str) not in found}
                    for page in missing & dirty.keys():
                        self._refetch(dirty[page])
                    store.save(cur, self.spider_name, dirty.items())
            finally:
                conn.close()
        except psycopg2.Error as exc:
            # Lost states cost refetches next run, never data: the pages are fetched in full.
            self.stats.inc_value("revisit/not_saved", len(dirty))
            logger.warning(
                "Could not save %d page states (%s): those pages are fetched in full next time", len(dirty), exc
            )
            return
        self.stats.inc_value("revisit/touched", touched)
        if missing:
            self.stats.inc_value("revisit/rows_missing", len(missing))
            logger.warning(
                "%d page(s) answered 304 but their rows are gone from the database (deleted by hand?): "
                "they are fetched in full at the next revisit run",
                len(missing),
            )

    @staticmethod
    def _refetch(state: PageState) -> None:
        """The page's next visit is a full one, due at once: its validators would keep its rows missing."""
        state.etag = state.last_modified = None
        state.content_hash = None
        state.next_due = state.fetched_at

    # -- what the middlewares ask -----------------------------------------------------------------
    def state(self, key: bytes) -> PageState | None:
        """The page's state if at hand (this node's own changes first, then the cache); no query."""
        return self._at_hand(key)[1]

    def _at_hand(self, key: bytes) -> tuple[bool, PageState | None]:
        state = self._dirty.get(key) or self._writing.get(key)
        if state is not None:
            return True, state
        if key in self.states:
            return True, self.states.get(key)
        return False, None

    def remember(self, key: bytes, state: PageState) -> None:
        """A state read otherwise (a due page streamed to the queue): cached, unless this node's own is newer."""
        if key not in self._dirty and key not in self._writing:
            self.states[key] = state

    async def lookup(self, keys: Collection[bytes]) -> dict[bytes, PageState | None]:
        """The states of *keys* (None: a page the spider does not know), those not at hand read by
        one query. A key the database could not be asked about is left out: its page is treated as
        unknown (fetched in full), and the next lookup asks again."""
        found: dict[bytes, PageState | None] = {}
        missing = []
        for key in keys:
            known, state = self._at_hand(key)
            if known:
                found[key] = state
            else:
                missing.append(key)
        if not missing or self.reader is None:
            return found
        try:
            read = await maybe_deferred_to_future(self.reader.read(missing))
        except psycopg2.Error as exc:
            self.stats.inc_value("revisit/lookup_errors")
            if time.monotonic() - self._last_warning >= WARN_EVERY:
                self._last_warning = time.monotonic()
                logger.warning("Could not read page states (%s): those pages are fetched in full", exc)
            return found
        cache = self.states
        for key in missing:
            known, state = self._at_hand(key)  # its own visit may have ended meanwhile: newer
            if not known:
                state = cache[key] = read.get(key)
            found[key] = state
        return found

    async def resolve(self, visit: Visit) -> None:
        """Read the visited page's earlier state now (a revisit run needs its items at once)."""
        if not visit.known:
            found = await self.lookup([visit.key])
            if visit.key in found:
                visit.old, visit.known = found[visit.key], True

    def begin(self, visit: Visit) -> Visit:
        visit.known, visit.old = self._at_hand(visit.key)
        self._visits[visit.key] = visit
        return visit

    def end(self, visit: Visit, content_hash: str, kind: str) -> None:
        visit.content_hash, visit.kind, visit.ended = content_hash, kind, True
        if visit.pending <= 0:
            self._finish(visit)

    def abandon(self, visit: Visit) -> None:
        self._visits.pop(visit.key, None)

    def item_stored(self, item: Any) -> None:
        self._item_done(item, stored=True)

    def item_lost(self, item: Any) -> None:
        # A duplicate is the page's item all the same, stored from the page that claimed it first
        # (the same page under another URL, before its alias was known).
        self._item_done(item, stored=getattr(item, "_duplicate_of", None) is not None)

    def _item_done(self, item: Any, stored: bool) -> None:
        visit = self._visits.get(getattr(item, "_page_key", b""))
        if visit is None:
            return
        if stored and isinstance(item, StoredItem):
            visit.items.append(item_key(item))
        visit.pending -= 1
        if visit.ended and visit.pending <= 0:
            self._finish(visit)

    def _finish(self, visit: Visit) -> None:
        self._visits.pop(visit.key, None)
        key = visit.key
        known, old = False, None
        if key not in self._pending_keys:  # else after the visit still waiting for it, in order
            known, old = self._at_hand(key)
            if not known and visit.known:
                known, old = True, visit.old
        if not known:
            self._pending.append(visit)
            self._pending_keys[key] += 1
            return
        self._merge(visit, old)

    def _merge(self, visit: Visit, old: PageState | None) -> None:
        """The page's state after *visit*, from *old*, its state before it."""
        schedule = self.schedule
        if old is None or old.kind == GONE:
            self.stats.inc_value("revisit/new")
            interval = schedule.first_interval(visit.changefreq)
            state = PageState(
                url=visit.url, kind=visit.kind, fetched_at=self.now, interval=interval, next_due=self.now + interval
            )
            state.changed_at = self.now
        else:
            changed = old.content_hash != visit.content_hash
            self.stats.inc_value("revisit/changed" if changed else "revisit/unchanged")
            if self.due_run and old.items:
                # What the revisit run meant to see again: its quality is judged against this.
                self.stats.inc_value("revisit/expected_items", len(old.items))
            state = old
            # Visited twice in one run (under two URLs, before its alias was known): one visit.
            if old.fetched_at != self.now or changed:
                state.interval = schedule.next_interval(old.interval, changed)
            if changed:
                state.changes += 1
                state.changed_at = self.now
                state.hint_misses = 0
            elif visit.hinted:
                state.hint_misses += 1
            state.kind, state.url, state.fetched_at = visit.kind, visit.url, self.now
            state.next_due = self.now + state.interval
        state.callback = visit.callback
        state.etag, state.last_modified = visit.etag, visit.last_modified
        state.content_hash = visit.content_hash
        state.items = visit.items
        state.lastmod = visit.lastmod if visit.lastmod is not None else state.lastmod
        state.visits += 1
        self.states[visit.key] = state
        self._dirty[visit.key] = state

    async def not_modified(self, key: bytes, url: str, hinted: bool, lastmod: float | None) -> None:
        """The page answered 304: unchanged, its items still there."""
        state = (await self.lookup([key])).get(key)
        if state is None:
            # Its state could not be read again (the database went away since the request was
            # made conditional): nothing claimed, so nothing of it is marked gone either.
            self.stats.inc_value("revisit/not_modified")
            return
        items = state.items or []
        await self._claim(items_seen_key(self.spider_name), items, url)
        await self.expect(state, url)
        if self.due_run and items:
            # Items a 304 confirmed: seen by the run as surely as stored ones.
            self.stats.inc_value("revisit/expected_items", len(items))
            self.stats.inc_value("revisit/confirmed_items", len(items))
        if state.fetched_at != self.now:
            state.interval = self.schedule.next_interval(state.interval, changed=False)
        state.fetched_at, state.next_due = self.now, self.now + state.interval
        state.not_modified += 1
        state.visits += 1
        if hinted:
            state.hint_misses += 1
        if lastmod is not None:
            state.lastmod = lastmod
        self.states[key] = state
        self._dirty[key] = state
        for table, values in items:
            self._touch[table].append((key, values))
        self.stats.inc_value("revisit/not_modified")

    async def gone(self, key: bytes, url: str) -> None:
        """A known page answered 404 or 410: in a revisit run its items are expected and unseen."""
        state = (await self.lookup([key])).get(key)
        if state is None or state.kind == GONE:
            return
        await self.expect(state, url)
        state.kind, state.fetched_at = GONE, self.now
        state.interval = self.schedule.maximum
        state.next_due = self.now + state.interval
        state.visits += 1
        self.states[key] = state
        self._dirty[key] = state
        self.stats.inc_value("revisit/pages_gone")

    async def expect(self, state: PageState | None, url: str) -> None:
        """In a revisit run, the items *state*'s page had are the run's to mark gone if unseen."""
        if self.due_run and state is not None and state.items and state.kind == ITEMS:
            await self._claim(revisit_expected_key(self.spider_name), state.items, url)

    async def mark_due_run(self) -> None:
        await self._claim(revisit_expected_key(self.spider_name), [], REVISIT_DUE_FIELD)

    async def _claim(self, hkey: str, items: list[list[Any]], origin: str) -> None:
        if self._dedupe is None:
            self._dedupe = self.crawler.get_item_pipeline(DedupePipeline)
            if self._dedupe is None:
                return  # no dedupe pipeline: no claims, no gone-marking to keep right
        fields = (
            [digest(entry) for entry in items]
            if items
            else ([REVISIT_DUE_FIELD] if origin == REVISIT_DUE_FIELD else [])
        )
        for name in fields:
            await self._dedupe.claim_in(hkey, name, origin)
