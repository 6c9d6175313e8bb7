"""The queue's layout in Redis (scraper.queue.lists): order, requests taken back, the count, an
earlier version's sorted set carried over, moving into shards, and the bytes per request."""

from __future__ import annotations

import time

import pytest
import scrapy

from scraper.backends.redis_client import get_redis
from scraper.queue.leases import Leases
from scraper.queue.lists import Lists, count_key, index_key
from scraper.queue.queues import PriorityQueue
from scraper.queue.scores import score_for
from scraper.queue.shards import Shards


class ListSpider(scrapy.Spider):
    name = "lists_test"

    def parse_item(self, response):  # pragma: no cover - only referenced
        pass


KEY = "{lists_test}:requests"


@pytest.fixture
def queue(clean):
    return PriorityQueue(get_redis(clean.redis_url), ListSpider(), KEY)


def _urls(requests: list[scrapy.Request | None]) -> list[str]:
    return [r.url for r in requests if r is not None]


def test_higher_priority_first_and_first_in_first_out_within_one(queue) -> None:
    for i in range(5):
        queue.push(scrapy.Request(f"http://127.0.0.1/low/{i}", priority=0))
        queue.push(scrapy.Request(f"http://127.0.0.1/high/{i}", priority=3))
    queue.push(scrapy.Request("http://127.0.0.1/lowest", priority=-2))
    assert len(queue) == 11
    got = _urls([queue.pop() for _ in range(12)])
    assert got == [f"http://127.0.0.1/high/{i}" for i in range(5)] + [f"http://127.0.0.1/low/{i}" for i in range(5)] + [
        "http://127.0.0.1/lowest"
    ]
    assert len(queue) == 0
    # Nothing is left behind: no empty list, no index entry, no count.
    assert not queue.server.keys("{lists_test}:requests*")


def test_a_request_taken_back_is_next_in_its_list_and_keeps_its_minute(queue) -> None:
    lists = Lists(queue.server)
    an_hour_ago = score_for(0, time.time() - 3600)
    lists.push(KEY, [(b"old-1", an_hour_ago), (b"old-2", an_hour_ago)])
    lists.push(KEY, [(b"new", score_for(0))])
    (first, score), (second, _) = lists.pop(KEY, 2)
    assert (first, second) == (b"old-1", b"old-2")
    assert queue.oldest_age() < 60  # the hour-old list is drained
    lists.push(KEY, [(first, score)], head=True)  # given back: the list comes back with its score
    assert 3540 <= queue.oldest_age() <= 3660
    assert [data for data, _ in lists.pop(KEY, 5)] == [b"old-1", b"new"]


def test_requests_taken_back_together_come_out_again_in_their_order(queue) -> None:
    lists = Lists(queue.server)
    score = score_for(0)
    lists.push(KEY, [(b"a", score), (b"b", score), (b"c", score), (b"d", score)])
    taken = lists.pop(KEY, 3)
    lists.push(KEY, taken, head=True)  # a prefetch given back, in the order it was taken
    assert [data for data, _ in lists.pop(KEY, 5)] == [b"a", b"b", b"c", b"d"]


def test_the_lease_reaper_puts_a_request_back_at_the_head_of_its_list(queue) -> None:
    server = queue.server
    leases = Leases(server, "lists_test", KEY, "{lists_test}:dead", ttl=0.2)
    lists = Lists(server)
    lists.push(KEY, [(b"a", score_for(0)), (b"b", score_for(0)), (b"c", score_for(0))])
    taken = leases.take(1)
    assert [data for _, _, data in taken] == [b"a"] and len(queue) == 2
    time.sleep(0.4)
    assert leases.reap() == (1, 0)
    assert len(queue) == 3
    assert [data for data, _ in lists.pop(KEY, 3)] == [b"a", b"b", b"c"]


def test_a_skewed_count_is_set_right_when_the_queue_runs_dry(queue) -> None:
    lists = Lists(queue.server)
    lists.push(KEY, [(b"a", score_for(0))])
    queue.server.incrby(count_key(KEY), 5)  # as if someone wrote to it
    assert len(queue) == 6
    assert [data for data, _ in lists.pop(KEY, 10)] == [b"a"]
    assert len(queue) == 0
    assert lists.pop(KEY, 1) == [] and len(queue) == 0


def test_an_earlier_versions_sorted_set_is_carried_over_by_the_pops(queue) -> None:
    server = queue.server
    # A queue as an earlier version left it: signed entries, one sorted set, one score each.
    old = [scrapy.Request(f"http://127.0.0.1/old/{i}", callback=queue.spider.parse_item) for i in range(30)]
    server.zadd(KEY, {queue._encode_request(r): score_for(0, time.time() - 600 + i) for i, r in enumerate(old)})
    queue.push(scrapy.Request("http://127.0.0.1/new", callback=queue.spider.parse_item))
    assert len(queue) == 31  # both counted while the old set is carried over
    got = _urls([queue.pop() for _ in range(32)])
    assert got == [r.url for r in old] + ["http://127.0.0.1/new"]  # the old ones were queued first
    assert len(queue) == 0 and not server.exists(KEY)


