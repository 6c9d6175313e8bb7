"""The shared queue: JSON serialization, refusal of what cannot be queued safely, persistence."""

from __future__ import annotations

import json

import pytest
import scrapy

from scraper.backends.redis_client import get_redis
from scraper.queue import serializer, signing
from scraper.queue.queues import PriorityQueue, RequestSerializationError
from scraper.queue.requests import request_from_dict


class QueueSpider(scrapy.Spider):
    name = "queue_test"

    def parse_item(self, response):  # pragma: no cover - only referenced
        pass


@pytest.fixture
def queue(clean):
    return PriorityQueue(get_redis(clean.redis_url), QueueSpider(), "{queue_test}:requests")


def test_request_round_trips_through_redis_as_json(queue) -> None:
    spider = queue.spider
    request = scrapy.Request(
        "http://127.0.0.1/p?q=1",
        callback=spider.parse_item,
        method="POST",
        body=b"\x00\xffbinary",
        headers={"X-Test": "é"},
        meta={"depth": 2, "nested": {"a": [1, 2.5, None, True]}, "tuple_key": {(1, 2): "x"}},
        cb_kwargs={"page": 3},
        priority=5,
    )
    queue.push(request)
    raw = queue.server.zrange(queue.key, 0, 0)[0]
    assert raw.startswith(signing.PREFIX)  # signed with the fleet secret
    json.loads(signing.unwrap(raw))  # plain JSON on the wire, never pickle
    assert not raw.startswith(b"\x80")
    got = queue.pop()
    assert got.url == request.url and got.method == "POST" and got.body == request.body
    assert got.callback == spider.parse_item
    assert got.headers.getlist("X-Test") == request.headers.getlist("X-Test")
    assert got.meta["nested"] == {"a": [1, 2.5, None, True]}
    assert got.meta["tuple_key"] == {(1, 2): "x"}
    assert got.cb_kwargs == {"page": 3} and got.priority == 5


def test_formrequest_subclass_survives(queue) -> None:
    queue.push(scrapy.FormRequest("http://127.0.0.1/f", formdata={"a": "1"}))
    got = queue.pop()
    assert type(got) is scrapy.FormRequest and got.body == b"a=1"


def test_unserializable_meta_is_a_clear_error_naming_spider_and_callback(queue) -> None:
    request = scrapy.Request("http://127.0.0.1/x", callback=queue.spider.parse_item, meta={"conn": object()})
    with pytest.raises(RequestSerializationError) as info:
        queue.push(request)
    message = str(info.value)
    assert "queue_test" in message and "parse_item" in message and "meta" in message and "object" in message


def test_lambda_callback_is_refused(queue) -> None:
    with pytest.raises(RequestSerializationError, match="not a method of spider 'queue_test'"):
        queue.push(scrapy.Request("http://127.0.0.1/x", callback=lambda r: None))


def test_foreign_request_class_is_refused(queue) -> None:
    data = {"url": "http://127.0.0.1/", "_class": "os.system"}
    with pytest.raises(ValueError, match="not allowed"):
        request_from_dict(data, queue.spider)


def test_corrupt_entry_is_set_aside_not_lost(queue) -> None:
    queue.server.zadd(queue.key, {b"\x80\x04garbage": 0})
    queue.push(scrapy.Request("http://127.0.0.1/ok"))
    popped = [queue.pop(), queue.pop()]
    assert [r.url for r in popped if r] == ["http://127.0.0.1/ok"]
    [letter] = [json.loads(x) for x in queue.server.lrange("{queue_test}:dead", 0, -1)]
    # Not signed by a node: set aside as unsigned before anything reads it.
    assert letter["reason"] == "unsigned" and letter["attempts"] == 1
    assert letter["request"].encode("utf-8", "surrogateescape") != b"" and "garbage" in letter["request"]


def test_serializer_escapes_values_that_look_like_tags() -> None:
    data = {"url": "u", "meta": {"$b": "not bytes"}, "other": {"$d": [1]}}
    assert serializer.loads(serializer.dumps(data)) == data


def test_serializer_rejects_non_requests() -> None:
    with pytest.raises(ValueError):
        serializer.loads('["a list"]')


