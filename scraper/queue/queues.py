"""The per-spider request queue in Redis.

A subclass of scrapy-redis' priority queue (a sorted set) that serializes through
:mod:`scraper.queue.requests` and JSON, and turns a request that cannot be serialized into one
clear error naming the spider, the callback and the offending value. Pushing and popping stay
methods of this class so that leased delivery (pop into a lease, acknowledge later) can replace
them without touching the scheduler.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy_redis.queue import PriorityQueue as _RedisPriorityQueue

from . import serializer
from .requests import request_from_dict, request_to_dict
from .serializer import SerializationError

logger = logging.getLogger(__name__)


class RequestSerializationError(Exception):
    """A request cannot be put in the shared queue."""


class PriorityQueue(_RedisPriorityQueue):
    def __init__(self, server: Any, spider: Any, key: str, serializer: Any = serializer) -> None:
        super().__init__(server, spider, key, serializer or globals()["serializer"])
        self._callback_names: dict[Any, str] = {}

    def _encode_request(self, request: Request) -> str:
        try:
            return self.serializer.dumps(request_to_dict(request, self.spider, self._callback_names))
        except SerializationError as exc:
            callback = getattr(request.callback, "__name__", request.callback) or "parse"
            raise RequestSerializationError(
                f"spider {self.spider.name!r}, callback {callback!r}: cannot queue {request.url}: {exc}"
            ) from None

    def _decode_request(self, encoded_request: bytes | str) -> Request:
        return request_from_dict(self.serializer.loads(encoded_request), self.spider)

    def pop(self, timeout: int = 0) -> Request | None:
        # Atomic take of the best-scored entry; a corrupt entry is logged and skipped rather
        # than crashing the engine loop.
        pipe = self.server.pipeline()
        pipe.multi()
        pipe.zrange(self.key, 0, 0).zremrangebyrank(self.key, 0, 0)
        results, _count = pipe.execute()
        if not results:
            return None
        try:
            return self._decode_request(results[0])
        except (ValueError, TypeError, KeyError) as exc:
            # Kept aside, not lost: an operator can inspect and requeue it.
            self.server.rpush(f"{self.key}:unreadable", results[0])
            logger.error(
                "Moved an unreadable request from %s to %s:unreadable: %s", self.key, self.key, exc
            )
            return None
