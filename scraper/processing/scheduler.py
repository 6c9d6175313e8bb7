"""The scheduler of a processor (``scrapy process``): requests come from the stream of responses.

Each stream entry becomes the request it answers (its callback by name, as the shared queue
rebuilds requests); :class:`~scraper.processing.answer.StreamAnswerMiddleware` answers it from
the entry, with no network. The requests the callbacks yield take the crawl's own path into the
shared queue: :class:`~scraper.node.scheduler.SharedScheduler`'s ``enqueue_request``, through
the shared seen-set, for the fetchers to fetch politely.

An entry is acknowledged (and deleted) only once the engine is done with its request, which is
once every item of its callback went through the pipelines (the store pipeline passes an item on
after its commit), and once the requests it yielded are in Redis. Until then it is renewed;
entries of a processor that stopped renewing are claimed after ``PROCESSING_CLAIM_IDLE`` seconds,
and one delivered more than ``PROCESSING_MAX_DELIVERIES`` times becomes a dead letter.

A processor is not a node of the run: it neither starts nor finishes one (the fetchers do, and
they stay while the stream holds entries). It closes once the stream has been empty, with no
fetcher alive, for ``SCHEDULER_IDLE_TIMEOUT`` seconds.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object

from ..adapters import engine
from ..backends.redis_client import UNREACHABLE
from ..node.scheduler import SharedScheduler
from ..queue import keys, signing
from ..queue.dead_letters import DeadLetters
from ..queue.dupefilter import SharedDupeFilter, make_stores
from ..queue.shards import for_spider
from ..runs import record
from ..runs.nodes import NodeRegistry
from ..runs.state import processor_reporting
from . import entry as entries
from .config import read_config
from .stream import ResponseStream

logger = logging.getLogger(__name__)

ENTRY_META = "_stream_entry"
_TEND_EVERY = 0.1
_FETCHERS_LOOK_EVERY = 1.0


class StreamScheduler(SharedScheduler):
    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamScheduler:
        instance = super().from_crawler(crawler)
        instance.config = read_config(crawler.settings)
        return instance  # type: ignore[return-value]

    def open(self, spider: Spider) -> None:
        from twisted.internet import task

        self.spider = spider
        # The links go to the frontier as the fetchers' run shards it.
        self.shards = for_spider(self.server, spider.name, self.crawler.settings)
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
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            prefetch=self.prefetch,
            shards=self.shards,
        )
        self.leases = None
        self.keeper = None  # a processor fetches nothing, and leases nothing
        self._unserializable_logged: set[str] = set()
        self._last_redis_warning = float("-inf")
        self._flush_call: Any = None
        self._closing = False
        self.stream = ResponseStream(self.server, spider.name)
        self.stream.ensure_group()
        self.dead_letters = DeadLetters(self.server, spider)
        self.fetchers = NodeRegistry(self.server, keys.nodes_key(spider.name), ttl=self.node_ttl)
        self._fetchers_alive = True
        self._fetchers_looked_at = float("-inf")
        # Read and not yet handed to the engine: (id, entry, deliveries).
        self.buffer: deque[tuple[str, entries.Entry, int]] = deque()
        # Every entry this processor holds (buffered or in the engine) -> deliveries so far.
        self.held: dict[str, int] = {}
        # What the answer middleware answers with, by entry id; taken when answered.
        self.payloads: dict[str, entries.Entry] = {}
        self.crawler.stream_payloads = self.payloads
        claim_idle = self.config.claim_idle
        self._renew_every = claim_idle / 3
        self._claim_every = max(0.1, min(claim_idle / 2, 5.0))
        self._next_renewal = self._next_claim = 0.0
        self._loop = task.LoopingCall(self._tend)
        self._loop.start(_TEND_EVERY, now=False)
        logger.info(
            "Processing the responses of %s from %s as %s (claiming entries idle for %gs, dead letters "
            "after %d deliveries)",
            spider.name,
            self.stream.key,
            self.stream.consumer,
            claim_idle,
            self.config.max_deliveries,
        )
        return None

    # --- taking entries -------------------------------------------------------------------------
    def _fill(self) -> None:
        read = [(i, f, 1) for i, f in self.stream.read(self.config.batch)]
        # On its own clock, not only when nothing new comes: under steady load a dead
        # processor's entries would otherwise wait for the end of the crawl.
        if time.monotonic() >= self._next_claim:
            self._next_claim = time.monotonic() + self._claim_every
            # XAUTOCLAIM takes back this consumer's own entries too when their renewal came late
            # (a reactor busy for over PROCESSING_CLAIM_IDLE): they are in hand already, and
            # read twice they would be processed twice at once.
            claimed = self.stream.claim(self.config.claim_idle, self.config.batch)
            mine = {i: self.held[i] for i, _, _ in claimed if i in self.held}
            if mine:
                self.stream.keep(mine)
                claimed = [c for c in claimed if c[0] not in mine]
            if claimed:
                self.stats.inc_value("processing/claimed", len(claimed))
                logger.warning("Took over %d responses from processors that stopped renewing them", len(claimed))
                # Their consumers hold nothing now; left in the group they would pile up.
                self.stream.forget_idle_consumers(self.config.claim_idle)
            read += claimed
        for entry_id, fields, deliveries in read:
            self.held[entry_id] = deliveries
            if deliveries > self.config.max_deliveries:
                self._bury(entry_id, fields, deliveries)
                continue
            try:
                decoded = entries.decode(fields)
            except signing.UnsignedEntry:  # not written by a fetcher of this fleet
                self.stats.inc_value("dead_letters/unsigned")
                self._bury(entry_id, fields, deliveries, "unsigned")
                continue
            except Exception as exc:  # written by something else than a fetcher: set aside, never retried
                self._bury(entry_id, fields, deliveries, f"processing: unreadable stream entry ({exc})"[:300])
                continue
            self.buffer.append((entry_id, decoded, deliveries))

    def _bury(self, entry_id: str, fields: dict[bytes, bytes], deliveries: int, reason: str | None = None) -> None:
        if reason is None:
            deliveries -= 1  # this delivery is the one that gives up
            reason = (
                f"processing: delivered {deliveries} times (PROCESSING_MAX_DELIVERIES="
                f"{self.config.max_deliveries}), each time its processor died or stalled before "
                "committing its items"
            )
        request = None
        try:
            decoded = entries.decode(fields)
            request = decoded.to_request(self.spider)
            if decoded.run_id and not self.stats.get_value("run/id"):
                self.stats.set_value("run/id", decoded.run_id)  # its figures count in its run
        except Exception:
            pass
        raw = None if request is not None else fields.get(b"m", b"")
        self.dead_letters.add(request, reason, deliveries, raw=raw)
        self.stats.inc_value("dead_letters/count")
        self.stats.inc_value("dead_letters/processing")
        self._report_figures()  # counted before the entry goes: it may be the run's last
        self.stream.done({entry_id})
        self.held.pop(entry_id, None)
        logger.warning("Dead letter: %s (%s)", request.url if request is not None else entry_id, reason)

    def next_request(self) -> Request | None:
        try:
            self.flush_staged()
            if not self.buffer:
                self._fill()
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return None
        while self.buffer:
            entry_id, decoded, _ = self.buffer.popleft()
            try:
                request = decoded.to_request(self.spider)
            except (ValueError, TypeError, KeyError) as exc:
                self._bury(entry_id, {}, self.held.get(entry_id, 1), f"processing: request not rebuilt ({exc})"[:300])
                continue
            request.meta[ENTRY_META] = entry_id
            self.payloads[entry_id] = decoded
            if decoded.run_id:
                self.stats.set_value("run/id", decoded.run_id)
            self.stats.inc_value("processing/entries")
            return request
        return None

    def has_pending_requests(self) -> bool:
        if self.buffer or self.queue.staged_count():
            return True
        try:
            if len(self.stream):
                return True
            return self._any_fetcher()
        except UNREACHABLE as exc:
            self._redis_down(exc)
            return True

    def _any_fetcher(self) -> bool:
        now = time.monotonic()
        if now - self._fetchers_looked_at >= _FETCHERS_LOOK_EVERY:
            self._fetchers_looked_at = now
            self._fetchers_alive = bool(self.fetchers.live())
        return self._fetchers_alive

    def enqueue_request(self, request: Request) -> bool:
        request.meta.pop(ENTRY_META, None)  # a callback retry is a new fetch, not this entry again
        return super().enqueue_request(request)

    # --- acknowledging --------------------------------------------------------------------------
    def _in_engine(self) -> set[str]:
        inprogress = engine.in_progress(self.crawler)
        if inprogress is None:
            return set(self.held)  # unknown: acknowledged at close, when the engine has drained
        return {r.meta.get(ENTRY_META) for r in inprogress}

    def _tend(self) -> None:
        try:
            # The requests an entry's callback yielded must be in Redis before the entry goes.
            if not self.flush_staged():
                return
            buffered = {i for i, _, _ in self.buffer}
            done = set(self.held) - self._in_engine() - buffered
            if done:
                self._report_figures()
                self.stream.done(done)
                for entry_id in done:
                    self.held.pop(entry_id, None)
                    self.payloads.pop(entry_id, None)
                self.stats.inc_value("processing/acked", len(done))
            now = time.monotonic()
            if self.held and now >= self._next_renewal:
                self._next_renewal = now + self._renew_every
                lost = self.stream.renew(set(self.held))
                if lost:
                    # Claimed by another processor while this one stalled: its work now.
                    self.stats.inc_value("processing/lost", len(lost))
                    for entry_id in lost:
                        self.held.pop(entry_id, None)
            self._wake_engine()
        except UNREACHABLE as exc:
            self._redis_down(exc)
        except Exception as exc:
            logger.warning("Could not tend the stream entries: %s", exc)

    def _report_figures(self) -> None:
        """This processor's share of the run's figures (items, rejects, duplicates, dead
        letters) and, through ``processor_reporting``, of its quality figures, written before the
        entries they count are acknowledged: when the stream is empty, the last fetcher out
        records and checks the run with every processor's items in it."""
        # Before the first entry read right (one set aside at once): the spider's current run.
        run_id = self.stats.get_value("run/id") or int(self.server.hget(keys.run_key(self.spider.name), "id") or 0)
        if not run_id:
            return
        figures = {
            stat: float(self.stats.get_value(stat, 0) or 0) for name, stat in record.FIGURES.items() if name != "pages"
        }  # pages are the fetchers' figure
        reporter = f"process:{self.stream.consumer}"
        self.server.hset(keys.run_figures_key(self.spider.name, run_id), reporter, json.dumps(figures))
        self.crawler.signals.send_catch_log(signal=processor_reporting, run_id=run_id, reporter=reporter)

    def _wake_engine(self) -> None:
        # While the stream or a fetcher may bring more, the engine does not count as idle and
        # would look at the stream only every 5 s.
        if not self.buffer:
            engine.wake(self.crawler)

    def close(self, reason: str) -> None:
        self._closing = True
        if self._loop.running:
            self._loop.stop()
        try:
            if self.flush_staged():
                handed = set(self.held) - {i for i, _, _ in self.buffer}
                if handed:
                    self._report_figures()  # as in _tend: counted before acknowledged
                self.stream.done(handed)  # the engine has drained: all of them are done
                self.stream.give_back({i: n for i, _, n in self.buffer})
                if self.buffer:
                    logger.info("Gave back %d unprocessed responses to the stream", len(self.buffer))
                self.held.clear()
                if not self.buffer:
                    self.stream.leave()
                self.buffer.clear()
            else:
                logger.error(
                    "Redis unreachable while closing: %d stream entries stay pending; another processor "
                    "takes them over after PROCESSING_CLAIM_IDLE",
                    len(self.held),
                )
        except UNREACHABLE as exc:
            logger.error(
                "Redis unreachable while closing (%s): %d stream entries stay pending; another "
                "processor takes them over after PROCESSING_CLAIM_IDLE",
                type(exc).__name__,
                len(self.held),
            )
        self.df.close(reason)