def test_an_unsharded_queue_moves_into_its_shards_once(clean) -> None:
    server = get_redis(clean.redis_url)
    spider = ListSpider()
    unsharded = PriorityQueue(server, spider, KEY)
    urls = [f"http://site{i % 7}.test/p/{i}" for i in range(2500)]
    for url in urls:
        unsharded.stage(scrapy.Request(url, callback=spider.parse_item))
    unsharded.flush_staged()
    sharded = PriorityQueue(server, spider, KEY, shards=Shards("lists_test", 3))
    assert sharded.adopt_unsharded() == 2500
    assert Lists(server).length(KEY) == 0 and len(sharded) == 2500
    assert sharded.adopt_unsharded() == 0
    sharded.prefetch = 100
    got = []
    while (request := sharded.pop()) is not None:
        got.append(request.url)
    assert sorted(got) == sorted(urls)  # each once, none lost
    for key in sharded.keys:
        assert not server.exists(index_key(key), count_key(key))


def test_moving_into_shards_passes_a_list_redis_lost_and_leaves_another_nodes_lock(clean) -> None:
    server = get_redis(clean.redis_url)
    spider = ListSpider()
    unsharded = PriorityQueue(server, spider, KEY)
    for i in range(10):
        unsharded.push(scrapy.Request(f"http://site{i}.test/p", callback=spider.parse_item, priority=i % 2))
    # The index names a list that is gone (evicted, deleted by hand): passed over, not looped on.
    [lost] = server.zrange(index_key(KEY), 0, 0)
    server.delete(f"{KEY}:b:{lost.decode()}")
    sharded = PriorityQueue(server, spider, KEY, shards=Shards("lists_test", 3))
    assert sharded.adopt_unsharded() == 5
    assert not server.exists(index_key(KEY)) and not server.exists(f"{KEY}:adopting")
    # The lock ran out while this node moved a list and another node took it: not released here.
    unsharded.push(scrapy.Request("http://late.test/p", callback=spider.parse_item))
    drop_head = sharded.lists.drop_head

    def lock_taken_meanwhile(*args):
        server.set(f"{KEY}:adopting", "another node", px=60_000)
        return drop_head(*args)

    sharded.lists.drop_head = lock_taken_meanwhile
    assert sharded.adopt_unsharded() == 1
    assert server.get(f"{KEY}:adopting") == b"another node"


def test_a_queued_request_costs_under_150_bytes_of_redis(queue) -> None:
    # A 70-character URL with a callback, as bench/queue_entry.py measures it.
    server = queue.server
    count = 5000
    requests = [
        scrapy.Request(
            f"http://shop.example.com/c/kitchen-dining/p/{i:07d}-xxxxxxxxxxxxxx.html", callback=queue.spider.parse_item
        )
        for i in range(count)
    ]
    assert len(requests[0].url) == 70
    for request in requests:
        queue.stage(request)
    queue.flush_staged()
    assert len(queue) == count
    per_request = Lists(server).memory_usage(KEY) / count
    assert per_request < 150, per_request


def test_a_sharded_bloom_frontier_claims_each_link_in_its_own_shard(clean) -> None:
    # A Bloom filter claims one link per command (no many): each in the seen-state of its shard,
    # beside its shard's queue (a script sees one slot only).
    from scrapy.settings import Settings
    from scrapy.utils.request import RequestFingerprinter

    from scraper.queue.dupefilter import SharedDupeFilter, make_stores

    server = get_redis(clean.redis_url)
    spider = ListSpider()
    shards = Shards("lists_test", 3)
    settings = Settings({"DUPEFILTER_BACKEND": "bloom", "DUPEFILTER_BLOOM_CAPACITY": 30_000})
    stores = make_stores(server, "lists_test", settings, shards)
    dupefilter = SharedDupeFilter(server, KEY, RequestFingerprinter(), stores=stores, shards=shards)
    queue = PriorityQueue(server, spider, KEY, shards=shards)
    urls = [f"http://site{i}.test/p/1" for i in range(30)]
    for url in urls + urls:  # each link twice: queued once
        request = scrapy.Request(url, callback=spider.parse_item)
        seen, fingerprint = dupefilter.seen_locally(request)
        dupefilter._local.clear()  # as another node would: only Redis knows it
        queue.stage(request, dupefilter, fingerprint)
    assert queue.flush_staged() == (30, 30)
    for shard, key in enumerate(queue.keys):
        mine = [url for url in urls if shards.of_url(url) == shard]
        assert mine and Lists(server).length(key) == len(mine)
        assert stores[shard].size() > 0
