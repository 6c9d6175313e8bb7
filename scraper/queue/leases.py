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

import time
import uuid
from typing import Any

from ..redis_client import register_script
from . import keys

#: Signal (``request=``): a component could not finish with this request safely (e.g. it could
#: not write its dead letter while Redis was away). Its lease is then neither acknowledged nor
#: renewed: it runs out and the request is delivered again.
lease_abandoned = object()

# KEYS: pending, leased, deadlines, owners. ARGV: count, deadline, owner.
_TAKE = """
local items = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
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
_REAP = """
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
      redis.call('ZADD', KEYS[1], score, data)
      requeued = requeued + 1
    end
  end
end
return {requeued, dead}
"""


class Leases:
    def __init__(self, server: Any, spider_name: str, queue_key: str, dead_key: str, ttl: float,
                 max_redeliveries: int = 5, owner: str | None = None) -> None:
        self.server = server
        self.ttl = ttl
        self.max_redeliveries = max_redeliveries
        self.pending_key = queue_key
        names = keys.lease_keys(spider_name)
        self.leased_key = names["leased"]
        self.deadlines_key = names["deadlines"]
        self.redeliveries_key = names["redeliveries"]
        self.owners_key = names["owners"]
        self.dead_key = dead_key
        self.owner = owner or uuid.uuid4().hex
        self.mine: set[str] = set()
        self._take = register_script(server, _TAKE)
        self._owned = register_script(server, _OWNED)
        self._reap = register_script(server, _REAP)
        self._last_renewal = 0.0

    def take(self, count: int) -> list[tuple[str, float, bytes]]:
        """Lease up to *count* requests: (lease id, score, data), best first."""
        flat = self._take(keys=[self.pending_key, self.leased_key, self.deadlines_key, self.owners_key],
                          args=[count, time.time() + self.ttl, self.owner])
        taken = [(flat[i].decode(), float(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]
        self.mine.update(lease for lease, _, _ in taken)
        return taken

    def ack(self, ids: set[str]) -> None:
        if not ids:
            return
        self._on_owned("ack", ids)
        self.mine -= ids

    def _on_owned(self, action: str, ids: set[str], deadline: float = 0.0) -> None:
        lost = self._owned(keys=[self.leased_key, self.deadlines_key, self.redeliveries_key, self.owners_key],
                           args=[action, self.owner, deadline, *ids])
        if lost:
            # Reaped while this worker stalled, perhaps taken by another: no longer ours.
            self.mine -= {i.decode() if isinstance(i, bytes) else i for i in lost}

    def give_back(self, taken: list[tuple[str, float, bytes]]) -> None:
        """Requests leased but never handed out: straight back to the queue, lease dropped.

        Queued first, then released: a crash in between, or a lease that another worker took
        over meanwhile, costs at most one more delivery, never a request."""
        if not taken:
            return
        self.server.zadd(self.pending_key, {data: score for _, score, data in taken})
        self.ack({lease for lease, _, _ in taken})

    def renew(self, force: bool = False) -> None:
        now = time.time()
        if self.mine and (force or now - self._last_renewal >= self.ttl / 3):
            self._on_owned("renew", set(self.mine), now + self.ttl)
            self._last_renewal = now

    def reap(self) -> tuple[int, int]:
        """Put requests whose lease ran out back in the queue (or in the dead letters)."""
        requeued, dead = self._reap(
            keys=[self.pending_key, self.leased_key, self.deadlines_key, self.redeliveries_key, self.dead_key,
                  self.owners_key],
            args=[time.time(), self.max_redeliveries, 500],
        )
        return int(requeued), int(dead)

    def outstanding_elsewhere(self) -> int:
        """Leases held by other workers (they may still put requests back)."""
        return max(0, self.server.zcard(self.deadlines_key) - len(self.mine))
