"""Slow start: a site nobody declared a rate for is sent little at first, then more and more.

A site's limit is unknown until it throttles. Sent at full speed from the first second, a fleet
overshoots it by far before the first 429 comes back (two nodes: up to 45 requests in a second
to a site that takes 20), and a short crawl loses a large share of its requests to 429s. So the
fleet starts such a site at ``POLITENESS_SLOW_START_RATE`` requests/s and multiplies the rate by
``POLITENESS_SLOW_START_GROWTH`` each second, as TCP's slow start doubles its window each round
trip, until either

* the site throttles (429/503, a bot wall's challenge): the adaptive rate takes over from what the
  site was accepting (see :mod:`.adaptive`), and the slow start has done its work; or
* the rate reaches ``TOP``: the site takes whatever the fleet sends, and its requests go unpaced
  again (no Redis call per request).

The ramp is the fleet's, not a node's: one key per site holds when it began (Redis' clock), and
every request's turn is booked by one script from it, spaced by the ramp's rate at the time of the
previous turn. A node that joins late joins the ramp where it stands, and turns booked early at a
low rate do not hold back later ones (each is spaced by the rate of its own time). A site left
alone for ``RESTART_IDLE`` seconds is forgotten: the next crawl starts it slowly again (so is one
whose adaptive rate was forgotten, an hour after its last throttle: nothing refreshed its ramp).

A declared rate (``POLITENESS_RATE``, a spider's, an override) or a robots.txt ``Crawl-delay`` is
the rate the site is sent from the first request: no slow start. So is an override's ``rate:0``,
which says the site takes anything.
"""

from __future__ import annotations

import math
from typing import Any

from .keys import next_key, paused_key, start_key
from .scripts import _NOW_US, Command

TOP = 1000.0  # requests/s: past it pacing protects no site, and costs a Redis call a request
RESTART_IDLE = 600.0  # seconds without a request from the fleet before a site starts slowly again
# How often a node asks again about a site whose ramp it saw end: it keeps the ramp's key alive
# while the site is crawled, and notices when the fleet forgot the site.
RECHECK = RESTART_IDLE / 4

# KEYS: next, paused, start. ARGV: max wait (us), start rate, log(growth) per second, top rate,
# idle (ms). -> {reserved 0/1, wait (us), us since the ramp began}
_RESERVE = (
    _NOW_US
    + """
local start = tonumber(redis.call('GET', KEYS[3]))
if start then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
else
  start = now
  redis.call('SET', KEYS[3], string.format('%.0f', now), 'PX', ARGV[5])
end
local first, growth, top = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function interval(at)
  local rate = first * math.exp(growth * math.max(0, at - start) / 1000000)
  if rate > top then rate = top end
  return 1000000 / rate
end
local slot = now
local latest = tonumber(redis.call('GET', KEYS[1]))
if latest and latest + interval(latest) > now then slot = latest + interval(latest) end
local paused = tonumber(redis.call('GET', KEYS[2]))
if paused and paused > slot then slot = paused end
local wait = slot - now
if wait > tonumber(ARGV[1]) then return {0, wait, now - start} end
redis.call('SET', KEYS[1], string.format('%.0f', slot), 'PX', math.ceil((wait + interval(slot)) / 1000) + 1000)
return {1, wait, now - start}
"""
)


def duration(first: float, growth: float) -> float:
    """Seconds from a ramp's start at *first* requests/s until it reaches ``TOP``."""
    if first <= 0 or first >= TOP:
        return 0.0
    return math.log(TOP / first) / math.log(growth)


def rate_at(first: float, growth: float, seconds: float) -> float:
    """The ramp's rate *seconds* after it began."""
    return min(TOP, first * growth ** max(0.0, seconds))


def reserve(domain: str, first: float, growth: float, max_wait: float) -> Command:
    keys = (next_key(domain), paused_key(domain), start_key(domain))
    args = (int(max_wait * 1e6), f"{first:.6f}", f"{math.log(growth):.9f}", f"{TOP:.1f}", int(RESTART_IDLE * 1000))
    return Command(_RESERVE, keys, args)


def parse_reply(reply: Any) -> tuple[bool, float, float]:
    """Whether the turn was booked, the seconds until it (or until it would have been), and the
    seconds since the site's ramp began."""
    return bool(int(reply[0])), int(reply[1]) / 1e6, int(reply[2]) / 1e6
