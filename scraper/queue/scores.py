"""A queued request's score: its priority and when it was queued, in one number.

A request's score is -priority * 2**32 + seconds since 2020 at enqueue time: higher priority
first, and first-in first-out within a priority (scrapy-redis orders equal scores by the bytes
of the request, which starves some requests). The enqueue time also gives the queue's age.
"""

from __future__ import annotations

import time

PRIORITY_STEP = float(2**32)
EPOCH = 1577836800.0  # 2020-01-01T00:00:00Z


def score_for(priority: int, now: float | None = None) -> float:
    """The score of a request of *priority* queued *now* (unix time; default: this moment)."""
    return -priority * PRIORITY_STEP + ((time.time() if now is None else now) - EPOCH)


def enqueued_at(score: float) -> float:
    """The unix time a request with this *score* was queued."""
    return (score % PRIORITY_STEP) + EPOCH
