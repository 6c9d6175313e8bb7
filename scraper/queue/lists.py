"""The shared queue's layout in Redis: one list per priority and minute of queueing.

A request queued under the key ``K`` (``{<spider>}:requests``, or a shard's) goes to the end of
the list ``K:b:<priority>:<minute>``; the sorted set ``K:idx`` holds each such list's name
scored as a request was before (:func:`~.scores.score_for` of its priority and the start of its
minute), and ``K:n`` counts the queued requests. Pops take from the best-scored list: higher
priority first, first in first out within one, and the index's scores give the queue's age.

Why lists: a sorted-set member costs Redis ~98 bytes besides the entry (skiplist node, dict
entry, bucket), a list entry 2-3 (``bench/queue_entry.py``: 225 -> 130 bytes per queued
70-character URL). What a list gives up, and how each is kept:

* a request's own score: its list's score is its minute's, and a request taken back (a lease
  run out, a prefetch given back) returns to the head of the list it came from;
* unique members (``ZADD`` of an entry already queued added nothing): every path that queued a
  request again on purpose now queues it once; a crash between queueing and releasing a lease
  may queue it twice, which at-least-once delivery already allowed;
* removal by value: nothing removes a queued request but a pop, except moving a queue into its
  shards (:meth:`Lists.peek` then :meth:`Lists.drop_head`, under a lock).

A queue of an earlier version (a sorted set at ``K`` itself) is carried over by the pops: each
takes the old set's best entries into their lists first, so the queue a stopped fleet of that
version left is taken over as it stands; :meth:`Lists.length` counts both meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..backends.redis_client import register_script

#: Seconds of queueing one list holds (the queue's age is known to this much).
MINUTE = 60

#: Lua functions that a script queueing requests starts with (the keys derived from a queue's
#: key share its hash tag, so they live in its slot on a cluster too). Kept apart from the
#: rest (:data:`LUA`): a script run in a pipeline is sent whole at every call.
PUSH_LUA = """
local Q_STEP = 4294967296
local Q_MINUTE = @MINUTE@
local function q_list(score)
  score = tonumber(score)
  local p = -math.floor(score / Q_STEP)
  local t = score + p * Q_STEP
  local b = t - (t % Q_MINUTE)
  return string.format('%d:%d', p, b), -p * Q_STEP + b
end
local function q_push(base, score, data, head)
  local name, list_score = q_list(score)
  redis.call('ZADD', base .. ':idx', 'NX', list_score, name)
  if head then
    redis.call('LPUSH', base .. ':b:' .. name, data)
  else
    redis.call('RPUSH', base .. ':b:' .. name, data)
  end
  redis.call('INCR', base .. ':n')
end
""".replace("@MINUTE@", str(MINUTE))

#: :data:`PUSH_LUA` and the functions that pop, count and delete a queue.
LUA = (
    PUSH_LUA
    + """
local function q_adopt(base, count)
  if redis.call('TYPE', base)['ok'] == 'zset' then
    local old = redis.call('ZPOPMIN', base, count)
    for i = 1, #old, 2 do q_push(base, old[i + 1], old[i], false) end
  end
end
local function q_len(base)
  local legacy = 0
  if redis.call('TYPE', base)['ok'] == 'zset' then
    legacy = redis.call('ZCARD', base)
  end
  return tonumber(redis.call('GET', base .. ':n') or '0') + legacy
