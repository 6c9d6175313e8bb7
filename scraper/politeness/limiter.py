"""The Redis side of the limits: each decision is one Lua script, atomic, one round trip.

Every script reads the clock with Redis ``TIME``, so the fleet shares one clock and the hosts'
own clocks may drift as they like.

* Rate (a reservation, as in GCRA): the domain's key holds the time of the latest reserved
  request. A caller reserves ``max(now, latest + 1/rate)`` and waits until then; requests from
  the whole fleet go out evenly spaced, with no polling. A reservation further ahead than the
  caller's ``max_wait`` is not made (the answer says how far ahead it would have been), so a
  saturated domain never accumulates minutes of bookings that a dead node would leave unused.
* Concurrency: a sorted set of holders (token -> deadline). A holder's deadline is renewed while
  its process lives; the slot of a process that died frees itself when the deadline passes.
  Callers that find no free slot queue up in arrival order, so every node gets its turn: without
  the queue the node that frees a slot would win it back at once, every time.

The scripts run with ``EVAL``: Redis caches them by digest, and redis-py sends a pipelined
``EVALSHA`` only after an extra ``SCRIPT EXISTS`` round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scrapy.utils.defer import maybe_deferred_to_future

from ..backends.redis_batcher import RedisBatcher
from . import adaptive, slow_start
from .keys import inflight_key, next_key, paused_key, waiting_deadlines_key, waiting_key
from .scripts import _NOW_MS, _NOW_US, Command

# KEYS: next, paused. ARGV: interval (us), max wait (us). -> {reserved 0/1, wait (us)}
_RESERVE = (
    _NOW_US
    + """
local interval = tonumber(ARGV[1])
local slot = now
local latest = tonumber(redis.call('GET', KEYS[1]))
if latest and latest + interval > now then slot = latest + interval end
-- A site's Retry-After holds the whole fleet off until the time it named.
local paused = tonumber(redis.call('GET', KEYS[2]))
if paused and paused > slot then slot = paused end
local wait = slot - now
if wait > tonumber(ARGV[2]) then return {0, wait} end
-- Kept until the slot after this one has passed, then forgotten.
redis.call('SET', KEYS[1], string.format('%.0f', slot), 'PX', math.ceil((wait + interval) / 1000) + 1000)
return {1, wait}
"""
)

# KEYS: paused. ARGV: pause (us). Only ever pushes the pause later, never shortens it.
_PAUSE = (
    _NOW_US
    + """
local until_ = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]))
if current and current >= until_ then return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', until_), 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
return 1
"""
)

# KEYS: inflight, waiting, waiting deadlines. ARGV: token, limit, holder ttl (ms), waiter ttl (ms).
# -> {admitted 0/1, waiters ahead of this one}
_ACQUIRE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, waiter in ipairs(gone) do redis.call('ZREM', KEYS[2], waiter) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local token, ttl, waiter_ttl = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local ahead = redis.call('ZRANK', KEYS[2], token) or redis.call('ZCARD', KEYS[2])
if free > 0 and ahead < free then
  redis.call('ZADD', KEYS[1], now + ttl, token)
  -- Every holder's deadline is at most now + ttl: the set outlives them all, and no more.
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], token)
  redis.call('ZREM', KEYS[3], token)
  return {1, 0}
end
redis.call('ZADD', KEYS[2], 'NX', now, token)
redis.call('ZADD', KEYS[3], now + waiter_ttl, token)
redis.call('PEXPIRE', KEYS[2], waiter_ttl)
redis.call('PEXPIRE', KEYS[3], waiter_ttl)
return {0, ahead}
"""
)

# KEYS: inflight. ARGV: holder ttl (ms), tokens... -> how many of the tokens were still held.
_RENEW = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[1])
local held = 0
for i = 2, #ARGV do
  held = held + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
