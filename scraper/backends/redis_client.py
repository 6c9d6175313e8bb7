"""One Redis connection pool per process and URL, shared by every component.

scrapy-redis builds a pool per component; at fleet scale that multiplies connections for no gain.
Connections retry with backoff on transient errors so a Redis restart or a dropped connection
costs a pause, not a crashed crawl.

``redis+cluster://host:port`` (or ``rediss+cluster://``) connects to a Redis Cluster through any
of its nodes with redis-py's ``RedisCluster``: every key of a spider carries its hash tag (see
:mod:`scraper.queue.keys`), so the scripts that touch several keys at once run there unchanged.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis._parsers.base import BaseParser
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

_clients: dict[str, Any] = {}
_lock = threading.Lock()

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: Redis being unreachable (down, restarting, loading its data, a cluster between a master's
#: death and its replica's promotion) once the client's own retries are spent: callers that
#: must not lose work wait and try again.


class MisconfError(ResponseError):
    """``MISCONF``: Redis refuses writes because it could not save its snapshot (a full disk)."""


# redis-py reads ``MISCONF`` as a bare ResponseError; a class of its own lets callers wait it out.
BaseParser.EXCEPTION_CLASSES.setdefault("MISCONF", MisconfError)

#: Redis up but refusing writes (at ``maxmemory`` under ``noeviction``, a read-only replica after a
#: failover, a failed snapshot): an outage like an unreachable Redis, never a reason to drop work.
REFUSING_WRITES = (OutOfMemoryError, ReadOnlyError, MisconfError)

UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    MasterDownError,
    TryAgainError,
    SlotNotCoveredError,
) + REFUSING_WRITES

#: What an operator reads when Redis refuses writes: the cause and the fix.
REFUSING_WRITES_HINT = (
    "Redis refuses writes; the crawl waits (the queue needs maxmemory-policy noeviction "
    "and memory headroom, a writable master, and a disk with room for its snapshots)"
)


def count_refusal(stats: Any, exc: BaseException) -> None:
    """Counts a write Redis refused (the ``redis/write_refusals`` stat, exported as a metric)."""
    if isinstance(exc, REFUSING_WRITES):
        stats.inc_value("redis/write_refusals")


def unreachable_reason(exc: BaseException) -> str:
    """One line naming why Redis cannot be used: the refusal and its fix, or the error's class."""
    if isinstance(exc, REFUSING_WRITES):
        return f"{type(exc).__name__}: {REFUSING_WRITES_HINT}"
    return type(exc).__name__


def cluster_url(url: str) -> str | None:
    """The plain ``redis://`` URL of a ``redis+cluster://`` one; None for any other URL."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        return None
    # A cluster has database 0 only; a path would be read as a database number.
    return urlunsplit((scheme, parts.netloc, "", parts.query, ""))


def client_options(retry_class: type) -> dict[str, Any]:
    """What every crawl connection is opened with; *retry_class* is redis-py's ``Retry`` of the
    sync or of the asyncio client."""
    return dict(
        # Named so that operators (and tests) can tell crawl connections apart.
        client_name=f"scraper:{socket.gethostname()}:{os.getpid()}",
        socket_connect_timeout=5,
        socket_timeout=30,
        health_check_interval=30,
        retry=retry_class(ExponentialBackoff(cap=5, base=0.1), 6),
    )


def get_redis(url: str) -> Any:
    """Return the process-wide client for *url*: ``redis://``, ``rediss://``, ``unix://``, or
    ``redis+cluster://``/``rediss+cluster://`` for a Redis Cluster (a ``RedisCluster``)."""
    with _lock:
        client = _clients.get(url)
        if client is None:
            options = client_options(Retry)
            plain = cluster_url(url)
            if plain is not None:
                from redis.cluster import RedisCluster

                client = RedisCluster.from_url(plain, **options)
                atexit.register(client.disconnect_connection_pools)
            else:
                client = redis.Redis.from_url(
                    url, retry_on_error=[redis.ConnectionError, redis.TimeoutError], **options
                )
                # Registered after an embedded server's own exit hook, so it runs first: the
                # embedded server only stops once no client is connected.
                atexit.register(client.connection_pool.disconnect)
            _clients[url] = client
        return client


def pipeline_eval(pipe: Any, script: str, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
    """Queue ``EVAL script`` on *pipe*, a plain or a cluster pipeline (which has no ``eval()``)."""
    from redis.cluster import ClusterPipeline

    keys = list(keys)
    options = {}
    if isinstance(pipe, ClusterPipeline) and keys:
        # Routed by its first key here: without a target, redis-py asks the server for the keys
        # of every EVAL in a pipeline (COMMAND GETKEYS), a round trip per script call. A MOVED
        # answer (resharding, failover) is retried by the pipeline's normal routing.
        options["target_nodes"] = pipe.get_node_from_key(keys[0])
    return pipe.execute_command("EVAL", script, len(keys), *keys, *args, **options)


class _Script(Script):
    """A Lua script that also runs in a cluster pipeline, where redis-py refuses EVALSHA.

    In any pipeline it is sent as ``EVAL``: for a plain pipeline holding a script, redis-py
    first asks ``SCRIPT EXISTS`` in a round trip of its own at every ``execute()`` (it cannot
    take a ``NOSCRIPT`` answer back from inside a pipeline). The dedupe claims' batches took
    two round trips each for that."""

    def __call__(self, keys: Sequence[Any] | None = None, args: Sequence[Any] | None = None, client: Any = None) -> Any:
        from redis.client import Pipeline
        from redis.cluster import ClusterPipeline

        if isinstance(client, (Pipeline, ClusterPipeline)):
            return pipeline_eval(client, self.script, keys or (), args or ())
        return super().__call__(keys, args, client)


def register_script(server: Any, text: str) -> Script:
    """``server.register_script(text)``, usable in any pipeline of *server*, clustered or not."""
    return _Script(server, text)
