"""The take read ahead (scraper/queue/read_ahead.py), on a real Redis: every request handed out
once and in order, what a take in flight brought goes back at close, and a reply that is lost
loses no request (its leases run out and the requests return)."""

from __future__ import annotations

import time

import pytest
import redis
import scrapy

from scraper.queue.leases import Leases
from scraper.queue.queues import PriorityQueue
from scraper.queue.read_ahead import ReadAhead
from scraper.redis_client import get_redis


class AheadSpider(scrapy.Spider):
    name = "ahead_test"


KEY = "{ahead_test}:requests"
DEAD = "{ahead_test}:dead"


def _queue(server, ttl: float = 30.0, owner: str = "A") -> PriorityQueue:
    queue = PriorityQueue(server, AheadSpider(), KEY, prefetch=4)
    queue.leases = Leases(server, "ahead_test", KEY, DEAD, ttl=ttl, owner=owner)
    queue.read_ahead(ReadAhead(server))
    return queue


@pytest.fixture
def server(clean):
    return get_redis(clean.redis_url)


def _push(queue: PriorityQueue, count: int) -> list[str]:
    urls = [f"http://shop.test/p/{i}" for i in range(count)]
    for url in urls:
        queue.push(scrapy.Request(url))
        time.sleep(0.002)  # distinct enqueue times: first in, first out
    return urls


def _drain(queue: PriorityQueue) -> tuple[list[scrapy.Request], int]:
    """Pop like the engine does: a None while a take is out means "ask again later"."""
    handed: list[scrapy.Request] = []
    not_yet = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        request = queue.pop()
        if request is not None:
            handed.append(request)
            continue
        if not queue.taking():
            return handed, not_yet
        not_yet += 1
        time.sleep(0.005)
    raise AssertionError("the queue never drained")


def test_every_request_is_handed_out_once_in_queue_order(server) -> None:
    queue = _queue(server)
    urls = _push(queue, 23)
    handed, _ = _drain(queue)
    assert [r.url for r in handed] == urls
    leases = [r.meta["_lease"] for r in handed]
    assert len(set(leases)) == 23 and set(leases) == queue.leases.mine
    assert server.zcard(KEY) == 0 and server.hlen("{ahead_test}:leased") == 23
    # The takes were read ahead: 23 requests in far fewer synchronous round trips than takes.
    assert queue.ahead.count == 0 and queue.local_pending() == 0
    queue.ahead.close()


def test_a_take_is_in_flight_once_half_the_prefetch_is_handed_out(server) -> None:
    queue = _queue(server)
    _push(queue, 10)
    first = queue.pop()
    assert first is not None and queue.taking() == 0  # 3 of 4 still in hand
    queue.pop()
    assert queue.taking() == 4  # 2 left in hand: the next 4 are on their way
    # Counted as pending work (the engine must not take the crawl for finished meanwhile).
    assert queue.local_pending() == 2 + 1
    queue.ahead.close()


def test_what_a_take_in_flight_brought_goes_back_to_the_queue_at_close(server) -> None:
    queue = _queue(server)
    _push(queue, 6)
    handed = [queue.pop() for _ in range(3)]
    assert all(handed) and queue.taking() == 4
    # Closing reads the take (the last 2 requests) and gives back everything not handed out.
    assert queue.return_prefetched() == 3
    queue.ahead.close()
    assert server.zcard(KEY) == 3
    assert queue.leases.mine == {r.meta["_lease"] for r in handed}
    assert server.hlen("{ahead_test}:leased") == 3


def test_a_reply_lost_with_its_connection_loses_no_request(server) -> None:
    queue = _queue(server, ttl=0.3)
    urls = _push(queue, 6)
    handed = [queue.pop(), queue.pop()]
    assert all(handed) and queue.taking() == 4  # 2 in hand, the last 2 queued on their way
    time.sleep(0.05)
    assert server.hlen("{ahead_test}:leased") == 6  # Redis ran the take ...
    queue.ahead.conn.disconnect()  # ... and its reply is lost with the connection
    with pytest.raises(redis.ConnectionError):
        queue.settle()
    assert queue.taking() == 0 and queue.local_pending() == 2
    # The two in hand are still handed out; the two whose reply was lost are not this worker's
    # to hand out: their leases run out and any node puts them back.
    rest, _ = _drain(queue)
    assert len(rest) == 2
    time.sleep(0.4)
    other = Leases(server, "ahead_test", KEY, DEAD, ttl=30, owner="B")
    assert other.reap() == (6, 0)  # the lost take's 2, and the 4 this worker never acknowledged
    assert server.zcard(KEY) == 6
    # Every request is delivered again, through the read-ahead connection, reconnected.
    got, _ = _drain(queue)
    assert [r.url for r in got] == urls
    queue.ahead.close()


def test_read_ahead_needs_leases_and_an_unsharded_queue(server) -> None:
    queue = PriorityQueue(server, AheadSpider(), KEY)
    with pytest.raises(ValueError, match="leases"):
        queue.read_ahead(ReadAhead(server))


def test_a_take_whose_connection_dropped_is_read_not_awaited_forever(server) -> None:
    queue = _queue(server)
    _push(queue, 6)
    queue.pop(), queue.pop()
    assert queue.taking() == 4
    time.sleep(0.05)
    queue.ahead.conn.disconnect()
    # The engine's next ask reads it, and meets the error, instead of being told "not yet".
    queue.pop(), queue.pop()
    with pytest.raises(redis.ConnectionError):
        queue.pop()
    assert queue.taking() == 0
    queue.ahead.close()