def test_a_stalled_worker_cannot_release_a_lease_another_worker_took_over(queue) -> None:
    """Lease ids are request hashes: after A's lease ran out and B took the request again, A's
    late acknowledgement or renewal must not touch B's lease (else B dying would lose it)."""
    import time

    from scraper.queue.leases import Leases

    server = queue.server
    queue.push(scrapy.Request("http://shop.test/slow"))
    stalled = Leases(server, "queue_test", queue.key, "{queue_test}:dead", ttl=0.2, owner="A")
    other = Leases(server, "queue_test", queue.key, "{queue_test}:dead", ttl=30, owner="B")
    [(lease, _score, _data)] = stalled.take(1)
    time.sleep(0.3)
    assert other.reap() == (1, 0)
    [(again, _score, _data)] = other.take(1)
    assert again == lease
    deadline = server.zscore("{queue_test}:lease_deadlines", lease)

    stalled.renew(force=True)
    stalled.ack({lease})
    assert server.zscore("{queue_test}:lease_deadlines", lease) == deadline  # B's lease untouched
    assert server.hexists("{queue_test}:leased", lease)
    assert lease not in stalled.mine and lease in other.mine

    other.ack({lease})
    assert server.zcard("{queue_test}:lease_deadlines") == 0 and server.hlen("{queue_test}:leased") == 0
    assert server.hlen("{queue_test}:lease_owners") == 0


def test_scrapys_own_meta_values_and_no_callback_round_trip(queue) -> None:
    """What Scrapy itself puts on requests (fetch/shell's status filter, robots.txt's marker)."""
    from scrapy.http.request import NO_CALLBACK
    from scrapy.utils.datatypes import SequenceExclude

    queue.push(
        scrapy.Request(
            "http://127.0.0.1/robots.txt",
            callback=NO_CALLBACK,
            meta={"handle_httpstatus_list": SequenceExclude(range(300, 400))},
        )
    )
    json.loads(signing.unwrap(queue.server.zrange(queue.key, 0, 0)[0]))
    got = queue.pop()
    assert got.callback is NO_CALLBACK
    statuses = got.meta["handle_httpstatus_list"]
    assert isinstance(statuses, SequenceExclude) and 404 in statuses and 200 in statuses and 301 not in statuses
    # A spider method called NO_CALLBACK's stored name does not exist: nothing else decodes to it.
    with pytest.raises(ValueError):
        request_from_dict({"url": "http://127.0.0.1/", "callback": "NO_CALLBACK"}, queue.spider)


def test_a_request_taken_back_by_the_process_that_queued_it_is_the_object_itself(queue, monkeypatch) -> None:
    """As Scrapy's memory queue does; still queued as JSON in Redis, and rebuilt from it by any
    other process (another node, or this one after a restart)."""
    from scraper.queue import queues
    from scraper.queue.leases import Leases

    spider = queue.spider
    mine = scrapy.Request("http://127.0.0.1/mine", callback=spider.parse_item, meta={"pair": (1, 2)})
    theirs = scrapy.Request("http://127.0.0.1/theirs", callback=spider.parse_item, meta={"pair": (1, 2)}, priority=-1)
    queue.stage(mine)
    queue.stage(theirs)
    assert queue.flush_staged() == (2, 0)
    for raw in queue.server.zrange(queue.key, 0, -1):
        json.loads(signing.unwrap(raw))
    queue.leases = Leases(queue.server, "queue_test", queue.key, "{queue_test}:dead", ttl=30, owner="A")
    got = queue.pop()
    assert got is mine and got.meta["_lease"] in queue.leases.mine

    other = PriorityQueue(queue.server, spider, queue.key)  # another node's queue
    rebuilt = other.pop()
    assert rebuilt is not theirs and rebuilt.url == theirs.url and rebuilt.callback == spider.parse_item
    assert rebuilt.meta == {"pair": [1, 2]}  # what JSON keeps of a tuple

    # Bounded: what another process took, or the dupefilter refused, is dropped with the rest.
    assert len(queue._own) == 1  # theirs, taken by the other node
    monkeypatch.setattr(queues, "OWN_REQUESTS", 3)
    staged = [scrapy.Request(f"http://127.0.0.1/{n}") for n in range(4)]
    for request in staged:
        queue.stage(request)
    assert len(queue._own) == 2  # full at the third: cleared, theirs with it
    queue.flush_staged()
    popped = [queue.pop() for _ in range(4)]
    assert [r.url for r in popped] == [r.url for r in staged]
    assert [a is b for a, b in zip(popped, staged)] == [False, False, True, True] and not queue._own
