"""Dedupe: the same entity seen twice in one crawl, on any node, is stored once.

The natural key of each item is claimed in a Redis hash shared by the cluster. The claim records
the page that produced the item: the same page delivered again (a retry, or a redelivery after a
worker died before committing) is not a duplicate, so an item is never lost to its own earlier,
uncommitted attempt. Claims travel in pipelined batches off the reactor thread
(:mod:`scraper.redis_batcher`). The hash belongs to the crawl run and is dropped with the
seen-set when the run completes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from scrapy.exceptions import DropItem
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task

from ..items.base import StoredItem
from ..queue.keys import items_seen_key
from ..redis_batcher import RedisBatcher
from ..redis_client import UNREACHABLE, get_redis, register_script

logger = logging.getLogger(__name__)

# Claim the key for this page, or learn which page claimed it first; one round trip.
_CLAIM = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return ARGV[2] end
return redis.call('HGET', KEYS[1], ARGV[1])
"""
# Bounded so that memory is flat on a long crawl (~280 bytes an entry); past it, Redis answers.
LOCAL_CACHE_LIMIT = 20_000


class DedupePipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        server = get_redis(crawler.settings["REDIS_URL"])
        self.batcher = RedisBatcher(server)
        self.claim = register_script(server, _CLAIM)
        self._local: dict[bytes, str] = {}
        self._last_warning = float("-inf")
        self._hkey: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> "DedupePipeline":
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
                hkey = self._hkey = (self.crawler.settings.get("ARCHIVE_REPLAY_ITEMS_KEY")
                                     or items_seen_key(self.crawler.spider.name))
            reply = await self._claim(hkey, digest.hex(), origin)
            owner = reply.decode() if isinstance(reply, bytes) else str(reply or "")
            if len(self._local) >= LOCAL_CACHE_LIMIT:
                self._local.clear()  # Redis is the authority; this only saves round trips
            self._local[digest] = owner
        if owner == origin:
            return item
        self.crawler.stats.inc_value("item_duplicates_dropped")
        raise DropItem(
            f"Duplicate {type(item).__name__} {dict((k, item.get(k)) for k in item.key)} (first seen on {owner})",
            log_level="DEBUG",
        )

    async def _claim(self, hkey: str, field: str, origin: str) -> Any:
        """Claim *field* for *origin*; while Redis is unreachable, wait and try again (the claim is
        idempotent, and the item's page stays unacknowledged meanwhile)."""
        from twisted.internet import reactor

        delay = 0.5
        while True:
            try:
                return await maybe_deferred_to_future(
                    self.batcher.call(lambda pipe: self.claim(keys=[hkey], args=[field, origin], client=pipe))
                )
            except UNREACHABLE as exc:
                self.crawler.stats.inc_value("dedupe/redis_errors")
                if time.monotonic() - self._last_warning >= 10:
                    self._last_warning = time.monotonic()
                    logger.warning("Redis unreachable (%s): items wait for their dedupe claim", type(exc).__name__)
                await maybe_deferred_to_future(task.deferLater(reactor, delay, lambda: None))
                delay = min(delay * 2, 5.0)
