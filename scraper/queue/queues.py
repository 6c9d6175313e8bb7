"""The per-spider request queue in Redis.

A subclass of scrapy-redis' priority queue, kept as lists by priority and minute (see
:mod:`.lists`), that serializes through
:mod:`scraper.queue.requests` and JSON, and turns a request that cannot be serialized into one
clear error naming the spider, the callback and the offending value. Pushing and popping stay
methods of this class so that leased delivery (pop into a lease, acknowledge later) can replace
them without touching the scheduler.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from scrapy import Request
from scrapy_redis.queue import PriorityQueue as _RedisPriorityQueue

from ..backends.redis_client import register_script
from . import serializer as json_serializer
from . import signing
from .dead_entry import entry as dead_entry
from .keys import dead_key, queue_key
from .lists import Lists
from .requests import is_leaked_api_call, request_from_dict, request_to_dict, share_callback
from .scores import PRIORITY_STEP as _PRIORITY_STEP
from .scores import enqueued_at, score_for  # noqa: F401  (imported from here by other modules)
from .serializer import SerializationError
from .shards import Shards

logger = logging.getLogger(__name__)


class LeakedApiCall(ValueError):
    """A queue entry that is not a target request but an API call holding the key."""


LEASE_META = "_lease"


class RequestSerializationError(Exception):
    """A request cannot be put in the shared queue."""


# Requests a process keeps to hand back as they are (see PriorityQueue._own): ~3 MB at most.
OWN_REQUESTS = 2000


# KEYS: a lock. ARGV: the holder's token. Deletes the lock if it is still that holder's.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class PriorityQueue(_RedisPriorityQueue):
    """*key* is the queue of an unsharded frontier; with *shards* (see :mod:`.shards`) of more
    than one, each request goes to the queue of its domain's shard and pops go round them."""

    def __init__(
        self,
        server: Any,
        spider: Any,
        key: str,
        serializer: Any = None,
        prefetch: int = 1,
        shards: Shards | None = None,
    ) -> None:
        super().__init__(server, spider, key, serializer or json_serializer)
        # Entries in the serializer's compact form where it has one (each queued request pays
        # for its entry's length in Redis memory); a SCHEDULER_SERIALIZER of its own uses dumps.
        self._dumps_entry = getattr(self.serializer, "dumps_compact", self.serializer.dumps)
        self._callback_names: dict[Any, str] = {}
        # Every entry written is signed, every entry read verified (see signing.py).
        self.signer = signing.current()
        self.prefetch = max(1, prefetch)
        self.lists = Lists(server)
        self._release = register_script(server, _RELEASE)
        self.shards = shards if shards is not None and shards.count > 1 else None
        self.keys = shards.queue_keys() if self.shards is not None else [key]
        # The next shard to pop from, and until when a shard found empty is skipped.
        self._turn = 0
        self._empty_until = [0.0] * len(self.keys)
        # Requests encoded but not yet sent: (dupefilter or None, fingerprint, score, data, shard).
        self._staged: list[tuple[Any, str, float, bytes, int]] = []
        # Requests taken from Redis but not yet handed to the engine: (lease id, score, data, shard).
        self._prefetched: list[tuple[str | None, float, bytes, int]] = []
        # Requests this process staged, by their JSON: popped back here, the object itself is
        # handed to the engine, as Scrapy's memory queue does, rather than rebuilt from its JSON
        # (~114k instructions per request; on one node crawling alone that is every request,
        # in a fleet of N about 1 in N). Cleared when full, so what one node staged and another
        # took, or the dupefilter refused, is held no longer than that.
        self._own: dict[bytes, Request] = {}
        # Set by the scheduler for at-least-once delivery (see leases.py); None: plain pops.
        self.leases: Any = None
        # Set by the scheduler on a sharded cluster (see replication.py): told which shards
        # each flush wrote to.
        self.barrier: Any = None

    def shard_of(self, request: Request) -> int:
        return self.shards.of_url(request.url) if self.shards is not None else 0

    def key_of(self, request: Request) -> str:
        return self.keys[self.shard_of(request)]

    def push(self, request: Request) -> None:
        self.lists.push(self.key_of(request), [(self._encode_request(request), score_for(request.priority))])

    def __len__(self) -> int:
        if len(self.keys) == 1:
            return int(self.lists.length(self.key))
        pipe = self.server.pipeline(transaction=False)
        for key in self.keys:
            self.lists.length(key, client=pipe)
        return sum(map(int, pipe.execute()))

    def clear(self) -> None:
        self._own.clear()
        for key in self.keys:  # one by one: the shards' keys are in different slots
            self.lists.clear(key)

    def stage(self, request: Request, dupefilter: Any = None, fingerprint: str = "") -> None:
        """Encode *request* now (errors surface to the caller), send it with the next flush.

        With a *dupefilter* (see :meth:`~.dupefilter.SharedDupeFilter.push_if_new`) the request
        is queued only if no process has claimed *fingerprint* yet; without, it is queued.
        A page yields its links in one burst; sending them in one pipelined round trip
        instead of one each is most of the difference to a local scheduler."""
        data = self._encode_request(request)
        self._staged.append((dupefilter, fingerprint, score_for(request.priority), data, self.shard_of(request)))
        if len(self._own) >= OWN_REQUESTS:
            self._own.clear()
        self._own[data] = request

    def flush_staged(self) -> tuple[int, int]:
        """Send staged requests; returns (queued, already seen by another process)."""
        if not self._staged:
            return 0, 0
        staged, self._staged = self._staged, []
        try:
            return self._send_staged(staged)
        except Exception:
            # Redis unreachable: keep them for the next flush. A request already queued by a
            # pipeline cut short is filtered then as seen; one that skips the seen-set
            # (dont_filter) is queued again, as at-least-once delivery allows.
            self._staged[:0] = staged
            raise

    def _send_staged(self, staged: list[tuple[Any, str, float, bytes, int]]) -> tuple[int, int]:
        pipe = self.server.pipeline(transaction=False)
        # The requests of one seen-state (or of none) and shard go as one command where the
        # store offers it; otherwise one command per request. Each command's result is a count
        # (plain pushes), a list of 1s and 0s (a store's many), or one 1 or 0.
        plain: dict[int, list[tuple[bytes, float]]] = {}
        many: dict[tuple[int, int], tuple[Any, int, list[tuple[str, float, bytes]]]] = {}
        for dupefilter, fingerprint, score, data, shard in staged:
            if dupefilter is None:
                plain.setdefault(shard, []).append((data, score))
            elif getattr(dupefilter, "can_push_many", lambda shard: False)(shard):
                many.setdefault((id(dupefilter), shard), (dupefilter, shard, []))[2].append((fingerprint, score, data))
            else:
                dupefilter.push_if_new(pipe, fingerprint, self.keys[shard], score, data, shard)
        for dupefilter, shard, entries in many.values():
            dupefilter.push_many_if_new(pipe, entries, self.keys[shard], shard)
        for shard, entries in plain.items():
            self.lists.push(self.keys[shard], entries, client=pipe)
        results = pipe.execute()
        if self.barrier is not None:
            self.barrier.written({shard for *_, shard in staged})
        queued = sum(sum(map(int, r)) if isinstance(r, list) else int(r or 0) for r in results)
        return queued, len(staged) - queued

    def oldest_age(self, now: float | None = None) -> float:
        """Seconds since the oldest queued request was queued (0 when empty).

        Exact when the queue holds at most two priorities (the usual case): it looks at the
        oldest entry of the highest and of the lowest priority, two round trips."""
        now = time.time() if now is None else now
        return max((self._oldest_age(key, now) for key in self.keys), default=0.0)

    def _oldest_age(self, key: str, now: float) -> float:
        ends = self.lists.head_scores(key)
        if not ends:
            return 0.0
        block = (ends[1] // _PRIORITY_STEP) * _PRIORITY_STEP
        lowest = self.lists.first_at_or_after(key, block)
        oldest = min(enqueued_at(score) for score in (ends[0], ends[1] if lowest is None else lowest))
        return max(0.0, now - oldest)

    def staged_count(self) -> int:
        return len(self._staged)

    def local_pending(self) -> int:
        return len(self._staged) + len(self._prefetched)

    def prefetched_count(self) -> int:
        return len(self._prefetched)

    def prefetched_leases(self) -> set[str]:
        return {lease for lease, _, _, _ in self._prefetched if lease}

    def return_prefetched(self) -> int:
        """Put requests taken but never handed out back into the shared queue (on close)."""
        if not self._prefetched:
            return 0
        taken, self._prefetched = self._prefetched, []
        if self.leases is not None:
            self.leases.give_back([(lease, score, data) for lease, score, data, _ in taken])
        else:
            for shard in {shard for _, _, _, shard in taken}:
                self.lists.push(
                    self.keys[shard], [(data, score) for _, score, data, s in taken if s == shard], head=True
                )
        return len(taken)

    def adopt_unsharded(self) -> int:
        """Move requests queued in the spider's unsharded queue (by a seed or a requeue made
        while another shard count was in force) into their shards; returns how many.

        Queued in the shard first, removed after: a crash in between repeats a request. One
        node at a time (a lock that runs out should it die), so two never move the same list."""
        if self.shards is None or not self.lists.length(self.key):
            return 0
        lock, token = f"{self.key}:adopting", uuid.uuid4().hex
        if not self.server.set(lock, token, nx=True, px=60_000):
            return 0
        moved = 0
        try:
            while (head := self.lists.peek(self.key, 1000)) is not None:
                name, entries, score = head
                by_shard: dict[int, list[tuple[bytes, float]]] = {}
                for data in entries:
                    try:
                        url = str(self.serializer.loads(signing.unwrap(data)).get("url", ""))
                    except (ValueError, TypeError, AttributeError):
                        url = ""  # unreadable: the first shard's pop sets it aside as a dead letter
                    by_shard.setdefault(self.shards.of_url(url), []).append((data, score))
                for shard, members in by_shard.items():
                    self.lists.push(self.keys[shard], members)
                moved += self.lists.drop_head(self.key, name, entries)
                self.server.pexpire(lock, 60_000)
        finally:
            # Only this node's lock: one that ran out may be another node's by now.
            self._release(keys=[lock], args=[token])
        return moved

    def _take(self, count: int) -> list[tuple[str | None, float, bytes, int]]:
        """Up to *count* requests from the next shard that has any, shards taken in turn (so a
        shard of a few busy domains cannot starve the others); a shard found empty is skipped
        for a moment, so that an almost empty frontier costs no round trip per empty shard."""
        now = time.monotonic()
        n = len(self.keys)
        for step in range(n):
            shard = (self._turn + step) % n
            if n > 1 and self._empty_until[shard] > now and step < n - 1:
                continue
            if self.leases is not None:
                taken = [(lease, score, data, shard) for lease, score, data in self.leases.take(count, shard)]
            else:
                taken = [(None, score, data, shard) for data, score in self.lists.pop(self.keys[shard], count)]
            if taken:
                self._turn = (shard + 1) % n
                return taken
            self._empty_until[shard] = now + 0.5
        return []

    def _encode_request(self, request: Request) -> bytes:
        return self.signer.sign(self.encode_plain(request, compact=True))

    def encode_plain(self, request: Request, compact: bool = False) -> bytes:
        """*request*'s JSON, unsigned: the queue entry's (*compact*) or the full form, which
        versions before the compact entry read too (dead letters keep it)."""
        try:
            dumps = self._dumps_entry if compact else self.serializer.dumps
            return dumps(request_to_dict(request, self.spider, self._callback_names))
        except SerializationError as exc:
            callback = getattr(request.callback, "__name__", request.callback) or "parse"
            raise RequestSerializationError(
                f"spider {self.spider.name!r}, callback {callback!r}: cannot queue {request.url}: {exc}"
            ) from None

    def _decode_request(self, encoded_request: bytes | str) -> Request:
        try:
            payload = self.signer.verify(encoded_request)
        except signing.UnsignedEntry:
            # An earlier version's raw API call is unsigned too, and holds the key: deleted, never
            # dead-lettered with it (what it claims is only looked at, never trusted or fetched).
            try:
                leaked = is_leaked_api_call(self.serializer.loads(signing.unwrap(encoded_request)))
            except (ValueError, TypeError, KeyError, AttributeError):
                leaked = False
            if leaked:
                raise LeakedApiCall("a scraping-API call queued by an earlier version (it holds the API key)") from None
            raise
        data = self.serializer.loads(payload)
        if is_leaked_api_call(data):
            raise LeakedApiCall("a scraping-API call queued by an earlier version (it holds the API key)")
        return request_from_dict(data, self.spider)

    def pop(self, timeout: int = 0, limit: int | None = None) -> Request | None:
        # A pop takes the best entries atomically, several per round trip when
        # prefetching (at most *limit*, when given). A corrupt entry is set aside rather than
        # crashing the engine loop.
        if not self._prefetched:
            self._prefetched = list(reversed(self._take(max(1, min(self.prefetch, limit or self.prefetch)))))
            if not self._prefetched:
                return None
        lease, _score, data, _shard = self._prefetched.pop()
        try:
            request = self._own.pop(data, None)
            if request is None:
                request = self._decode_request(data)
            else:
                share_callback(request, self.spider)
            if lease:
                request.meta[LEASE_META] = lease
            return request
        except LeakedApiCall as exc:
            if lease:
                self.leases.ack({lease})
            # Never fetched (it would send the raw API call) nor dead-lettered (it holds the key).
            logger.error("Deleted from %s: %s", self.key, exc)
            return None
        except signing.UnsignedEntry as exc:
            if lease:
                self.leases.ack({lease})
            # Forged, or signed with a retired secret: never fetched, kept for an operator to see.
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            self.server.rpush(dead_key(self.spider.name), dead_entry("unsigned", 1, _url_of(text), text))
            stats = getattr(getattr(self.spider, "crawler", None), "stats", None)
            if stats is not None:
                stats.inc_value("dead_letters/count")
                stats.inc_value("dead_letters/unsigned")
            logger.error("Moved an unsigned request from %s to the dead letters (%s)", self.key, exc)
            return None
        except (ValueError, TypeError, KeyError) as exc:
            if lease:
                self.leases.ack({lease})  # set aside below: the lease has nothing left to guard
            # Kept aside, not lost: `scrapy dlq` shows it to an operator.
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            self.server.rpush(dead_key(self.spider.name), dead_entry(f"unreadable {exc}"[:300], 1, None, text))
            logger.error("Moved an unreadable request from %s to the dead letters: %s", self.key, exc)
            return None


def _url_of(text: str) -> str | None:
    """The URL an entry claims, for the operator's listing only (it is not trusted)."""
    try:
        url = json_serializer.loads(signing.unwrap(text)).get("url")
    except (ValueError, TypeError, AttributeError):
        return None
    return str(url)[:2000] if url else None


def frontier(server: Any, spider: Any, settings: Any = None, prefetch: int = 1) -> PriorityQueue:
    """*spider*'s shared queue, sharded as its current run is (or, between runs, as *settings*
    say the next will be): for the tools and readers that are not the scheduler."""
    from .shards import for_spider

    return PriorityQueue(
        server, spider, queue_key(spider.name), prefetch=prefetch, shards=for_spider(server, spider.name, settings)
    )
