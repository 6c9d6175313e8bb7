"""Names of the Redis keys of one domain's limits.

The domain sits in braces, a Redis Cluster hash tag: every key of one domain lands on the same
shard, which the multi-key concurrency script needs there.
"""


def next_key(domain: str) -> str:
    """When the fleet may send its next request to *domain* (microseconds, Redis clock)."""
    return f"politeness:{{{domain}}}:next"


def inflight_key(domain: str) -> str:
    """Requests in flight to *domain*: token -> deadline (ms) after which a silent holder is ignored."""
    return f"politeness:{{{domain}}}:inflight"


def waiting_key(domain: str) -> str:
    """Processes waiting for a slot of *domain*, in arrival order (first come, first served)."""
    return f"politeness:{{{domain}}}:waiting"


def waiting_deadlines_key(domain: str) -> str:
    """When each waiter stops counting unless it asks again (a dead waiter blocks nobody for long)."""
    return f"politeness:{{{domain}}}:waiting:deadlines"


def paused_key(domain: str) -> str:
    """Until when the whole fleet holds off *domain* (microseconds, Redis clock): its Retry-After."""
    return f"politeness:{{{domain}}}:paused"


def start_key(domain: str) -> str:
    """When the fleet's slow start of *domain* began (microseconds, Redis clock)."""
    return f"politeness:{{{domain}}}:start"
