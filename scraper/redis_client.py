"""One Redis connection pool per process and URL, shared by every component.

scrapy-redis builds a pool per component; at fleet scale that multiplies connections for no gain.
Connections retry with backoff on transient errors so a Redis restart or a dropped connection
costs a pause, not a crashed crawl.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


#: Redis being unreachable (down, restarting, loading its data) once the client's own retries
#: are spent: callers that must not lose work wait and try again.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def get_redis(url: str) -> redis.Redis:
    """Return the process-wide client for *url* (``redis://``, ``rediss://`` or ``unix://``)."""
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = redis.Redis.from_url(
                url,
                # Named so that operators (and tests) can tell crawl connections apart.
                client_name=f"scraper:{socket.gethostname()}:{os.getpid()}",
                socket_connect_timeout=5,
                socket_timeout=30,
                health_check_interval=30,
                retry=Retry(ExponentialBackoff(cap=5, base=0.1), 6),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            )
            _clients[url] = client
            # Registered after an embedded server's own exit hook, so it runs first: the
            # embedded server only stops once no client is connected.
            atexit.register(client.connection_pool.disconnect)
        return client
