"""Generations of the seen-state, so that fingerprints expire (``DUPEFILTER_EXPIRY``).

With an expiry of E seconds, time is cut into generations of E/2 seconds, numbered
``g = floor(t / (E/2))``. A fingerprint is written to the key of the current generation
(``<base>:<g>``) and looked up in the current and the previous one, and each generation key
expires when nobody reads it any more, at the start of generation g+2. A fingerprint last
written at time t is therefore remembered for more than E/2 and at most E seconds, then
forgotten: the page can be crawled again. With E = 0 there is one key, ``<base>``, forever.

The time is Redis' (``TIME``), not each node's own clock: nodes whose clocks disagree would
otherwise write to different generations around a boundary and not see each other's
fingerprints, and the expiry deadlines are Redis' clock anyway. The offset between Redis' clock
and the local one is measured at start and once a minute, so reading the time costs no round
trip.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable
from typing import Any

from .clock import RedisClock

logger = logging.getLogger(__name__)


class Generations:
    def __init__(self, server: Any, expiry: float, resync_every: float = 60.0) -> None:
        self.server = server
        self.expiry = float(expiry)
        self.half = self.expiry / 2
        self.clock = RedisClock(server, resync_every)

    def now(self) -> float:
        """Redis' unix time (see :mod:`.clock`)."""
        return self.clock.now()

    def current(self) -> int:
        """The current generation (always 0 without expiry)."""
        return int(self.now() // self.half) if self.expiry else 0

    def keys(self, base: str) -> tuple[str, str, int]:
        """(key to write and look up, other key to look up, expire-at in unix ms or 0: never).

        Without expiry both keys are *base*."""
        if not self.expiry:
            return base, base, 0
        generation = self.current()
        return f"{base}:{generation}", f"{base}:{generation - 1}", self.expire_at_ms(generation)

    def expire_at_ms(self, generation: int) -> int:
        # Generation g is read until generation g+2 starts; not a moment longer.
        return math.ceil((generation + 2) * self.half * 1000)

    def live_keys(self, base: str) -> list[str]:
        """The keys that hold what is remembered now."""
        current, previous, _ = self.keys(base)
        return [current] if current == previous else [current, previous]


class GenerationalClaims:
    """``add`` and ``add_many`` for a seen-state store whose one-fingerprint claim is
    ``_claim_into(fingerprint, current, previous, expire_at, client)`` (1 if it was new), with
    ``generation()``, ``generations`` and ``base`` as in :class:`~.dupefilter.SeenSet`."""

    base: str
    generations: Generations

    def generation(self) -> int:
        raise NotImplementedError

    def forget_shape(self) -> None:
        """Read the store's shape from Redis again at the next claim (a store without one: nothing)."""

    def _claim_into(self, fingerprint: str, current: str, previous: str, expire_at: Any, client: Any = None) -> Any:
        raise NotImplementedError

    def add(self, fingerprint: str) -> bool:
        """Claim *fingerprint* now; True if no process had claimed it."""
        self.generation()
        current, previous, expire_at = self.generations.keys(self.base)
        return self._claim_into(fingerprint, current, previous, expire_at) == 1

    def add_to(self, pipe: Any, fingerprint: str) -> None:
        """Queue the claim of *fingerprint* on *pipe*; its result is 1 if no process had claimed it."""
        self.generation()
        current, previous, expire_at = self.generations.keys(self.base)
        self._claim_into(fingerprint, current, previous, expire_at, client=pipe)

    def add_many(self, fingerprints: Iterable[str], chunk: int = 1000) -> int:
        """Claim many fingerprints, pipelined *chunk* at a time; returns how many were new."""
        self.generation()
        new = 0
        remaining = iter(fingerprints)
        while batch := list(itertools.islice(remaining, chunk)):
            current, previous, expire_at = self.generations.keys(self.base)
            pipe = self.generations.server.pipeline(transaction=False)
            for fingerprint in batch:
                self._claim_into(fingerprint, current, previous, expire_at, client=pipe)
            new += sum(pipe.execute())
        return new