end
local function q_pop(base, count)
  q_adopt(base, count)
  local out, left, idx = {}, count, base .. ':idx'
  while left > 0 do
    local head = redis.call('ZRANGE', idx, 0, 0, 'WITHSCORES')
    if #head == 0 then
      -- Nothing queued: the count can only be 0 (set again, should anything have skewed it).
      redis.call('DEL', base .. ':n')
      break
    end
    local list = base .. ':b:' .. head[1]
    local got = redis.call('LPOP', list, left)
    if got then
      for _, data in ipairs(got) do
        out[#out + 1] = data
        out[#out + 1] = head[2]
      end
      left = left - #got
      if redis.call('DECRBY', base .. ':n', #got) < 0 then redis.call('DEL', base .. ':n') end
    end
    if not got or redis.call('EXISTS', list) == 0 then redis.call('ZREM', idx, head[1]) end
  end
  return out
end
local function q_clear(base)
  for _, name in ipairs(redis.call('ZRANGE', base .. ':idx', 0, -1)) do
    redis.call('DEL', base .. ':b:' .. name)
  end
  redis.call('DEL', base .. ':idx', base .. ':n', base)
end
"""
)

# KEYS: queue. ARGV: 1 to queue at the heads of the lists (requests taken back), then (score, data)s.
_PUSH = (
    PUSH_LUA
    + """
for i = 2, #ARGV, 2 do q_push(KEYS[1], ARGV[i], ARGV[i + 1], ARGV[1] == '1') end
return (#ARGV - 1) / 2
"""
)

# KEYS: queue. ARGV: count. Returns (data, score) flat, best first.
_POP = LUA + "\nreturn q_pop(KEYS[1], tonumber(ARGV[1]))\n"

_LEN = LUA + "\nreturn q_len(KEYS[1])\n"

_ADOPT = LUA + "\nq_adopt(KEYS[1], tonumber(ARGV[1]))\nreturn 0\n"

_CLEAR = LUA + "\nlocal n = q_len(KEYS[1])\nq_clear(KEYS[1])\nreturn n\n"

# KEYS: queue. ARGV: list name, then the entries read at its head: removes them if they are
# still its head (another process may have popped meanwhile); returns how many it removed. A
# list found empty leaves the index (one the index names but Redis lost: evicted, deleted).
_DROP_HEAD = """
local list = KEYS[1] .. ':b:' .. ARGV[1]
local n = #ARGV - 1
local same = 0
if n > 0 then
  local head = redis.call('LRANGE', list, 0, n - 1)
  while same < #head and head[same + 1] == ARGV[same + 2] do same = same + 1 end
end
if same > 0 then
  redis.call('LTRIM', list, same, -1)
  if redis.call('DECRBY', KEYS[1] .. ':n', same) < 0 then redis.call('DEL', KEYS[1] .. ':n') end
end
if redis.call('EXISTS', list) == 0 then redis.call('ZREM', KEYS[1] .. ':idx', ARGV[1]) end
return same
"""


def index_key(key: str) -> str:
    """The sorted set of the queue *key*'s lists."""
    return f"{key}:idx"


def list_key(key: str, name: str | bytes) -> str:
    return f"{key}:b:{name.decode() if isinstance(name, bytes) else name}"


def count_key(key: str) -> str:
    return f"{key}:n"


class Lists:
    """The queue operations of one Redis client (plain or cluster), each one script call that
    also runs in a pipeline (``client=pipe``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._push = register_script(server, _PUSH)
        self._pop = register_script(server, _POP)
        self._len = register_script(server, _LEN)
        self._clear = register_script(server, _CLEAR)
        self._drop_head = register_script(server, _DROP_HEAD)
        self._adopt_script = register_script(server, _ADOPT)

    def push(self, key: str, entries: Iterable[tuple[bytes, float]], head: bool = False, client: Any = None) -> Any:
        """Queue *entries*, ``(data, score)`` pairs, in *key*; at the heads of their lists with
        *head* (requests taken back: they are next)."""
        args: list[Any] = ["1" if head else "0"]
        # Each is pushed onto the head in turn: the last pushed comes out first, so the entries
        # go in reverse to come out in their order.
        for data, score in reversed(list(entries)) if head else entries:
            args += [score, data]
        if len(args) == 1:
            return 0
        return self._push(keys=[key], args=args, client=client)

    def pop(self, key: str, count: int) -> list[tuple[bytes, float]]:
        """Take up to *count* requests from *key*: ``(data, score)``, best first."""
        flat = self._pop(keys=[key], args=[count])
        return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]

    def length(self, key: str, client: Any = None) -> Any:
        """How many requests *key* holds (a number, or the pipeline's result when *client* is one)."""
        return self._len(keys=[key], client=client)

    def clear(self, key: str) -> int:
        """Delete the queue *key*; returns how many requests it held."""
        return int(self._clear(keys=[key]))

    def head_scores(self, key: str) -> list[float]:
        """The scores of the best list of each end of *key*: [best, worst] (empty when empty)."""
        idx = index_key(key)
        head = self.server.zrange(idx, 0, 0, withscores=True)
        if not head:
            return []
        tail = self.server.zrange(idx, -1, -1, withscores=True)
        return [head[0][1], tail[0][1]]

    def first_at_or_after(self, key: str, score: float) -> float | None:
        """The score of *key*'s best list scored *score* or more."""
        found = self.server.zrangebyscore(index_key(key), score, "+inf", start=0, num=1, withscores=True)
        return found[0][1] if found else None

    def peek(self, key: str, count: int) -> tuple[str, list[bytes], float] | None:
        """The first *count* entries of *key*'s best list: (its name, the entries, its score)."""
        self._adopt(key, count)
        head = self.server.zrange(index_key(key), 0, 0, withscores=True)
        if not head:
            return None
        name = head[0][0].decode() if isinstance(head[0][0], bytes) else head[0][0]
        entries = self.server.lrange(list_key(key, name), 0, count - 1)
        return name, entries, head[0][1]

    def drop_head(self, key: str, name: str, entries: list[bytes]) -> int:
        """Remove *entries* from the head of *key*'s list *name* if they are still its head (and
        the list from the index if it is empty: :meth:`peek` found it so)."""
        return int(self._drop_head(keys=[key], args=[name, *entries]))

    def entries(self, key: str) -> list[tuple[bytes, float]]:
        """Every queued entry of *key* with its list's score, best first (for tools and tests;
        a large queue is read whole)."""
        out: list[tuple[bytes, float]] = []
        for name, score in self.server.zrange(index_key(key), 0, -1, withscores=True):
            out += [(data, score) for data in self.server.lrange(list_key(key, name), 0, -1)]
        if self.server.type(key) in (b"zset", "zset"):
            out += self.server.zrange(key, 0, -1, withscores=True)
        return out

    def memory_usage(self, key: str) -> int:
        """Redis' ``MEMORY USAGE`` of the queue *key*: its index, count and lists together."""
        names = [index_key(key), count_key(key), key]
        names += [list_key(key, name) for name in self.server.zrange(index_key(key), 0, -1)]
        return sum(int(self.server.memory_usage(name, samples=0) or 0) for name in names)

    def _adopt(self, key: str, count: int) -> None:
        # An earlier version's sorted set: its best entries into their lists first (q_adopt).
        self._adopt_script(keys=[key], args=[count])
