"""The shared queue: JSON serialization, refusal of what cannot be queued safely, persistence."""

from __future__ import annotations

import json

import pytest
import scrapy
from support.queue import queue_entries, queue_put

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
    raw = queue_entries(queue.server, queue.key)[0]
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
    queue_put(queue.server, queue.key, {b"\x80\x04garbage": 0})
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
    json.loads(signing.unwrap(queue_entries(queue.server, queue.key)[0]))
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
    for raw in queue_entries(queue.server, queue.key):
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


# Written by the version before the compact entry (signing.Signer(OLD_SECRET).sign(serializer.dumps(...))),
# as a queue shared during a rolling deploy holds them.
OLD_SECRET = "secret-of-the-old-version-0123456789"
OLD_ENTRIES = [
    b'h1.ai8609y6hmtuNsjI0VnNQDqr9vdY7kbHyyk2PHaVnto.{"url":"http://shop.test/c/audio/p/1.html","callback":"parse_item",'
    b'"errback":null,"headers":{"$d":[[{"$b":"Referer"},[{"$b":"http://shop.test/c/audio/"}]]]},"meta":{"depth":2}}',
    b'h1.P75JDVrEtpWwJsPMK3kJN5iFG68MiBcBNIhztxpwzRg.{"url":"http://shop.test/search","callback":"parse_item",'
    b'"errback":null,"headers":{},"body":{"$b":"q=lamp"},"cb_kwargs":{"page":2},"dont_filter":true,"method":"POST",'
    b'"priority":3}',
]


def test_a_queued_entry_is_short_signed_json(queue) -> None:
    """What Redis keeps per queued request: the tag (128 bits), then JSON without the fields at
    their defaults; the URL as it is, for whoever reads the queue with jq."""
    url = "http://shop.example.com/c/kitchen-dining/p/0000001-xxxxxxxxxxxxxx.html"
    assert len(url) == 70
    queue.push(scrapy.Request(url, callback=queue.spider.parse_item))
    raw = queue_entries(queue.server, queue.key)[0]
    assert raw.startswith(b"h2") and signing.unwrap(raw) == raw[24:]
    assert json.loads(signing.unwrap(raw)) == {"url": url, "$": "parse_item"}
    # Nothing else: 121 bytes, 179 in the format before (a 43-character tag, every field named).
    assert len(raw) == len(b"h2") + 22 + len(f'{{"url":"{url}","$":"parse_item"}}') == 121
    assert queue.pop().url == url


def test_entries_of_the_previous_format_are_still_verified_and_read(queue) -> None:
    queue.signer = signing.Signer("the-new-secret-0123456789", OLD_SECRET)  # rotated meanwhile, too
    tampered = OLD_ENTRIES[0].replace(b"/p/1.html", b"/p/2.html")
    queue_put(queue.server, queue.key, {OLD_ENTRIES[0]: 1, OLD_ENTRIES[1]: 2, tampered: 3})
    first, second, forged = queue.pop(), queue.pop(), queue.pop()
    assert first.url == "http://shop.test/c/audio/p/1.html" and first.callback == queue.spider.parse_item
    assert first.headers.getlist("Referer") == [b"http://shop.test/c/audio/"] and first.meta == {"depth": 2}
    assert (second.method, second.body, second.priority, second.dont_filter) == ("POST", b"q=lamp", 3, True)
    assert second.cb_kwargs == {"page": 2} and forged is None
    [letter] = [json.loads(x) for x in queue.server.lrange("{queue_test}:dead", 0, -1)]
    assert letter["reason"] == "unsigned" and "/p/2.html" in letter["request"]


def test_a_fleet_signed_entry_an_older_node_set_aside_is_requeued_a_forged_one_is_not(queue) -> None:
    """A node of the version before the compact entry cannot verify one: it sets it aside as an
    ``unsigned`` dead letter (never fetched, never lost). Its signature holds, so a requeue by a
    node of this version puts it back; a forged one stays. So does the signed entry the lease
    reaper keeps in its dead letters."""
    from scraper.queue.dead_entry import entry
    from scraper.queue.dead_letters import DeadLetters

    spider = queue.spider
    ours = queue._encode_request(
        scrapy.Request("http://shop.test/p/1.html", callback=spider.parse_item, meta={"depth": 2}, priority=2)
    )
    forged = signing.Signer("not-the-fleet-secret").sign(b'{"url":"http://169.254.169.254/","$":"parse_item"}')
    reaped = queue._encode_request(scrapy.Request("http://shop.test/p/2.html", callback=spider.parse_item))
    dead = "{queue_test}:dead"
    queue.server.rpush(dead, entry("unsigned", 1, None, ours), entry("unsigned", 1, None, forged))
    queue.server.rpush(dead, entry("lease expired 4 times: a worker died or stalled holding it", 4, "", reaped))
    letters = DeadLetters(queue.server, spider)
    assert letters.requeue("unsigned") == 1
    assert letters.requeue() == 1  # the reaper's; the forged one stays
    assert [json.loads(x)["request"] for x in queue.server.lrange(dead, 0, -1)] == [forged.decode()]
    got = {r.url: r for r in (queue.pop(), queue.pop())}
    assert got["http://shop.test/p/1.html"].meta == {"depth": 2} and got["http://shop.test/p/1.html"].priority == 2
    assert got["http://shop.test/p/2.html"].callback == spider.parse_item
    assert queue.pop() is None
