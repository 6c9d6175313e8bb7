"""A spider's current run in Redis, and the transitions between its states, each one atomic.

``{<spider>}:run`` holds the current run: ``id``, ``state`` (running, stopped, finished),
``started``, ``stopped``, ``finished`` and the last node's closing ``reason``. A run is
*finished* when its queue is empty, no request is leased, no fetched response waits in its
stream (``PROCESSING=decoupled``) and no node is alive: the last node
out notices it when it leaves, or else the next ``scrapy crawl`` does when it starts. Either
way, the finish and the drop of the run's keys (seen-set unless ``DUPEFILTER_EXPIRY`` keeps it,
item dedupe claims) happen in the same script that checks the condition, so no run can start
on a dead run's seen-set, and no node can join a run that is being dropped.

A node starting (:meth:`RunState.begin`) finds one of:

* no run, or a finished one: it starts the next (``start``);
* a run with no live node and work left (queued or leased requests): it resumes it
  (``resume``), or with ``fresh`` discards it and starts the next;
* a run with live nodes and work left: it joins (``join``);
* a run with live nodes and nothing queued or leased (``wait``): whatever those nodes do next
  decides: they queue more (then it joins) or they leave (then the run is finished and it
  starts the next). Joining right away would make this node's start requests count as seen.

Node liveness: a heartbeat within the node TTL, except nodes of this host whose process is
gone, which are dead at once.

The run record (and ``<run>:<id>:marker``, for when another node has begun a fresh run in the
emptied Redis) is the marker of the run's shared state: Redis restarted without persistence,
flushed, or failed over to a replica without the latest writes loses it with the queue and the
seen-set. Each node looks for it every heartbeat; a node that finds it gone ends
its part of the run as ``lost`` (never ``finished``: the pages queued in Redis are gone, and
nothing is marked gone), and the next start begins a fresh run from the seeds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..backends.redis_client import register_script
from ..queue import keys, lists
from ..queue.shards import discard_shards
from .nodes import NodeRegistry

#: A finished run's per-node figures are kept this long for ``scrapy runs`` (seconds).
FIGURES_KEEP = 7 * 24 * 3600

#: Signal (no arguments), sent by a node just before it leaves its run: whatever it reports
#: into the run's figures is written now. The last node out judges and records the run from
#: those figures as soon as it has left; a node's own closing report comes later (its
#: ``spider_closed``), too late when it left first by a moment.
leaving_run = object()

#: Signal (``run_id=``, ``reporter=``), sent by a processor (``PROCESSING=decoupled``) just
#: before it acknowledges stream entries: whatever counts its items into the run writes its
#: figures now, under *reporter*. The run cannot finish while the stream holds entries, so the
#: last node out finds every processor's items in the run's figures.
processor_reporting = object()

# Prune dead nodes, count live ones. Shared prologue of both scripts.
# KEYS[2] nodes, KEYS[3] nodes info. ARGV[2] now, ARGV[3] ttl, ARGV[8] queued and ARGV[9] leased
# in the other shards of a sharded frontier (counted just before: a script sees one slot only),
# ARGV[10] shard count, ARGV[11] n dead, ARGV[12..] dead ids.
_LIVE = (
    lists.LUA
    + """
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local other_queued, other_leased = tonumber(ARGV[8]), tonumber(ARGV[9])
for i = 12, 11 + tonumber(ARGV[11]) do
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
end
local live = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] and tonumber(all[i + 1]) >= now - ttl then
    live = live + 1
  elseif all[i] ~= ARGV[1] then
    redis.call('HDEL', KEYS[2], all[i])
    redis.call('HDEL', KEYS[3], all[i])
  end
end
local function finish(id, reason)
  redis.call('HSET', KEYS[1], 'state', 'finished', 'finished', now, 'reason', reason)
  -- The figures key is derived from the run id; it shares the run key's hash tag (one slot).
  redis.call('EXPIRE', ARGV[6] .. id .. ':figures', ARGV[7])
  redis.call('EXPIRE', ARGV[6] .. id .. ':marker', ARGV[7])
