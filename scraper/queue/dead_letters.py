"""Dead letters: requests that keep failing are set aside with their reason, never retried hot.

A request lands here when its download still fails after Scrapy's retries, when its callback
keeps raising after ``DLQ_CALLBACK_RETRIES`` more tries, or when its queue entry cannot be read.
Each entry keeps the request itself (the same JSON as the queue), the last reason, the attempt
count of its last run, how many times it was dead-lettered and the time; ``scrapy dlq`` lists,
shows, requeues and purges them.

One entry per request (method, URL and body): a request dead-lettered again, in a later run or
after a requeue, replaces its entry and counts up, instead of piling up one entry per run. The
index of entries by request lives next to the list (``{<spider>}:dead:index``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import redis
from scrapy import Request

from ..backends.redis_client import pipeline_eval
from . import serializer, signing
from .dead_entry import entry
from .keys import dead_index_key, dead_key, queue_key
from .queues import PriorityQueue
from .requests import is_leaked_api_call
from .scores import score_for

#: Meta a request collects while it fails (retries, callback retries, its lease): a requeued
#: dead letter starts again with none of it, so it gets its full retries.
FAILURE_META = ("retry_times", "callback_attempts", "_lease", "download_latency", "download_slot")


UNSIGNED = "unsigned"


def identity(request: Request) -> str:
    return hashlib.sha1(f"{request.method} {request.url}\0".encode() + (request.body or b"")).hexdigest()


def fresh_request(data: str | bytes) -> bytes:
    """The queue JSON *data* without the meta a request collected while failing."""
    request = serializer.loads(data)
    meta = request.get("meta")
    if isinstance(meta, dict):
        for name in FAILURE_META:
            meta.pop(name, None)
    return serializer.dumps(request)


class DeadLetters:
    def __init__(self, server: Any, spider: Any, shards: Any = None) -> None:
        self.server = server
        self.spider = spider
        self.key = dead_key(spider.name)
        self.index_key = dead_index_key(spider.name)
        self.queue = PriorityQueue(server, spider, queue_key(spider.name), shards=shards)

    def add(self, request: Request | None, reason: str, attempts: int, raw: bytes | str | None = None) -> int:
        """Set a request aside; returns how many times it has been. *raw* is an undecodable
        queue entry, kept as it was."""
        if request is None:
            data = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")
            self.server.rpush(self.key, entry(reason, attempts, None, data))
            return 1
        # Kept unsigned: a requeue signs it again, with the secret of its day. In the full form,
        # not the queue's compact one: dead letters are few, and nodes of versions before the
        # compact entry list, show and requeue them too.
        data = self.queue.encode_plain(request)
        ident = identity(request)
        with self.server.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self.index_key)
                    old = pipe.hget(self.index_key, ident)
                    count = 1 + (_count(old) if old else 0)
                    new = entry(reason, attempts, request.url, data, count)
                    pipe.multi()
                    if old:
                        pipe.lrem(self.key, 1, old)
                    pipe.rpush(self.key, new)
                    pipe.hset(self.index_key, ident, new)
                    pipe.execute()
                    return count
                except redis.WatchError:
                    continue

    def __len__(self) -> int:
        return self.server.llen(self.key)

    def entries(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for index, raw in enumerate(self.server.lrange(self.key, 0, -1)):
            yield index, json.loads(raw)

    def requeue(self, reason: str | None = None) -> int:
        """Put entries (all, or those whose reason starts with *reason*) back in the queue, with
        their retry counters reset.

        They bypass the seen-set, as a redelivery must. Returns how many were requeued."""
        signer = signing.current()

        def move(pipe: Any, letter: dict[str, Any]) -> bool:
            request: str | bytes = str(letter.get("request", ""))
            # An unsigned letter was never signed by a node: requeued, it would gain the fleet's
            # authority. Unless its signature holds after all: an entry of a newer version that
            # a node of an older one could not read (during a rolling deploy), or one signed with
            # the previous secret by a node that had not been given it yet. The lease reaper
            # keeps the signed entry too.
            if str(letter.get("reason", "")).startswith(UNSIGNED) or str(request).startswith(signing.PREFIXES):
                try:
                    request = signer.verify(str(request).encode("utf-8"))
                except (signing.UnsignedEntry, UnicodeError):
                    return False
            try:
                plain = fresh_request(request)
                fields = serializer.loads(plain)
                priority = int(fields.get("priority", 0))
                data = signer.sign(plain)
            except (ValueError, TypeError, AttributeError):
                return False  # an unreadable entry stays for a human to look at
            if self.queue.shards is None:
                self.queue.lists.push(self.queue.key, [(data, score_for(priority))], client=pipe)
            else:
                # The shard's queue is in another slot than the dead letters, so not in their
                # transaction: queued first, then taken off the list (a crash repeats, never drops).
                shard = self.queue.shards.of_url(str(fields.get("url", "")))
                self.queue.lists.push(self.queue.keys[shard], [(data, score_for(priority))])
            return True

        # The index keeps a requeued request: should it fail again, its count goes on.
        return self._take(reason, move, forget=False)

    def purge_api_calls(self) -> int:
        """Delete the entries that are scraping-API calls of an earlier version (they hold the
        API key and are no target page); returns how many."""

        def leaked(pipe: Any, letter: dict[str, Any]) -> bool:
            try:
                return is_leaked_api_call(serializer.loads(signing.unwrap(letter["request"])))
            except (ValueError, TypeError, KeyError):
                return False

        return self._take(None, leaked, forget=True)

    def purge(self, reason: str | None = None) -> int:
        """Delete entries (all, or those whose reason starts with *reason*); returns how many."""
        return self._take(reason, lambda pipe, letter: True, forget=True)

    def _take(self, reason: str | None, action: Callable[[Any, dict[str, Any]], bool], forget: bool) -> int:
        taken = 0
        for raw in self.server.lrange(self.key, 0, -1):
            letter = json.loads(raw)
            if reason and not str(letter.get("reason", "")).startswith(reason):
                continue
            pipe = self.server.pipeline(transaction=True)
            if not action(pipe, letter):
                continue
            pipe.lrem(self.key, 1, raw)
            ident = _identity_of(letter) if forget else None
            if ident:
                # Only if the index still points at this very entry.
                pipeline_eval(pipe, _HDEL_IF, [self.index_key], [ident, raw])
            pipe.execute()
            taken += 1
        return taken


_HDEL_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


def _count(raw: bytes | str) -> int:
    try:
        return int(json.loads(raw).get("count", 1))
    except (ValueError, TypeError, AttributeError):
        return 1


def _identity_of(letter: dict[str, Any]) -> str | None:
    try:
        data = serializer.loads(signing.unwrap(letter["request"]))
        return identity(Request(data["url"], method=data.get("method", "GET"), body=data.get("body") or b""))
    except (ValueError, TypeError, KeyError):
        return None
