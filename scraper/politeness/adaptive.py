"""The fleet's adaptive rate per site: lowered on a throttle answer, raised slowly on success (AIMD).

Most sites never say their limit; they answer 429 (or 503) past it. A site that has throttled the
fleet gets a shared rate in Redis, one hash field per domain (``politeness:adaptive``: ``"<rate>
<time of the last cut, us>"``, Redis' clock):

* a 429 or 503 cuts the rate to ``POLITENESS_ADAPTIVE_DECREASE`` of itself (the first one: of the
  rates the nodes that saw it were getting answers at, summed). Answers to requests already sent at the old
  rate arrive for a while after a cut: further cuts within ``HOLD`` seconds are not made;
* every node counts its successful answers from such a site and adds them up once a second: the
  rate grows by ``POLITENESS_ADAPTIVE_INCREASE`` requests/s per second at full speed (``step x
  answers / rate``), up to the declared rate (the ceiling), if any;
* a site that has not throttled for ``FORGET`` seconds is forgotten.

A site's first cut waits for every node that saw it throttle to report (``HOLD``): until then
the nodes send it nothing, rather than booking turns at a rate one node guessed alone (turns
booked at a low rate are kept, and would hold the fleet back long after the rate is known). A node
that learns of the cut from the others (it saw no 429 itself: a slow start ends on one or two)
reports what it was sending too, or the rate would start from a part of the fleet's.

Lowering by a share and raising by a step settles just under the site's limit: between the
decrease and the limit, ``(1 + decrease) / 2`` of it on average (85 % at 0.7), with a 429 or two
per cycle. Every node reads the rates once a second; the node that cut learns the new rate at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .scripts import _NOW_US, Command

ADAPTIVE_KEY = "politeness:adaptive"
HOLD = 1.0  # seconds after a cut during which answers to earlier requests cut no further
FORGET = 3600.0
MAX_RATE = 10_000.0

_PARSE = """
local function parse(value)
  if not value then return nil, 0 end
  local sp = string.find(value, ' ')
  return tonumber(string.sub(value, 1, sp - 1)), tonumber(string.sub(value, sp + 1))
end
"""

# KEYS: adaptive. ARGV: domain, observed rate, decrease, floor, ceiling (0: none), hold (us), node,
# join (1: only add to a first cut under way, never cut). -> the domain's rate after the cut, as
# text (Lua numbers come back as integers).
# A site's first cut starts from what the fleet was sending, which no node knows alone: each
# node that reports within the first hold adds the rate it saw (the nodes that did are kept in
# the field "<domain>\n" until the next cut).
_CUT = (
    _NOW_US
    + _PARSE
    + """
local rate, cut = parse(redis.call('HGET', KEYS[1], ARGV[1]))
local nodes_field = ARGV[1] .. string.char(10)
local decrease, ceiling, floor = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[4])
if rate and now - cut < tonumber(ARGV[6]) then
  local first = redis.call('HGET', KEYS[1], nodes_field)
  if first and not string.find(',' .. first .. ',', ',' .. ARGV[7] .. ',', 1, true) then
    rate = rate + tonumber(ARGV[2]) * decrease
    if ceiling > 0 and rate > ceiling then rate = ceiling end
    redis.call('HSET', KEYS[1], ARGV[1], string.format('%.4f %.0f', rate, cut))
    redis.call('HSET', KEYS[1], nodes_field, first .. ',' .. ARGV[7])
  end
  return tostring(rate)
end
if ARGV[8] == '1' then return tostring(rate or 0) end
if rate then
  redis.call('HDEL', KEYS[1], nodes_field)
else
  redis.call('HSET', KEYS[1], nodes_field, ARGV[7])
end
local new = (rate or tonumber(ARGV[2])) * decrease
if ceiling > 0 and new > ceiling then new = ceiling end
if new < floor then new = floor end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.4f %.0f', new, now))
return tostring(new)
"""
)

# KEYS: adaptive. ARGV: step, hold (us), forget (us), max rate, then (domain, answers, ceiling)...
# -> HGETALL of the key after the raises.
_RAISE = (
    _NOW_US
    + _PARSE
    + """
local step, hold, forget, top = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 5, #ARGV, 3 do
  local rate, cut = parse(redis.call('HGET', KEYS[1], ARGV[i]))
  if rate then
    if now - cut > forget then
      redis.call('HDEL', KEYS[1], ARGV[i], ARGV[i] .. string.char(10))
    elseif now - cut >= hold then
      local new = rate + step * tonumber(ARGV[i + 1]) / rate
      local ceiling = tonumber(ARGV[i + 2])
      if ceiling > 0 and new > ceiling then new = ceiling end
      if new > top then new = top end
      redis.call('HSET', KEYS[1], ARGV[i], string.format('%.4f %.0f', new, cut))
    end
  end
end
return {tostring(now), redis.call('HGETALL', KEYS[1])}
"""
)


def cut(
    domain: str,
    observed: float,
    decrease: float,
    floor: float,
    ceiling: float,
    node: str,
    join: bool = False,
    hold: float = HOLD,
) -> Command:
    """A throttle answer from *domain*; with *join*, only this node's part of a first cut under way."""
    return Command(
        _CUT,
        (ADAPTIVE_KEY,),
        (
            domain,
            f"{observed:.4f}",
            f"{decrease:.4f}",
            f"{floor:.4f}",
            f"{ceiling:.4f}",
            int(hold * 1e6),
            node,
            "1" if join else "0",
        ),
    )


def raise_rates(answers: Iterable[tuple[str, int, float]], step: float) -> Command:
    args: list[Any] = [f"{step:.4f}", int(HOLD * 1e6), int(FORGET * 1e6), f"{MAX_RATE:.1f}"]
    for domain, count, ceiling in answers:
        args += [domain, count, f"{ceiling:.4f}"]
    return Command(_RAISE, (ADAPTIVE_KEY,), tuple(args))


def parse_rates(reply: Any) -> dict[str, tuple[float, float]]:
    """_RAISE's reply -> domain -> (rate, seconds since its last cut)."""
    now = float(reply[0]) if reply else 0.0
    items = list(reply[1] if reply else [])
    out: dict[str, tuple[float, float]] = {}
    for field, value in zip(items[::2], items[1::2]):
        field = field.decode() if isinstance(field, bytes) else str(field)
        if field.endswith("\n"):  # the nodes of a first cut
            continue
        value = value.decode() if isinstance(value, bytes) else str(value)
        rate, cut = value.split(" ", 1)
        out[field] = (float(rate), max(0.0, (now - float(cut)) / 1e6))
    return out
