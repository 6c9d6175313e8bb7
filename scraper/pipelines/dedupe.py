"""Dedupe: the same entity seen twice in one crawl, on any node, is stored once.

The natural key of each item is claimed in a Redis hash shared by the cluster (one round trip,
``HSETNX``). The claim records the page that produced the item: the same page delivered again
(a retry, or a redelivery after a worker died before committing) is not a duplicate, so an item
is never lost to its own earlier, uncommitted attempt. The hash belongs to the crawl run and is
dropped with the seen-set when the run completes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from scrapy.exceptions import DropItem

from ..items.base import StoredItem
from ..queue.keys import items_seen_key
from ..redis_client import get_redis


class DedupePipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.server = get_redis(crawler.settings["REDIS_URL"])
        self._local: dict[bytes, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> "DedupePipeline":
        return cls(crawler)

    def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        key = "\0".join([item.table, *(str(item.get(k)) for k in item.key)])
        digest = hashlib.sha1(key.encode("utf-8")).digest()
        origin = str(getattr(item, "_origin", "") or "")
        owner = self._local.get(digest)
        if owner is None:
            hkey = items_seen_key(self.crawler.spider.name)
            if self.server.hsetnx(hkey, digest.hex(), origin):
                owner = origin
            else:
                owner = (self.server.hget(hkey, digest.hex()) or b"").decode()
            if len(self._local) >= 500_000:
                self._local.clear()  # Redis is the authority; this only saves round trips
            self._local[digest] = owner
        if owner == origin:
            return item
        self.crawler.stats.inc_value("item_duplicates_dropped")
        raise DropItem(
            f"Duplicate {type(item).__name__} {dict((k, item.get(k)) for k in item.key)} (first seen on {owner})",
            log_level="DEBUG",
        )
