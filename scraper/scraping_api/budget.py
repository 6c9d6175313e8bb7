"""A per-run credit budget that the whole fleet never exceeds, counting calls still in flight.

Every API call reserves an estimate of its cost before it is sent; when the answer comes the
reservation is replaced by what the API billed. A call is only sent while
``spent + reserved + estimate <= budget``.

The budget is held in Redis (:class:`SharedBudget`) so that N workers of one run stop together
at the budget, not at N times it. Its keys are run-scoped: they are dropped with the run's
seen-set when the run finishes, so the next run starts with the whole budget; a stopped run
that resumes keeps what it spent. A reservation carries a deadline, so a worker that dies
mid-call frees its reservation when the deadline passes. Without Redis (unit use) the same
accounting runs in memory (:class:`Budget`).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..backends.redis_client import register_script
from ..queue.keys import budget_keys

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reservation:
    token: str
    amount: float


class Budget:
    """In-memory accounting for one process."""

    def __init__(self, limit: float) -> None:
        self.limit = float(limit)  # 0: no budget
        self._spent = 0.0
        self._reserved: dict[str, float] = {}
        self.largest_cost = 0.0

    @property
    def spent(self) -> float:
        return self._spent

    @property
    def reserved(self) -> float:
        return sum(self._reserved.values())

    def estimate(self, provider_estimate: float) -> float:
        """The reservation for one call: the provider's estimate, or more if pages cost more."""
        return max(provider_estimate, self.largest_cost)

    def reserve(self, amount: float, hold_seconds: float = 0) -> Reservation | None:
        if self.limit and self.spent + self.reserved + amount > self.limit + 1e-9:
            return None
        token = uuid.uuid4().hex
        self._reserved[token] = amount
        return Reservation(token, amount)

    def settle(self, reservation: Reservation, credits: float) -> None:
        """Replace *reservation* by what the call cost (0 for a call that was not billed)."""
        self._reserved.pop(reservation.token, None)
        self._note(credits)
        self._spent += credits

    def _note(self, credits: float) -> None:
        self.largest_cost = max(self.largest_cost, credits)


# KEYS: spent (string), deadlines (zset token -> deadline), amounts (hash token -> amount)
# ARGV: limit, amount, token, deadline, now
_RESERVE = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
for _, token in ipairs(expired) do
  redis.call('HDEL', KEYS[3], token)
  redis.call('ZREM', KEYS[2], token)
end
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
local reserved = 0
for _, value in ipairs(redis.call('HVALS', KEYS[3])) do reserved = reserved + tonumber(value) end
local limit, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
if limit > 0 and spent + reserved + amount > limit + 1e-9 then
  return {0, tostring(spent), tostring(reserved)}
end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return {1, tostring(spent), tostring(reserved + amount)}
"""

# KEYS: spent, deadlines, amounts; ARGV: token, credits
# The sum is done in Lua, not by INCRBYFLOAT: Redis 6.2 (the embedded server's version) corrupts
# its heap when a script calls INCRBYFLOAT, whose replication rewrite adds an argument.
_SETTLE = """
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local spent = redis.call('GET', KEYS[1]) or '0'
if tonumber(ARGV[2]) ~= 0 then
  spent = string.format('%.15g', tonumber(spent) + tonumber(ARGV[2]))
  redis.call('SET', KEYS[1], spent)
end
return spent
"""


class SharedBudget(Budget):
    """The run's budget in Redis, shared by every worker. Falls back to this process's own
    accounting for a call made while Redis is unreachable (the scheduler waits such outages out;
    a page is never lost to the budget's bookkeeping)."""

    def __init__(self, server: Any, spider_name: str, limit: float) -> None:
        super().__init__(limit)
        self.server = server
        self.keys = budget_keys(spider_name)
        self._reserve = register_script(server, _RESERVE)
        self._settle = register_script(server, _SETTLE)
        self._fleet_spent = 0.0
        self._fleet_reserved = 0.0

    @property
    def spent(self) -> float:
        return self._fleet_spent

    @property
    def reserved(self) -> float:
        return self._fleet_reserved

    def reserve(self, amount: float, hold_seconds: float = 0) -> Reservation | None:
        from ..backends.redis_client import UNREACHABLE

        token = uuid.uuid4().hex
        now = time.time()
        try:
            ok, spent, reserved = self._reserve(
                keys=self.keys, args=[self.limit, amount, token, now + max(hold_seconds, 60.0), now]
            )
        except UNREACHABLE as exc:
            logger.warning(
                "Redis unreachable (%s): this call is checked against this worker's own spending", type(exc).__name__
            )
            return super().reserve(amount)
        self._fleet_spent, self._fleet_reserved = float(spent), float(reserved)
        return Reservation(token, amount) if int(ok) else None

    def settle(self, reservation: Reservation, credits: float) -> None:
        from ..backends.redis_client import UNREACHABLE

        self._note(credits)
        if reservation.token in self._reserved:  # reserved locally during an outage
            super().settle(reservation, credits)
            return
        try:
            self._fleet_spent = float(self._settle(keys=self.keys, args=[reservation.token, credits]))
        except UNREACHABLE:
            # The reservation runs out by itself; the spending is kept here for the stats only.
            logger.warning("Redis unreachable: %.1f spent on one call not added to the run's budget", credits)
