"""Dead letters: requests that keep failing are set aside with their reason, never retried hot.

A request lands here when its download still fails after Scrapy's retries, when its callback
keeps raising after ``DLQ_CALLBACK_RETRIES`` more tries, or when its queue entry cannot be read.
Each entry keeps the request itself (the same JSON as the queue), the reason, the attempt count
and the time; ``scrapy dlq`` lists, shows and requeues them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

from scrapy import Request

from .keys import dead_key, queue_key


def entry(reason: str, attempts: int, url: str | None, data: str) -> str:
    """One dead letter, as stored: the request's queue JSON plus why and how often it failed."""
    return json.dumps(
        {"at": time.time(), "reason": reason, "attempts": attempts, "url": url, "request": data},
        ensure_ascii=False,
    )


class DeadLetters:
    def __init__(self, server: Any, spider: Any) -> None:
        self.server = server
        self.spider = spider
        from .queues import PriorityQueue  # the queue module records unreadable entries here

        self.key = dead_key(spider.name)
        self.queue = PriorityQueue(server, spider, queue_key(spider.name))

    def add(self, request: Request | None, reason: str, attempts: int, raw: bytes | str | None = None) -> None:
        """Set a request aside. *raw* is an undecodable queue entry, kept as it was."""
        if request is not None:
            data = self.queue._encode_request(request)
            url = request.url
        else:
            data = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")
            url = None
        self.server.rpush(self.key, entry(reason, attempts, url, data))

    def __len__(self) -> int:
        return self.server.llen(self.key)

    def entries(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for index, raw in enumerate(self.server.lrange(self.key, 0, -1)):
            yield index, json.loads(raw)

    def requeue(self, reason: str | None = None) -> int:
        """Put entries (all, or those whose reason starts with *reason*) back in the queue.

        They bypass the seen-set, as a redelivery must. Returns how many were requeued."""
        from .queues import score_for

        moved = 0
        for raw in self.server.lrange(self.key, 0, -1):
            letter = json.loads(raw)
            if reason and not letter["reason"].startswith(reason):
                continue
            try:
                priority = int(json.loads(letter["request"]).get("priority", 0))
            except (ValueError, TypeError, AttributeError):
                continue  # an unreadable entry stays for a human to look at
            pipe = self.server.pipeline()
            pipe.zadd(self.queue.key, {letter["request"]: score_for(priority)})
            pipe.lrem(self.key, 1, raw)
            pipe.execute()
            moved += 1
        return moved