end
"""
)

# KEYS: 1 run, 2 nodes, 3 nodes info, 4 queue, 5 lease deadlines, 6 leased, 7 lease owners,
#       8 redeliveries, 9 responses stream (PROCESSING=decoupled: fetched, not yet processed),
#       10.. the run's keys (seen-set, item claims).
# ARGV: 1 node, 2 now, 3 ttl, 4 lowest next id, 5 fresh, 6 figures prefix, 7 figures ttl,
#       8-10 other shards (see _LIVE), 11 n dead, 12.. dead node ids.
# Returns {action, run id, live nodes, queued, leased, finished run id, dropped}.
_BEGIN = (
    _LIVE
    + """
local id = tonumber(redis.call('HGET', KEYS[1], 'id') or '0')
local state = redis.call('HGET', KEYS[1], 'state') or ''
local queued = q_len(KEYS[4]) + redis.call('XLEN', KEYS[9]) + other_queued
local leased = redis.call('ZCARD', KEYS[5]) + other_leased
local previous, dropped = 0, 0
if id > 0 and state ~= 'finished' and live == 0 and queued == 0 and leased == 0 then
  finish(id, redis.call('HGET', KEYS[1], 'reason') or 'lost')
  state, previous = 'finished', id
elseif id > 0 and state ~= 'finished' and live == 0 and ARGV[5] == '1' then
  dropped = queued + leased
  q_clear(KEYS[4])
  redis.call('DEL', KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
  finish(id, 'discarded')
  state, previous, queued, leased = 'finished', id, 0, 0
end
local action
if id == 0 or state == 'finished' then
  if queued == 0 and leased == 0 then
    for i = 10, #KEYS do redis.call('DEL', KEYS[i]) end
  end
  id = math.max(id, tonumber(ARGV[4])) + 1
  redis.call('DEL', KEYS[1], ARGV[6] .. id .. ':figures')
  redis.call('HSET', KEYS[1], 'id', id, 'state', 'running', 'started', now, 'shards', ARGV[10])
  action = 'start'
elseif live == 0 then
  redis.call('HSET', KEYS[1], 'state', 'running')
  action = 'resume'
elseif queued == 0 and leased == 0 then
  return {'wait', id, live, queued, leased, previous, dropped}
else
  action = 'join'
end
redis.call('HSET', KEYS[2], ARGV[1], now)
redis.call('HSETNX', ARGV[6] .. id .. ':figures', ARGV[1], '{}')
redis.call('SET', ARGV[6] .. id .. ':marker', now)
return {action, id, live, queued, leased, previous, dropped}
"""
)

# KEYS: 1 run, 2 nodes, 3 nodes info, 4 queue, 5 lease deadlines, 6 responses stream, 7.. the
#       keys a finish renames (h of them), then the run's keys it drops.
# ARGV: 1 node, 2 now, 3 ttl, 4 run id, 5 reason, 6 figures prefix, 7 figures ttl, 8-10 other
#       shards (see _LIVE), 11 n dead, 12.. dead, then h and the h new names.
# Returns {outcome, live}: outcome 'finished', 'stopped', 'running' (others live on), 'gone' (the
# run is no longer this node's: another node ended it while this one was silent) or 'lost' (Redis
# has no run record any more: its shared state was lost).
_LEAVE = (
    _LIVE
    + """
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
-- No run record at all under a live run: Redis lost it (restarted empty, flushed, failed over).
if not redis.call('HGET', KEYS[1], 'id') then return {'lost', live} end
-- Another run in the record, and no trace of ours: a fresh run began in the emptied Redis.
if tonumber(redis.call('HGET', KEYS[1], 'id')) ~= tonumber(ARGV[4])
   and redis.call('EXISTS', ARGV[6] .. ARGV[4] .. ':marker') == 0 then
  return {'lost', live}
end
if tonumber(redis.call('HGET', KEYS[1], 'id') or '0') ~= tonumber(ARGV[4])
   or redis.call('HGET', KEYS[1], 'state') == 'finished' then
  return {'gone', live}
end
redis.call('HSET', KEYS[1], 'reason', ARGV[5])
if live > 0 then return {'running', live} end
if q_len(KEYS[4]) + other_queued == 0 and redis.call('ZCARD', KEYS[5]) + other_leased == 0
   and redis.call('XLEN', KEYS[6]) == 0 then
  local at = 12 + tonumber(ARGV[11])
  local h = tonumber(ARGV[at])
  for i = 1, h do
    if redis.call('EXISTS', KEYS[6 + i]) == 1 then
      redis.call('RENAME', KEYS[6 + i], ARGV[at + i])
      redis.call('EXPIRE', ARGV[at + i], ARGV[7])  -- read and deleted at once; kept no longer
    end
  end
  for i = 7 + h, #KEYS do redis.call('DEL', KEYS[i]) end
  finish(ARGV[4], ARGV[5])
  return {'finished', 0}
end
redis.call('HSET', KEYS[1], 'state', 'stopped', 'stopped', ARGV[2])
return {'stopped', 0}
"""
)


@dataclass
class Decision:
    action: str  # start | resume | join | wait
    run_id: int
    live: int
    queued: int
    leased: int
    finished_previous: int = 0  # a run found finished (or discarded) by this start
    dropped: int = 0  # requests of a discarded run

    @classmethod
    def from_reply(cls, reply: list[Any]) -> Decision:
        action = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return cls(action, *(int(v) for v in reply[1:]))


@dataclass
class LeaseSummary:
    """Requests leased by nodes other than this one, split by whether their owner lives."""

    live: int = 0
    stopped: int = 0
    stopped_owners: set[str] = field(default_factory=set)
    stopped_back_at: float = 0.0  # when the last of the stopped owners' leases runs out


class RunState:
    def __init__(
        self, server: Any, spider_name: str, nodes: NodeRegistry, queue_key: str, leases: Any = None, shards: Any = None
    ) -> None:
        self.server = server
        # A sharded frontier (see scraper.queue.shards): its shards are counted before each
        # transition, and their run keys dropped after it, for a script sees one slot only.
        self.shards = shards if shards is not None and shards.count > 1 else None
        self.spider = spider_name
        self.nodes = nodes
        self.queue_key = queue_key
        self.leases = leases
        self.key = keys.run_key(spider_name)
        self.figures_prefix = f"{self.key}:"
        self.run_id = 0
        self.queues = lists.Lists(server)
        self._begin = register_script(server, _BEGIN)
        self._leave = register_script(server, _LEAVE)

    def _lease_keys(self) -> list[str]:
        # The spider's own lease keys (in its slot), whether this node leases or not: another
        # node may. A sharded frontier's leases are counted apart (see _others).
        names = keys.lease_keys(self.spider)
        return [names["deadlines"], names["leased"], names["owners"], names["redeliveries"]]

    def _others(self) -> list[Any]:
        """ARGV 8-10 of both scripts: queued and leased in the shards, and the shard count."""
        if self.shards is None:
            return [0, 0, 1]
        pipe = self.server.pipeline(transaction=False)
        for shard in range(self.shards.count):
            self.queues.length(self.shards.queue_key(shard), client=pipe)
            pipe.zcard(self.shards.lease_keys(shard)["deadlines"])
        counts = pipe.execute()
        return [sum(counts[0::2]), sum(counts[1::2]), self.shards.count]

    def _drop(self, names: list[str]) -> None:
        for name in names:  # one by one: the shards' keys live in different slots
            self.server.delete(name)

    def begin(
        self, run_keys: list[str], lowest_next_id: int = 0, fresh: bool = False, shard_run_keys: list[str] | None = None
    ) -> Decision:
        """*run_keys* share the spider's slot and are dropped by the script; *shard_run_keys*
        (a sharded seen-state) are dropped right after it, when it says so."""
        deadlines, leased, owners, redeliveries = self._lease_keys()
        dead = self.nodes.dead_here()
        reply = self._begin(
            keys=[
                self.key,
                self.nodes.key,
                self.nodes.info_key,
                self.queue_key,
                deadlines,
                leased,
                owners,
                redeliveries,
                keys.responses_key(self.spider),
                *run_keys,
            ],
            args=[
                self.nodes.node_id,
                self.nodes.clock.now(),
                self.nodes.ttl,
                lowest_next_id,
                "1" if fresh else "0",
                self.figures_prefix,
                FIGURES_KEEP,
                *self._others(),
                len(dead),
                *dead,
            ],
        )
        decision = Decision.from_reply(reply)
        if decision.action != "wait":
            self.run_id = decision.run_id
        if self.shards is not None:
            # No node joins a run with nothing queued, so nothing was claimed in the new run yet.
            if decision.dropped:
                discard_shards(self.server, self.shards, [])
            if decision.action == "start" and decision.queued == 0 and decision.leased == 0:
                self._drop(shard_run_keys or [])
        return decision

    def leave(
        self,
        reason: str,
        run_keys: list[str],
        shard_run_keys: list[str] | None = None,
        rename: dict[str, str] | None = None,
    ) -> tuple[str, int]:
        """Leave the run; the last node out finishes it, dropping *run_keys* and renaming each
        key of *rename* (key -> new name) in the same step: what must outlive the run is out of
        a next run's way before that run can begin."""
        rename = rename or {}
        deadlines = self._lease_keys()[0]
        dead = self.nodes.dead_here()
        outcome, live = self._leave(
            keys=[
                self.key,
                self.nodes.key,
                self.nodes.info_key,
                self.queue_key,
                deadlines,
                keys.responses_key(self.spider),
                *rename,
                *run_keys,
            ],
            args=[
                self.nodes.node_id,
                self.nodes.clock.now(),
                self.nodes.ttl,
                self.run_id,
                reason,
                self.figures_prefix,
                FIGURES_KEEP,
                *self._others(),
                len(dead),
                *dead,
                len(rename),
                *rename.values(),
            ],
        )
        outcome = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        if outcome == "finished" and self.shards is not None:
            self._drop(shard_run_keys or [])
        return outcome, int(live)

    def has_run_record(self) -> bool:
        return bool(self.server.exists(self.key))

    def lost(self) -> bool:
        """True when this node's run has no record in Redis any more (see the module's notes):
        no run record, or another run's with no marker of this one (``<run>:<id>:marker``, set
        by every node that begins the run, kept with the figures once it finishes): a node that
        found the emptied Redis began a fresh run, which a run finished by others would not lack."""
        if not self.run_id:
            return False
        current = self.server.hget(self.key, "id")
        if current is None:
            return True
        return int(current) != self.run_id and not self.server.exists(f"{self.figures_prefix}{self.run_id}:marker")

    def current(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.server.hgetall(self.key).items()}

    def lease_summary(self, mine: set[str] | None = None) -> LeaseSummary:
        """Leases held elsewhere: by live nodes, or by nodes that stopped (and when they return)."""
        if self.shards is None:
            deadlines_key, _leased, owners_key, _r = self._lease_keys()
            groups = [(deadlines_key, owners_key)]
        else:
            groups = [
                (names["deadlines"], names["owners"])
                for names in (self.shards.lease_keys(i) for i in range(self.shards.count))
            ]
        mine = mine or set()
        deadlines: dict[str, float] = {}
        owners: dict[str, str] = {}
        for deadlines_key, owners_key in groups:
            deadlines.update((k.decode(), s) for k, s in self.server.zrange(deadlines_key, 0, -1, withscores=True))
            owners.update((k.decode(), v.decode()) for k, v in self.server.hgetall(owners_key).items())
        live = set(self.nodes.live())
        summary = LeaseSummary()
        for lease, deadline in deadlines.items():
            if lease in mine:
                continue
            owner = owners.get(lease, "")
            if owner in live:
                summary.live += 1
            else:
                summary.stopped += 1
                summary.stopped_owners.add(owner.rsplit(":", 1)[0] if owner else "unknown")
                summary.stopped_back_at = max(summary.stopped_back_at, deadline)
        return summary

    def write_figures(self, run_id: int, figures: dict[str, float]) -> None:
        self.server.hset(keys.run_figures_key(self.spider, run_id), self.nodes.node_id, json.dumps(figures))


def summed_figures(server: Any, spider_name: str, run_id: int) -> tuple[dict[str, float], int]:
    """The run's figures summed over its nodes, and how many nodes it has seen."""
    per_node = server.hgetall(keys.run_figures_key(spider_name, run_id))
    return sum_node_figures(per_node.values()), len(per_node)


def sum_node_figures(snapshots: Any) -> dict[str, float]:
    """Each node's JSON snapshot of cumulative figures, summed; an unreadable one is skipped."""
    totals: dict[str, float] = {}
    for raw in snapshots:
        try:
            figures = json.loads(raw)
        except ValueError:
            continue
        for name, value in figures.items():
            totals[name] = totals.get(name, 0) + float(value or 0)
    return totals
