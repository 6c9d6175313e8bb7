"""Dedupe: the same entity seen twice in one crawl, on any node, is stored once.

The natural key of each item is claimed in a Redis hash shared by the cluster. The claim records
the page that produced the item: the same page delivered again (a retry, or a redelivery after a
worker died before committing) is not a duplicate, so an item is never lost to its own earlier,
uncommitted attempt. The claims of the items that arrive while a batch is in flight go in the
next one, a single script call, sent from the crawl's event loop (:mod:`scraper.backends.redis_async`);
under another Twisted reactor, pipelined from a worker thread (:mod:`scraper.backends.redis_batcher`).
The hash belongs to the crawl run and is dropped with the seen-set when the run completes.

The same call records, for the sole item of a page with no canonical link, the URL first recorded
for it in any run (``{<spider>}:items:pages``, kept across runs): an item whose page was recorded
under another URL carries that URL, and the URL it came by is learnt as an alias of it
(:mod:`scraper.identity.content`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

from scrapy.exceptions import DropItem
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task

from ..backends.redis_async import async_client, run_script, running_loop
from ..backends.redis_batcher import RedisBatcher
from ..backends.redis_client import UNREACHABLE, count_refusal, get_redis, register_script, unreachable_reason
from ..identity.content import PageRecords, own_page
from ..items.base import StoredItem
from ..queue.keys import aliases_key, item_pages_key, items_seen_key
from ..runs_hook import current_run_id

logger = logging.getLogger(__name__)

# Claim each key for its page in this run (KEYS[1]), or learn which page claimed it first. With a
# URL, record it as the URL of the key's page (KEYS[2], kept across runs), or learn the one recorded
# first; a page reached by another URL is then an alias of it (KEYS[3], "<run> <URL>"), written
# here, in the claim's call: a node killed before its next write would lose it, and the page would
# be fetched twice again next run. ARGV[1] is the run ("" if none), then (key, page, URL or "",
# the page's identity) quads; the answer is (owner, recorded URL or "") pairs.
_CLAIMS = """
local answers = {}
local run = ARGV[1]
for i = 2, #ARGV, 4 do
  local field, origin, url, page = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if redis.call('HSETNX', KEYS[1], field, origin) == 1 then
    answers[#answers + 1] = origin
  else
    answers[#answers + 1] = redis.call('HGET', KEYS[1], field)
  end
  if url == '' then
    answers[#answers + 1] = ''
  elseif redis.call('HSETNX', KEYS[2], field, url) == 1 then
    answers[#answers + 1] = url
  else
    local recorded = redis.call('HGET', KEYS[2], field)
    answers[#answers + 1] = recorded
    if recorded ~= url and page ~= recorded then
      if run == '' then
        redis.call('HSET', KEYS[3], page, recorded)
      else
        redis.call('HSET', KEYS[3], page, run .. ' ' .. recorded)
      end
    end
  end
end
return answers
"""
# Claims per script call at most: a script blocks Redis while it runs, a few µs per claim.
MAX_BATCH = 1000
# Bounded so that memory is flat on a long crawl (~280 bytes an entry); past it, Redis answers.
LOCAL_CACHE_LIMIT = 20_000


class _Record:
    """Where a page's URL is recorded and an alias learnt, and the run that learns it."""

    __slots__ = ("aliases", "crawler", "pages")

    def __init__(self, pages: str, aliases: str, crawler: Any = None) -> None:
        self.pages, self.aliases, self.crawler = pages, aliases, crawler

    def run(self) -> str:
        run_id = current_run_id(self.crawler) if self.crawler is not None else None
        return "" if run_id is None else str(run_id)


# (hash, key, the page it came from, the URL to record or "", that page's identity, the answer)
_Claim = tuple[str, str, str, str, str, asyncio.Future]


class _ClaimBatches:
    """Claims sent from the event loop: one script call per batch and hash, one batch in flight;
    the claims made meanwhile wait for the next."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop, record: _Record | None = None) -> None:
        self.url = url
        self.loop = loop
        self.record = record
        self.client: Any = None
        self._pending: list[_Claim] = []
        self._sender: asyncio.Task | None = None

    def claim(self, hkey: str, field: str, origin: str, url: str = "", page: str = "") -> asyncio.Future:
        """Claim *field* for *origin* in *hkey* (and record *url* as the URL of the page *page*, if
        any): a future of (the owner, the URL recorded first or "")."""
        future = self.loop.create_future()
        self._pending.append((hkey, field, origin, url, page, future))
        if self._sender is None:
            self._sender = self.loop.create_task(self._send())
        return future

    async def _send(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                by_hash: dict[str, list[_Claim]] = {}
                for claim in batch:
                    by_hash.setdefault(claim[0], []).append(claim)
                for hkey, claims in by_hash.items():
                    await self._send_one(hkey, claims)
        finally:
            self._sender = None

    async def _send_one(self, hkey: str, claims: list[_Claim]) -> None:
        try:
            if self.client is None:
                self.client = async_client(self.url)
            record = self.record or _Record(hkey, hkey)
            args = [record.run()]
            for _, field, origin, url, page, _ in claims:
                args += (field, origin, url, page)
            answers = await run_script(self.client, _CLAIMS, [hkey, record.pages, record.aliases], args)
        except Exception as exc:  # every claim of the batch is told; each decides to retry
            for *_, future in claims:
                if not future.done():
                    future.set_exception(exc)
            return
        for i, (*_, future) in enumerate(claims):
            if not future.done():
                future.set_result((answers[2 * i], answers[2 * i + 1]))

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()


class DedupePipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        server = get_redis(crawler.settings["REDIS_URL"])
        self.batcher = RedisBatcher(server)
        self.claim = register_script(server, _CLAIMS)
        self._batches: _ClaimBatches | None = None
        self._threaded = False
        self._local: dict[bytes, tuple[str, str]] = {}  # claim -> (owner, URL recorded or "")
        self._last_warning = float("-inf")
        self._hkey: str | None = None
        self._record: _Record | None = None
        self.records = PageRecords(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> DedupePipeline:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        key = "\0".join([item.table, *(str(item.get(k)) for k in item.key)])
        digest = hashlib.sha1(key.encode("utf-8")).digest()
        origin = str(getattr(item, "_origin", "") or "")
        url = self.records.value(item)
        known = self._local.get(digest)
        # A page recorded otherwise than this one asks Redis even when the key is known here: the
        # script writes the alias.
        if known is None or (url and known[1] != url):
            hkey = self._hkey
            if hkey is None:
                # A replay (scrapy reprocess) claims in a hash of its own, apart from the live crawl's,
                # and reads the same pages' URLs (replaying the same pages yields the same rows).
                hkey = self._hkey = self.crawler.settings.get("ARCHIVE_REPLAY_ITEMS_KEY") or items_seen_key(
                    self.crawler.spider.name
                )
            owner, recorded = await self._claim(hkey, digest.hex(), origin, url, own_page(item) or "")
            if len(self._local) >= LOCAL_CACHE_LIMIT:
                self._local.clear()  # Redis is the authority; this only saves round trips
            known = self._local[digest] = (_text(owner), _text(recorded))
        owner, recorded = known
        if url and recorded != url:
            self.records.settle(item, recorded)
        if owner == origin:
            return item
        self.crawler.stats.inc_value("item_duplicates_dropped")
        # Still this page's item (stored from *owner*): the page's record of its items keeps it.
        item._duplicate_of = owner
        raise DropItem(
            f"Duplicate {type(item).__name__} {dict((k, item.get(k)) for k in item.key)} (first seen on {owner})",
            log_level="DEBUG",
        )

    async def close_spider(self) -> None:
        if self._batches is not None:
            await self._batches.close()

    async def claim_in(self, hkey: str, field: str, origin: str) -> Any:
        """Claim *field* in the hash *hkey* for the page *origin* (another component's claims ride
        the same batches: the revisit recorder's items of pages not modified); returns the owner."""
        owner, _ = await self._claim(hkey, field, origin, "", "")
        return owner

    async def _claim(self, hkey: str, field: str, origin: str, url: str, page: str) -> tuple[Any, Any]:
        """Claim *field* for *origin* (and record *url* as its page's); while Redis is unreachable,
        wait and try again (the claim is idempotent, and the item's page stays unacknowledged
        meanwhile)."""
        record = self._record
        if record is None:
            name = self.crawler.spider.name
            record = self._record = _Record(item_pages_key(name), aliases_key(name), self.crawler)
        batches = self._batches
        if batches is None and not self._threaded:
            loop = running_loop()
            if loop is None:
                self._threaded = True  # another Twisted reactor: no asyncio loop to send from
            else:
                batches = self._batches = _ClaimBatches(self.crawler.settings["REDIS_URL"], loop, record)
        delay = 0.5
        while True:
            try:
                if batches is not None:
                    return await batches.claim(hkey, field, origin, url, page)
                keys = [hkey, record.pages, record.aliases]
                args = [record.run(), field, origin, url, page]
                answers = await maybe_deferred_to_future(
                    self.batcher.call(lambda pipe, keys=keys, args=args: self.claim(keys=keys, args=args, client=pipe))
                )
                return answers[0], answers[1]
            except UNREACHABLE as exc:
                self.crawler.stats.inc_value("dedupe/redis_errors")
                count_refusal(self.crawler.stats, exc)
                if time.monotonic() - self._last_warning >= 10:
                    self._last_warning = time.monotonic()
                    logger.warning("Redis unreachable (%s): items wait for their dedupe claim", unreachable_reason(exc))
                if batches is not None:
                    await asyncio.sleep(delay)
                else:
                    from twisted.internet import reactor

                    await maybe_deferred_to_future(task.deferLater(reactor, delay, lambda: None))
                delay = min(delay * 2, 5.0)


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply or "")