end
if held > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return held
"""
)


@dataclass(frozen=True)
class Reservation:
    reserved: bool
    wait: float  # seconds until the reserved time (or until the time it would have been)


@dataclass(frozen=True)
class Admission:
    admitted: bool
    ahead: int  # waiters ahead of this one when it was not admitted


def reserve(domain: str, rate: float, max_wait: float) -> Command:
    return Command(_RESERVE, (next_key(domain), paused_key(domain)), (f"{1e6 / rate:.3f}", int(max_wait * 1e6)))


def pause(domain: str, seconds: float) -> Command:
    return Command(_PAUSE, (paused_key(domain),), (int(seconds * 1e6),))


def acquire(domain: str, token: str, limit: int, holder_ttl: float, waiter_ttl: float) -> Command:
    keys = (inflight_key(domain), waiting_key(domain), waiting_deadlines_key(domain))
    return Command(_ACQUIRE, keys, (token, limit, int(holder_ttl * 1000), int(waiter_ttl * 1000)))


def renew(domain: str, tokens: list[str], holder_ttl: float) -> Command:
    return Command(_RENEW, (inflight_key(domain),), (int(holder_ttl * 1000), *tokens))


def parse_reservation(reply: Any) -> Reservation:
    return Reservation(bool(int(reply[0])), int(reply[1]) / 1e6)


def parse_admission(reply: Any) -> Admission:
    return Admission(bool(int(reply[0])), int(reply[1]))


class Limiter:
    """The commands above sent through a :class:`RedisBatcher`: off the reactor thread, pipelined."""

    def __init__(self, server: Any, holder_ttl: float, waiter_ttl: float) -> None:
        self.batcher = RedisBatcher(server)
        self.holder_ttl = holder_ttl
        self.waiter_ttl = waiter_ttl

    async def _run(self, command: Command) -> Any:
        return await maybe_deferred_to_future(self.batcher.call(command.add))

    async def reserve(self, domain: str, rate: float, max_wait: float) -> Reservation:
        return parse_reservation(await self._run(reserve(domain, rate, max_wait)))

    async def reserve_ramp(
        self, domain: str, first: float, growth: float, max_wait: float
    ) -> tuple[Reservation, float]:
        """A turn on the site's slow start (see :mod:`.slow_start`), which this call begins if the
        fleet has none; and how long ago the ramp began, in seconds."""
        reserved, wait, age = slow_start.parse_reply(
            await self._run(slow_start.reserve(domain, first, growth, max_wait))
        )
        return Reservation(reserved, wait), age

    async def pause(self, domain: str, seconds: float) -> None:
        await self._run(pause(domain, seconds))

    async def acquire(self, domain: str, token: str, limit: int) -> Admission:
        return parse_admission(await self._run(acquire(domain, token, limit, self.holder_ttl, self.waiter_ttl)))

    async def renew(self, domain: str, tokens: list[str]) -> int:
        return int(await self._run(renew(domain, tokens, self.holder_ttl)))

    async def cut(
        self, domain: str, observed: float, decrease: float, floor: float, ceiling: float, node: str, join: bool = False
    ) -> float:
        reply = await self._run(adaptive.cut(domain, observed, decrease, floor, ceiling, node, join))
        return float(reply.decode() if isinstance(reply, bytes) else reply)

    async def adapt(self, answers: list[tuple[str, int, float]], step: float) -> dict[str, tuple[float, float]]:
        """Report the successful answers of adaptive domains; the fleet's rates after them (and
        how long ago each was last cut)."""
        return adaptive.parse_rates(await self._run(adaptive.raise_rates(answers, step)))

    async def release(self, domain: str, token: str) -> None:
        await maybe_deferred_to_future(self.batcher.call(lambda pipe: pipe.zrem(inflight_key(domain), token)))

    async def leave(self, domain: str, token: str) -> None:
        """Stop waiting for a slot (the request was cancelled): let the next waiter go first."""
        # One command per call: the batcher pairs each call with one reply.
        for key in (waiting_key(domain), waiting_deadlines_key(domain)):
            await maybe_deferred_to_future(self.batcher.call(lambda pipe, key=key: pipe.zrem(key, token)))
