"""The cluster-wide "seen requests" set, with a local pre-check.

scrapy-redis' dupefilter sends one blocking ``SADD`` per extracted link from the reactor thread
and computes its own SHA1, ignoring ``REQUEST_FINGERPRINTER_CLASS``. Most links a page yields
(navigation, breadcrumbs, pagination) were already seen by this very process, so a bounded
in-process set answers those without a round trip; Redis stays the authority for everything
the process has not seen itself.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy_redis.dupefilter import RFPDupeFilter

logger = logging.getLogger(__name__)


class SharedDupeFilter(RFPDupeFilter):
    def __init__(
        self,
        server: Any,
        key: str,
        fingerprinter: Any,
        debug: bool = False,
        local_cache_size: int = 200_000,
        stats: Any = None,
    ) -> None:
        super().__init__(server, key, debug=debug)
        self.fingerprinter = fingerprinter
        self.local_cache_size = local_cache_size
        self._local: set[bytes] = set()
        self.stats = stats

    def request_fingerprint(self, request: Request) -> str:
        return self.fingerprinter.fingerprint(request).hex()

    def seen_locally(self, request: Request) -> tuple[bool, str]:
        """Answer from this process' memory alone: (seen before here, hex fingerprint).

        A request not seen here is remembered as seen: the caller is about to claim it in
        Redis (see :meth:`request_seen`, or the scheduler's pipelined push)."""
        fp = self.fingerprinter.fingerprint(request)
        if fp in self._local:
            if self.stats is not None:
                self.stats.inc_value("dupefilter/local_hits")
            return True, ""
        if len(self._local) >= self.local_cache_size:
            # Redis holds the truth, so forgetting the local copy only costs round trips.
            self._local.clear()
        self._local.add(fp)
        return False, fp.hex()

    def request_seen(self, request: Request) -> bool:
        seen, fp = self.seen_locally(request)
        return seen or self.server.sadd(self.key, fp) == 0

    def close(self, reason: str = "") -> None:
        # Never delete the shared set here: other nodes are still using it.
        self._local.clear()
