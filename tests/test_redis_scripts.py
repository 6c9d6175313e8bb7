"""Lua scripts queued in a pipeline: one round trip per batch, on a real Redis."""

from __future__ import annotations

import redis

from scraper.backends.redis_client import register_script

_CLAIM = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return ARGV[2] end
return redis.call('HGET', KEYS[1], ARGV[1])
"""


def test_a_pipelined_script_costs_no_extra_round_trip_and_survives_a_script_flush(own_redis) -> None:
    # A Redis of its own: a script flush on the shared one would fail the scripts of the crawls
    # other tests run meanwhile (found by the suite: a crawl's lease script, NOSCRIPT twice).
    kwargs = own_redis.connection_pool.connection_kwargs
    pool = redis.ConnectionPool.from_url(f"redis://{kwargs['host']}:{kwargs['port']}/0")

    class _CountingConnection(pool.connection_class):  # TCP, or the embedded server's socket
        sends = 0

        def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
            type(self).sends += 1
            return super().send_packed_command(command, check_health)

    pool.connection_class = _CountingConnection
    server = redis.Redis(connection_pool=pool)
    claim = register_script(server, _CLAIM)
    for flush_first in (False, True):
        if flush_first:
            server.script_flush()  # what a Redis restart does to the script cache
        server.delete("claims")
        server.ping()  # the connection is open before counting
        _CountingConnection.sends = 0
        pipe = server.pipeline(transaction=False)
        for field, page in (("a", "p1"), ("b", "p1"), ("a", "p2")):
            claim(keys=["claims"], args=[field, page], client=pipe)
        assert pipe.execute() == [b"p1", b"p1", b"p1"]
        # redis-py's own way asks SCRIPT EXISTS in a round trip of its own before each batch.
        assert _CountingConnection.sends == 1
    # Outside a pipeline the script still runs as redis-py runs it (EVALSHA, loaded on NOSCRIPT).
    server.script_flush()
    assert claim(keys=["claims"], args=["c", "p3"]) == b"p3"
