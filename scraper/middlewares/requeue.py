"""Put a request this process will not fetch back into the shared queue."""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request

from ..runtime.secrets import redact

logger = logging.getLogger(__name__)


def requeue(crawler: Any, request: Request, stat: str) -> bool:
    """Hand *request* back to the scheduler (past the seen-set), counted as *stat*.

    Used when a crawl stops with requests already taken: they go back to the shared queue
    (flushed when the scheduler closes, before their leases are acknowledged) for the next
    run or another node."""
    engine = crawler.engine
    if getattr(engine, "spider", None) is None:
        return False
    try:
        engine.crawl(request.replace(dont_filter=True))
    except Exception as exc:
        logger.error("Could not put %s back into the queue: %s", request.url, redact(str(exc)))
        return False
    crawler.stats.inc_value(stat)
    return True
