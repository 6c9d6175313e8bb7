"""Redis from the crawl's own asyncio event loop, for commands whose answer an item awaits.

The thread pool (:mod:`scraper.backends.redis_batcher`) keeps a synchronous round trip off the reactor
thread, but each batch then crosses threads twice, and every crossing waits for the interpreter
lock that a busy reactor thread holds: on the demo shop a batch of ~5 dedupe claims cost 0.52 ms
of CPU in its thread for 0.13 ms of actual work. An asyncio client sends from the reactor thread
without blocking it, and its answer arrives as one more socket event of the loop.

The client is opened with the same options (name, timeouts, retries with backoff) as the
process' synchronous one (:func:`scraper.backends.redis_client.get_redis`), ``redis+cluster://`` included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry

from .redis_client import client_options, cluster_url


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop this code runs in (Scrapy's asyncio reactor), or None (another reactor)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def async_client(url: str) -> Any:
    """A client of *url* bound to the running loop; the caller closes it (``await aclose()``)."""
    options = client_options(Retry)
    plain = cluster_url(url)
    if plain is not None:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(plain, **options)
    return redis.asyncio.Redis.from_url(url, retry_on_error=[redis.ConnectionError, redis.TimeoutError], **options)


async def run_script(client: Any, script: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """``EVAL script`` on *client* (a cluster client routes it by its keys, which share a hash tag)."""
    return await client.execute_command("EVAL", script, len(keys), *keys, *args)
