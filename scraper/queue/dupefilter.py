"""The cluster-wide "seen requests" state, with a local pre-check.

scrapy-redis' dupefilter sends one blocking ``SADD`` per extracted link from the reactor thread
and computes its own SHA1, ignoring ``REQUEST_FINGERPRINTER_CLASS``. Most links a page yields
(navigation, breadcrumbs, pagination) were already seen by this very process, so a bounded
in-process set answers those without a round trip; Redis stays the authority for everything
the process has not seen itself.

Where Redis keeps the fingerprints is a backend (``DUPEFILTER_BACKEND``):

* ``set`` (default): a Redis set, exact, about 90 bytes per URL (``{<spider>}:dupefilter``);
* ``bloom``: a Bloom filter, about 1.8 bytes per URL at 0.1% false positives, fixed size
  (``{<spider>}:bloom``, see :mod:`.bloom`).

Both can forget fingerprints after ``DUPEFILTER_EXPIRY`` seconds (see :mod:`.generations`), so
a site is recrawled once its pages are older than that. Both claim a fingerprint and queue its
request in one atomic script (:meth:`SharedDupeFilter.push_if_new`), pipelined by the queue.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy_redis.dupefilter import RFPDupeFilter

from ..backends.redis_client import register_script
from ..config import ConfigError, get_choice, get_float
from . import keys, lists
from .bloom import BloomFilter, BloomSeen
from .generations import GenerationalClaims, Generations
from .shards import Shards, for_spider

logger = logging.getLogger(__name__)

BACKENDS = ("set", "bloom")


@dataclass(frozen=True)
class SeenConfig:
    backend: str
    expiry: float
    bloom: BloomFilter


def seen_config(settings: Any) -> SeenConfig:
    """Read and check the ``DUPEFILTER_*`` settings; raise ConfigError naming a bad one."""
    backend = get_choice(settings, "DUPEFILTER_BACKEND", "set", BACKENDS)
    expiry = get_float(settings, "DUPEFILTER_EXPIRY", 0.0, minimum=0)
    if 0 < expiry < 1:
        raise ConfigError(f"DUPEFILTER_EXPIRY: must be 0 (never) or at least 1 second, got {expiry!r}")
    return SeenConfig(backend, expiry, BloomFilter.from_settings(settings))


# Claim a fingerprint and, if it is new, queue its request: one round trip, atomically.
# KEYS: current set, previous set (the same key without expiry), [queue].
# ARGV: fingerprint, expire-at in unix ms (0: never), [score, request].
_CLAIM = (
    lists.PUSH_LUA
    + """
if KEYS[2] ~= KEYS[1] and redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 0 end
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[2] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[2]) end
if KEYS[3] then q_push(KEYS[3], ARGV[3], ARGV[4], false) end
return 1
"""
)


# The same for every request of a flush bound for one queue, in one script call: the client
# packed the script's text and its arguments once per request, 0.97-1.22 ms of the reactor
# thread per 23-link flush against 0.43-0.61 ms as one call (Redis' own time is the same).
# KEYS: current set, previous set, queue. ARGV: expire-at (as above), then (fingerprint,
# score, request) per request. Returns 1 (queued) or 0 for each.
_CLAIM_MANY = (
    lists.PUSH_LUA
    + """
