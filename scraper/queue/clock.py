"""Redis' clock, read locally: the one clock every node of a fleet agrees on.

Lease deadlines, heartbeats and node liveness compare times written by different machines; each
machine's own clock would let a node whose clock runs ahead expire the others' leases (and
fetch their pages again) or count live nodes as dead. Redis' ``TIME`` is the same for all. The
offset between it and the local clock is measured at first use and once a minute (half the
round trip either side), so reading the time costs no round trip.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis

logger = logging.getLogger(__name__)


class RedisClock:
    def __init__(self, server: Any, resync_every: float = 60.0) -> None:
        self.server = server
        self.resync_every = resync_every
        self.offset = 0.0  # Redis' time minus this host's, seconds
        self._synced_at = -math.inf

    def now(self) -> float:
        """Redis' unix time, from the local clock and the last measured offset."""
        if time.monotonic() - self._synced_at >= self.resync_every:
            self.sync()
        return time.time() + self.offset

    def sync(self) -> None:
        first = self._synced_at == -math.inf
        try:
            before = time.time()
            seconds, micros = self.server.time()
            after = time.time()
        except redis.RedisError as exc:
            if first:
                raise
            # Keep the last offset: clocks do not jump in a minute, and the next write to
            # Redis reports the outage where it matters.
            logger.warning("Could not read Redis' clock, keeping the last offset: %s", exc)
            self._synced_at = time.monotonic()
            return
        self.offset = seconds + micros / 1e6 - (before + after) / 2
        self._synced_at = time.monotonic()
