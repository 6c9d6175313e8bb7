"""One spider's frontier split into ``SCHEDULER_SHARDS`` shards, by the domain of each request.

A shard is a queue, its leases and its seen-state, all under one hash tag, so that the scripts
that claim a URL and queue it, or take a request into a lease, stay within one slot of a Redis
Cluster while the shards spread a single huge crawl over every master. A URL always lands in
the shard of its host, so the seen-state of a shard is exact, and one domain's requests keep
their order in one queue (politeness is per domain anyway, in keys of its own).

With one shard (the default) the frontier is the spider's own keys (``{<spider>}:requests``...),
exactly as before sharding existed. With N > 1, shard i's tag is ``{<spider>/<k>}`` with the
smallest k whose hash slot falls in the i-th N-th of the 16,384 slots: a cluster whose masters
own equal ranges of slots (what ``redis-cli --cluster create`` makes) gets the shards evenly.

The count is fixed per run: the node that starts a run records it, and every node, command
and metric of that run uses the recorded count (see :func:`shard_count`).
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from . import keys
from .lists import Lists

#: More shards than hash slots per master would be pointless; this bounds the tag search.
MAX_SHARDS = 1024


class Shards:
    def __init__(self, spider_name: str, count: int = 1) -> None:
        if not 1 <= count <= MAX_SHARDS:
            raise ValueError(f"SCHEDULER_SHARDS: expected 1 to {MAX_SHARDS}, got {count!r}")
        self.spider = spider_name
        self.count = count
        self.prefixes = [keys.prefix(spider_name)] if count == 1 else list(_prefixes(spider_name, count))

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Shards({self.spider!r}, {self.count})"

    def of_url(self, url: str) -> int:
        """The shard of *url*: by its host, so a domain's requests share one shard."""
        if self.count == 1:
            return 0
        return _shard_of_host(_host(url), self.count)

    def queue_key(self, shard: int) -> str:
        return f"{self.prefixes[shard]}:requests"

    def queue_keys(self) -> list[str]:
        return [self.queue_key(i) for i in range(self.count)]

    def lease_keys(self, shard: int) -> dict[str, str]:
        return keys.lease_keys_under(self.prefixes[shard])

    def dead_key(self, shard: int) -> str:
        """Where a shard's lease reaper sets requests aside; moved to the spider's dead letters
        at once (a script may not write across slots)."""
        return keys.dead_key(self.spider) if self.count == 1 else f"{self.prefixes[shard]}:dead"

    def seen_key(self, shard: int, base_key: str) -> str:
        """The seen-state key of *shard* for the spider-wide *base_key* (``{spider}:dupefilter``)."""
        if self.count == 1:
            return base_key
        main = keys.prefix(self.spider)
        rest = base_key[len(main) :] if base_key.startswith(main) else ":" + base_key
        return f"{self.prefixes[shard]}{rest}"


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


@lru_cache(maxsize=65536)
def _shard_of_host(host: str, count: int) -> int:
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % count


@lru_cache(maxsize=256)
def _prefixes(spider_name: str, count: int) -> tuple[str, ...]:
    out = []
    width = REDIS_CLUSTER_HASH_SLOTS / count
    k = 0
    for shard in range(count):
        while True:
            tag = f"{spider_name}/{k}"
            k += 1
            if int(key_slot(tag.encode()) // width) == shard:
                out.append("{" + tag + "}")
                break
            if k > 200_000 * count:  # never for sane counts; a clear error rather than a hang
                raise ValueError(f"SCHEDULER_SHARDS: no hash tag found for shard {shard} of {count}")
    return tuple(out)


def shards_setting(settings: Any) -> int:
    from ..config import ConfigError, get_int

    count = get_int(settings, "SCHEDULER_SHARDS", 1, minimum=1)
    if count > MAX_SHARDS:
        raise ConfigError(f"SCHEDULER_SHARDS: at most {MAX_SHARDS}, got {count}")
    return count


def shard_count(server: Any, spider_name: str, settings: Any = None) -> int:
    """The shard count of the spider's current run, or of the next one (the setting)."""
    state, recorded = server.hmget(keys.run_key(spider_name), "state", "shards")
    if recorded and state != b"finished":
        return int(recorded)
    return shards_setting(settings) if settings is not None else 1


def for_spider(server: Any, spider_name: str, settings: Any = None) -> Shards:
    return Shards(spider_name, shard_count(server, spider_name, settings))


def discard_shards(server: Any, shards: Shards, run_keys: list[str]) -> int:
    """Delete a sharded frontier (queues, leases, replica marks) and *run_keys* (its seen-state);
    returns how many requests were queued or leased in it."""
    queues = Lists(server)
    dropped = 0
    for shard in range(shards.count):
        lease_keys = shards.lease_keys(shard)
        dropped += queues.clear(shards.queue_key(shard)) + server.zcard(lease_keys["deadlines"])
        for name in (*lease_keys.values(), f"{shards.prefixes[shard]}:sync"):
            server.delete(name)  # one by one: each shard in a slot of its own
    for name in run_keys:
        server.delete(name)
    return dropped
