"""Dedupe: the same entity seen twice in one crawl, on any node, is stored once.

The natural key of each item is claimed in a Redis hash shared by the cluster. The claim records
the page that produced the item: the same page delivered again (a retry, or a redelivery after a
worker died before committing) is not a duplicate, so an item is never lost to its own earlier,
uncommitted attempt. The claims of the items that arrive while a batch is in flight go in the
next one, a single script call, sent from the crawl's event loop (:mod:`scraper.backends.redis_async`);
under another Twisted reactor, pipelined from a worker thread (:mod:`scraper.backends.redis_batcher`).
The hash belongs to the crawl run and is dropped with the seen-set when the run completes.
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
from ..items.base import StoredItem
from ..queue.keys import items_seen_key

logger = logging.getLogger(__name__)

# Claim each key for its page, or learn which page claimed it first: ARGV holds (key, page)
# pairs; the owner of each, in order.
_CLAIMS = """
local owners = {}
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    owners[#owners + 1] = ARGV[i + 1]
  else
    owners[#owners + 1] = redis.call('HGET', KEYS[1], ARGV[i])
  end
end
return owners
"""
# Claims per script call at most: a script blocks Redis while it runs, a few µs per claim.
MAX_BATCH = 1000
# Bounded so that memory is flat on a long crawl (~280 bytes an entry); past it, Redis answers.
LOCAL_CACHE_LIMIT = 20_000


class _ClaimBatches:
    """Claims sent from the event loop: one script call per batch and hash, one batch in flight;
    the claims made meanwhile wait for the next."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.loop = loop
        self.client: Any = None
        self._pending: list[tuple[str, str, str, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None

    def claim(self, hkey: str, field: str, origin: str) -> asyncio.Future:
        future = self.loop.create_future()
        self._pending.append((hkey, field, origin, future))
        if self._sender is None:
            self._sender = self.loop.create_task(self._send())
        return future

    async def _send(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                by_hash: dict[str, list[tuple[str, str, str, asyncio.Future]]] = {}
                for claim in batch:
                    by_hash.setdefault(claim[0], []).append(claim)
                for hkey, claims in by_hash.items():
                    await self._send_one(hkey, claims)
        finally:
            self._sender = None

    async def _send_one(self, hkey: str, claims: list[tuple[str, str, str, asyncio.Future]]) -> None:
        try:
            if self.client is None:
                self.client = async_client(self.url)
            args = [part for _, field, origin, _ in claims for part in (field, origin)]
            owners = await run_script(self.client, _CLAIMS, [hkey], args)
        except Exception as exc:  # every claim of the batch is told; each decides to retry
            for *_, future in claims:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), owner in zip(claims, owners):
            if not future.done():
                future.set_result(owner)

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
        self._local: dict[bytes, str] = {}
        self._last_warning = float("-inf")
        self._hkey: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> DedupePipeline:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        key = "\0".join([item.table, *(str(item.get(k)) for k in item.key)])
        digest = hashlib.sha1(key.encode("utf-8")).digest()
        origin = str(getattr(item, "_origin", "") or "")
        owner = self._local.get(digest)
        if owner is None:
            hkey = self._hkey
            if hkey is None:
                # A replay (scrapy reprocess) claims in a hash of its own, apart from the live crawl's.
                hkey = self._hkey = self.crawler.settings.get("ARCHIVE_REPLAY_ITEMS_KEY") or items_seen_key(
                    self.crawler.spider.name
                )
            reply = await self._claim(hkey, digest.hex(), origin)
            owner = reply.decode() if isinstance(reply, bytes) else str(reply or "")
            if len(self._local) >= LOCAL_CACHE_LIMIT:
                self._local.clear()  # Redis is the authority; this only saves round trips
            self._local[digest] = owner
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
        return await self._claim(hkey, field, origin)

    async def _claim(self, hkey: str, field: str, origin: str) -> Any:
        """Claim *field* for *origin*; while Redis is unreachable, wait and try again (the claim is
        idempotent, and the item's page stays unacknowledged meanwhile)."""
        batches = self._batches
        if batches is None and not self._threaded:
            loop = running_loop()
            if loop is None:
                self._threaded = True  # another Twisted reactor: no asyncio loop to send from
            else:
                batches = self._batches = _ClaimBatches(self.crawler.settings["REDIS_URL"], loop)
        delay = 0.5
        while True:
            try:
                if batches is not None:
                    return await batches.claim(hkey, field, origin)
                owners = await maybe_deferred_to_future(
                    self.batcher.call(lambda pipe: self.claim(keys=[hkey], args=[field, origin], client=pipe))
                )
                return owners[0]
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
