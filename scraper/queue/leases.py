"""At-least-once delivery: a request taken from the shared queue is leased, not deleted.

Taking a request moves it, atomically, into a lease (``{<spider>}:leased`` holds it, ``{<spider>}:
lease_deadlines`` when the lease runs out). The scheduler acknowledges a lease once the engine has
finished with its request (downloaded, called back, every item through the pipelines, which pass
an item on only after its commit), and renews the leases it still holds. A worker that dies stops
renewing; once its leases run out, any live node puts those requests back in the queue, past the
seen-set. A request redelivered ``SCHEDULER_MAX_REDELIVERIES`` times becomes a dead letter
instead of killing workers forever. Idempotent upserts make a redelivery harmless.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..backends.redis_client import register_script
from . import keys, lists
from .clock import RedisClock

#: Signal (``request=``): a component could not finish with this request safely (e.g. it could
#: not write its dead letter while Redis was away). Its lease is then neither acknowledged nor
#: renewed: it runs out and the request is delivered again.
lease_abandoned = object()

# KEYS: pending, leased, deadlines, owners. ARGV: count, deadline, owner.
_TAKE = (
    lists.LUA
    + """
local items = q_pop(KEYS[1], tonumber(ARGV[1]))
local out = {}
for i = 1, #items, 2 do
  local data, score = items[i], items[i + 1]
  local id = redis.sha1hex(data)
  redis.call('HSET', KEYS[2], id, score .. '|' .. data)
  redis.call('ZADD', KEYS[3], ARGV[2], id)
  redis.call('HSET', KEYS[4], id, ARGV[3])
  out[#out + 1] = id
  out[#out + 1] = score
  out[#out + 1] = data
end
return out
"""
)

# Acknowledge (ARGV[1] = 'ack') or extend (ARGV[1] = 'renew', ARGV[3] = new deadline) the leases
# in ARGV[4..] that this owner (ARGV[2]) still holds. A lease id is its request's hash: after a
# stalled owner's lease ran out and another worker took the request again, the stalled owner must
# neither acknowledge nor extend the other's lease. Returns the ids it no longer holds.
# KEYS: leased, deadlines, redeliveries, owners.
_OWNED = """
local lost = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[4], id) == ARGV[2] then
    if ARGV[1] == 'ack' then
      redis.call('HDEL', KEYS[1], id)
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
      redis.call('HDEL', KEYS[4], id)
    else
      redis.call('ZADD', KEYS[2], 'XX', ARGV[3], id)
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
"""

# KEYS: pending, leased, deadlines, redeliveries, dead, owners. ARGV: now, max redeliveries, batch.
# A request taken back goes to the head of the list it was taken from (it was next there).
_REAP = (
    lists.PUSH_LUA
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local requeued, dead = 0, 0
for _, id in ipairs(ids) do
  local value = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[6], id)
  if value then
    local sep = string.find(value, '|', 1, true)
    local score, data = string.sub(value, 1, sep - 1), string.sub(value, sep + 1)
    local n = redis.call('HINCRBY', KEYS[4], id, 1)
    if n > tonumber(ARGV[2]) then
      local ok, request = pcall(cjson.decode, data)
      local url = ''
      if ok and type(request) == 'table' and request.url then url = request.url end
      redis.call('RPUSH', KEYS[5], cjson.encode({
        at = tonumber(ARGV[1]), attempts = n, url = url, request = data,
        reason = 'lease expired ' .. n .. ' times: a worker died or stalled holding it'}))
      redis.call('HDEL', KEYS[4], id)
      dead = dead + 1
    else
      q_push(KEYS[1], score, data, true)
      requeued = requeued + 1
    end
  end
end
return {requeued, dead}
"""
)


class _Group:
    """The keys of one shard's queue and leases."""

    def __init__(self, pending: str, names: dict[str, str], dead: str) -> None:
        self.pending_key = pending
        self.leased_key = names["leased"]
        self.deadlines_key = names["deadlines"]
        self.redeliveries_key = names["redeliveries"]
        self.owners_key = names["owners"]
        self.dead_key = dead


class Leases:
    """The leases of one spider's frontier; with *shards* (see :mod:`.shards`), one set of lease
    keys per shard, each next to its shard's queue. Lease ids are request hashes and a request
    lives in one shard only, so an id alone names a lease; this process remembers the shard of
    the leases it holds."""

    def __init__(
        self,
        server: Any,
        spider_name: str,
        queue_key: str,
        dead_key: str,
        ttl: float,
        max_redeliveries: int = 5,
        owner: str | None = None,
        shards: Any = None,
        clock: Any = None,
    ) -> None:
        self.server = server
        self.ttl = ttl
        self.max_redeliveries = max_redeliveries
        self.dead_key = dead_key
        if shards is not None and shards.count > 1:
            self.groups = [
                _Group(shards.queue_key(i), shards.lease_keys(i), shards.dead_key(i)) for i in range(shards.count)
            ]
        else:
            self.groups = [_Group(queue_key, keys.lease_keys(spider_name), dead_key)]
        main = self.groups[0]
        self.pending_key = main.pending_key
        self.leased_key = main.leased_key
        self.deadlines_key = main.deadlines_key
        self.redeliveries_key = main.redeliveries_key
        self.owners_key = main.owners_key
        self.owner = owner or uuid.uuid4().hex
        self.mine: set[str] = set()
        self._shard_of: dict[str, int] = {}
        self._take = register_script(server, _TAKE)
        self._owned = register_script(server, _OWNED)
        self._reap = register_script(server, _REAP)
        self.lists = lists.Lists(server)
        self._last_renewal = 0.0
        # Deadlines are set and judged on Redis' clock: a worker whose own clock runs ahead
        # would otherwise expire the others' leases and fetch their pages again (see .clock).
        self.clock = clock if clock is not None else RedisClock(server)

    def take(self, count: int, shard: int = 0) -> list[tuple[str, float, bytes]]:
        """Lease up to *count* requests of *shard*: (lease id, score, data), best first."""
        group = self.groups[shard]
        flat = self._take(
            keys=[group.pending_key, group.leased_key, group.deadlines_key, group.owners_key],
            args=[count, self.clock.now() + self.ttl, self.owner],
        )
        taken = [(flat[i].decode(), float(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]
        self.mine.update(lease for lease, _, _ in taken)
        if len(self.groups) > 1:
            for lease, _, _ in taken:
                self._shard_of[lease] = shard
        return taken

    def _by_group(self, ids: set[str]) -> dict[int, set[str]]:
        if len(self.groups) == 1:
            return {0: ids}
        out: dict[int, set[str]] = {}
        for lease in ids:
            out.setdefault(self._shard_of.get(lease, 0), set()).add(lease)
        return out

    def ack(self, ids: set[str]) -> None:
        if not ids:
            return
        self._on_owned("ack", ids)
        self.mine -= ids
        if len(self.groups) > 1:
            for lease in ids:
                self._shard_of.pop(lease, None)

    def _on_owned(self, action: str, ids: set[str], deadline: float = 0.0) -> None:
        for shard, part in self._by_group(ids).items():
            group = self.groups[shard]
            lost = self._owned(
                keys=[group.leased_key, group.deadlines_key, group.redeliveries_key, group.owners_key],
                args=[action, self.owner, deadline, *part],
            )
            if lost:
                # Reaped while this worker stalled, perhaps taken by another: no longer ours.
                self.mine -= {i.decode() if isinstance(i, bytes) else i for i in lost}

    def give_back(self, taken: list[tuple[str, float, bytes]]) -> None:
        """Requests leased but never handed out: straight back to the queue, lease dropped.

        Queued first, then released: a crash in between, or a lease that another worker took
        over meanwhile, costs at most one more delivery, never a request."""
        if not taken:
            return
        for shard, part in self._by_group({lease for lease, _, _ in taken}).items():
            self.lists.push(
                self.groups[shard].pending_key,
                [(data, score) for lease, score, data in taken if lease in part],
                head=True,
            )
        self.ack({lease for lease, _, _ in taken})

    def renew(self, force: bool = False) -> None:
        now = self.clock.now()
        if self.mine and (force or now - self._last_renewal >= self.ttl / 3):
            self._on_owned("renew", set(self.mine), now + self.ttl)
            self._last_renewal = now

    def reap(self) -> tuple[int, int]:
        """Put requests whose lease ran out back in the queue (or in the dead letters)."""
        requeued = dead = 0
        for group in self.groups:
            back, buried = self._reap(
                keys=[
                    group.pending_key,
                    group.leased_key,
                    group.deadlines_key,
                    group.redeliveries_key,
                    group.dead_key,
                    group.owners_key,
                ],
                args=[self.clock.now(), self.max_redeliveries, 500],
            )
            requeued, dead = requeued + int(back), dead + int(buried)
            if int(buried) and group.dead_key != self.dead_key:
                self._move_dead(group.dead_key)
        return requeued, dead

    def _move_dead(self, shard_dead: str) -> None:
        # Copied first, trimmed after: a crash in between repeats a dead letter, never drops one.
        letters = self.server.lrange(shard_dead, 0, -1)
        if letters:
            self.server.rpush(self.dead_key, *letters)
            self.server.ltrim(shard_dead, len(letters), -1)

    def outstanding_elsewhere(self) -> int:
        """Leases held by other workers (they may still put requests back)."""
        return max(0, self.held() - len(self.mine))

    def held(self) -> int:
        """Leases held by every worker."""
        if len(self.groups) == 1:
            return self.server.zcard(self.deadlines_key)
        pipe = self.server.pipeline(transaction=False)
        for group in self.groups:
            pipe.zcard(group.deadlines_key)
        return sum(pipe.execute())