local current, previous, queued, added = KEYS[1], KEYS[2], {}, false
for i = 2, #ARGV, 3 do
  local new = 0
  if not (previous ~= current and redis.call('SISMEMBER', previous, ARGV[i]) == 1)
      and redis.call('SADD', current, ARGV[i]) == 1 then
    q_push(KEYS[3], ARGV[i + 1], ARGV[i + 2], false)
    new, added = 1, true
  end
  queued[#queued + 1] = new
end
if added and ARGV[1] ~= '0' then redis.call('PEXPIREAT', current, ARGV[1]) end
return queued
"""
)


class SeenSet(GenerationalClaims):
    """The seen-state of one spider in a Redis set (one per generation with an expiry).

    The interface both backends share:

    * ``generation()``: changes when fingerprints may have been forgotten (0 without expiry);
    * ``push_if_new(pipe, fingerprint, queue_key, score, data)``: add exactly one command to
      *pipe* that claims the fingerprint and, if it was new, queues the request (result 1, else 0);
      a store may also offer ``push_many_if_new(pipe, entries, queue_key)``, one command for
      many ``(fingerprint, score, data)`` whose result is a list of those 1s and 0s;
    * ``add(fingerprint)``: claim it now; True if it was new; ``add_many`` pipelines that;
    * ``keys()``: the keys holding what is remembered now; ``run_keys()``: those to drop when
      a crawl finishes (none with an expiry: remembering across runs is the point);
    * ``size()``: how many fingerprints are remembered (read-only); ``clear()``: forget all.
    """

    def __init__(self, server: Any, key: str, expiry: float = 0.0) -> None:
        self.server = server
        self.base = key
        self.generations = Generations(server, expiry)
        self._claim = register_script(server, _CLAIM)
        self._claim_many = register_script(server, _CLAIM_MANY)

    @property
    def expiry(self) -> float:
        return self.generations.expiry

    def generation(self) -> int:
        return self.generations.current()

    def push_many_if_new(self, pipe: Any, entries: list[tuple[str, float, bytes]], queue_key: str) -> None:
        current, previous, expire_at = self.generations.keys(self.base)
        args: list[Any] = [expire_at]
        for fingerprint, score, data in entries:
            args += (fingerprint, score, data)
        self._claim_many(keys=[current, previous, queue_key], args=args, client=pipe)

    def push_if_new(self, pipe: Any, fingerprint: str, queue_key: str, score: float, data: bytes) -> None:
        current, previous, expire_at = self.generations.keys(self.base)
        self._claim(keys=[current, previous, queue_key], args=[fingerprint, expire_at, score, data], client=pipe)

    def _claim_into(self, fingerprint: str, current: str, previous: str, expire_at: Any, client: Any = None) -> Any:
        return self._claim(keys=[current, previous], args=[fingerprint, expire_at], client=client)

    def keys(self) -> list[str]:
        return self.generations.live_keys(self.base)

    def run_keys(self) -> list[str]:
        return [] if self.expiry else self.keys()

    def clear(self) -> None:
        self.server.delete(*self.keys())

    def size(self) -> float:
        # A generation never holds what the previous one does, so the counts add up.
        names = self.keys()
        pipe = self.server.pipeline(transaction=False)
        for name in names:
            pipe.type(name)
        kinds = pipe.execute()
        sets = [name for name, kind in zip(names, kinds) if kind in (b"set", "set")]
        for name in sets:
            pipe.scard(name)
        return float(sum(pipe.execute())) if sets else 0.0


def make_store(server: Any, spider_name: str, settings: Any) -> SeenSet | BloomSeen:
    """The seen-state of *spider_name* as *settings* configure it (nothing is written)."""
    return make_stores(server, spider_name, settings)[0]


def make_stores(
    server: Any, spider_name: str, settings: Any, shards: Shards | None = None
) -> list[SeenSet | BloomSeen]:
    """The seen-state of each shard of *spider_name*'s frontier (one without *shards*). A
    Bloom filter's capacity is shared out between the shards."""
    config = seen_config(settings)
    shards = shards or Shards(spider_name)
    if config.backend == "bloom":
        bloom = config.bloom
        if shards.count > 1:
            bloom = BloomFilter.for_capacity(math.ceil(bloom.capacity / shards.count), bloom.error_rate)
        return [
            BloomSeen(server, shards.seen_key(i, keys.bloom_key(spider_name)), bloom, config.expiry)
            for i in range(shards.count)
        ]
    custom = settings.get("SCHEDULER_DUPEFILTER_KEY")
    key = custom % {"spider": spider_name} if custom else keys.dupefilter_key(spider_name)
    return [SeenSet(server, shards.seen_key(i, key), config.expiry) for i in range(shards.count)]


def seen_size(server: Any, spider_name: str, settings: Any) -> float:
    """Fingerprints remembered for *spider_name*: exact for a set, estimated for a Bloom filter."""
    shards = for_spider(server, spider_name, settings)
    return sum(store.size() for store in make_stores(server, spider_name, settings, shards))


class SharedDupeFilter(RFPDupeFilter):
    def __init__(
        self,
        server: Any,
        key: str,
        fingerprinter: Any,
        debug: bool = False,
        local_cache_size: int = 20_000,
        stats: Any = None,
        store: SeenSet | BloomSeen | None = None,
        stores: list[SeenSet | BloomSeen] | None = None,
        shards: Shards | None = None,
    ) -> None:
        # One store per shard of the frontier (see .shards); the first stands for them all
        # where one is asked for (expiry, generation: they share the settings and the clock).
        self.stores = stores or [store if store is not None else SeenSet(server, key)]
        self.store = self.stores[0]
        self.shards = shards if len(self.stores) > 1 else None
        super().__init__(server, self.store.base, debug=debug)
        self.fingerprinter = fingerprinter
        self.local_cache_size = local_cache_size
        self._local: set[bytes] = set()
        self._generation = self.store.generation()
        self.stats = stats

    def request_fingerprint(self, request: Request) -> str:
        return self.fingerprinter.fingerprint(request).hex()

    def seen_locally(self, request: Request) -> tuple[bool, str]:
        """Answer from this process' memory alone: (seen before here, hex fingerprint).

        A request not seen here is remembered as seen: the caller is about to claim it in
        Redis (see :meth:`request_seen`, or :meth:`push_if_new` from the queue's flush)."""
        generation = self.store.generation()
        if generation != self._generation:
            # Redis forgets a generation at a time; the local copy must not remember longer.
            self._local.clear()
            self._generation = generation
        fp = self.fingerprinter.fingerprint(request)
        if fp in self._local:
            if self.stats is not None:
                self.stats.inc_value("dupefilter/local_hits")
            return True, ""
        if len(self._local) >= self.local_cache_size:
            # Redis holds the truth, so forgetting the local copy only costs round trips.
            self._local.clear()
        self._local.add(fp)
        return False, fp.hex()

    def request_seen(self, request: Request) -> bool:
        seen, fp = self.seen_locally(request)
        store = self.stores[self.shards.of_url(request.url)] if self.shards is not None else self.store
        return seen or not store.add(fp)

    def push_if_new(
        self, pipe: Any, fingerprint: str, queue_key: str, score: float, data: bytes, shard: int = 0
    ) -> None:
        """Add to *pipe* one command that claims *fingerprint* in *shard*'s seen-state and, if no
        process had claimed it, queues *data* in *queue_key* with *score*; its result is 1 if
        queued, else 0."""
        self.stores[shard].push_if_new(pipe, fingerprint, queue_key, score, data)

    def can_push_many(self, shard: int = 0) -> bool:
        return hasattr(self.stores[shard], "push_many_if_new")

    def push_many_if_new(
        self, pipe: Any, entries: list[tuple[str, float, bytes]], queue_key: str, shard: int = 0
    ) -> None:
        """:meth:`push_if_new` for many ``(fingerprint, score, data)`` in one command, whose
        result is a list of 1 (queued) or 0 per entry (only where :meth:`can_push_many`)."""
        self.stores[shard].push_many_if_new(pipe, entries, queue_key)

    def run_keys(self) -> list[str]:
        """Keys of the seen-state to drop when the crawl has finished on every node, where they
        share the spider's slot (unsharded); see :meth:`shard_run_keys` for the others."""
        return self.store.run_keys() if self.shards is None else []

    def shard_run_keys(self) -> list[str]:
        """The run keys of a sharded seen-state (each shard in a slot of its own)."""
        return [] if self.shards is None else [k for store in self.stores for k in store.run_keys()]

    def size(self) -> float:
        return sum(store.size() for store in self.stores)

    def begun(self) -> None:
        """The node has begun its run, whose start may have dropped the seen-state it opened:
        each store reads its shape again at its next claim."""
        for store in self.stores:
            store.forget_shape()

    def clear(self) -> None:
        for store in self.stores:
            store.clear()
        self._local.clear()

    def forget_local(self) -> None:
        """Drop the local pre-check: Redis alone answers until this process has seen links again."""
        self._local.clear()

    def close(self, reason: str = "") -> None:
        # Never delete the shared state here: other nodes are still using it.
        self._local.clear()
